"""auto's size table: winners -> ranges, the rule that keeps noise from flipping native back
in, the profile's cost model as a source, and the interleaved measurement (no MPI)."""
import itertools

import numpy as np
import pytest

from nnabla_torus.comm.auto import table as auto
from nnabla_torus.planning.auto_profile import AutoProfile

KiB, MiB = 1 << 10, 1 << 20


def test_ranges_split_at_the_geometric_mean_of_measured_sizes():
    table = auto.table_from_names([16 * KiB, 1 * MiB, 16 * MiB],
                                  ["native", "torus2d", "hierarchical"], "test")
    assert table.bounds == [128 * KiB, 4 * MiB]
    assert [table.choose(n) for n in (0, 128 * KiB - 1, 128 * KiB, 4 * MiB, 1 << 40)] == \
        ["native", "native", "torus2d", "hierarchical", "hierarchical"]
    assert table.describe() == "native < 128 KiB <= torus2d < 4 MiB <= hierarchical"


def test_one_noisy_win_does_not_flip_a_range():
    sizes = [16 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
    # torus2d wins narrowly at 64 KiB between clear native wins: native up to 1 MiB
    times = {"native": [1.0, 1.1, 2.0, 10.0, 40.0], "torus2d": [1.5, 1.0, 3.0, 6.0, 20.0]}
    assert auto.table_from_times(sizes, times).describe() == "native < 4 MiB <= torus2d"
    # torus2d wins by less than the margin at 64 MiB after its clear wins: native there
    times = {"native": [1.0, 1.1, 2.0, 10.0, 20.0], "torus2d": [1.5, 1.5, 1.0, 6.0, 19.0]}
    assert auto.table_from_times(sizes, times).describe() == \
        "native < 256 KiB <= torus2d < 32 MiB <= native"
    assert auto.table_from_times([4 * KiB], {"native": [1.0], "torus2d": [2.0]}).describe() \
        == "native"


def test_above_the_crossover_each_size_takes_its_best_other_algorithm():
    sizes = [1 * MiB, 16 * MiB, 64 * MiB]
    times = {"native": [1.0, 9.0, 40.0], "torus2d": [2.0, 5.0, 30.0],
             "hierarchical": [3.0, 6.0, 20.0]}
    assert auto.table_from_times(sizes, times).describe() == \
        "native < 4 MiB <= torus2d < 32 MiB <= hierarchical"


def test_auto_is_never_slower_than_native_at_a_measured_size():
    rng = np.random.default_rng(7)
    sizes = list(auto.SIZES)
    for _ in range(200):
        times = {name: list(rng.uniform(0.5, 2.0, len(sizes)))
                 for name in ("native", "torus2d", "hierarchical")}
        table = auto.table_from_times(sizes, times)
        for i, nbytes in enumerate(sizes):
            chosen = times[table.choose(nbytes)][i]
            assert chosen <= times["native"][i]
            assert chosen == times["native"][i] or chosen < (1 - auto.MARGIN) * times["native"][i]


def test_winners_pick_the_fastest_per_size():
    times = {"native": [1.0, 5.0], "torus2d": [2.0, 3.0], "hierarchical": [3.0, 4.0]}
    assert auto.winners(times) == ["native", "torus2d"]


def test_the_profile_cost_model_gives_times_for_every_candidate():
    prof = AutoProfile("cpu-2core")
    assert prof.missing_terms(["native", "torus2d"]) == []
    times = prof.predicted_times(["native", "torus2d"], 4, 4, 4, auto.SIZES)
    assert set(times) == {"native", "torus2d"}
    assert all(len(v) == len(auto.SIZES) and min(v) > 0 for v in times.values())
    bare = prof.profile._replace(network=prof.profile.network._replace(software={}))
    prof.profile = bare
    assert prof.missing_terms(["torus2d", "native"]) == ["native", "torus2d"]


def test_measure_interleaves_takes_the_slowest_rank_and_drops_the_first_call():
    order, clock = [], itertools.count()

    def run(name, nbytes):
        order.append((name, nbytes))
    times = auto.measure(run, ["native", "torus2d"], sizes=[4 * KiB, 8 * KiB, 32 * MiB],
                         iters=3, timer=lambda: float(next(clock)), slowest=lambda t: 10 * t)
    assert order[:4] == [("native", 4 * KiB), ("torus2d", 4 * KiB)] * 2
    assert len(order) == 2 * 2 * 4 + 2 * 3   # small sizes: iters + 1 calls; large: one fewer
    assert times == {"native": [10.0, 10.0, 10.0], "torus2d": [10.0, 10.0, 10.0]}


@pytest.mark.parametrize("nbytes, name", [(0, "native"), (4 * KiB, "native"),
                                          (1 << 30, "torus2d")])
def test_choose_covers_every_size(nbytes, name):
    table = auto.Table([64 * KiB], ["native", "torus2d"], "test")
    assert table.choose(nbytes) == name


@pytest.mark.parametrize("bounds, names, problem", [
    ([131072], ["native", "tree"], "algorithm 'tree' is not one of ["),
    ([131072, 4194304], ["native", "torus2d"], "2 algorithms for 2 bounds: give one algorithm "
                                               "more than bounds"),
    (["128K"], ["native", "torus2d"], "bounds ['128K'] must be ascending positive integers"),
    ([4194304, 131072], ["native", "torus2d", "ring"], "bounds [4194304, 131072] must be "
                                                       "ascending"),
    ([131072, 131072], ["native", "torus2d", "ring"], "must be ascending"),
    ([True], ["native", "ring"], "bounds [True] must be"),
    ({"a": 1}, ["native"], "bounds {'a': 1} and algorithms ['native'] must be lists"),
])
def test_a_damaged_table_is_named(bounds, names, problem):
    """A cached table (comm/auto/cache.py) or a profile's auto_tables entry: before, an unknown
    name, fewer names than ranges or string bounds ended every later job at its first
    all_reduce, and bounds out of order were accepted."""
    from nnabla_torus.comm.auto.table import table_problem
    from nnabla_torus.comm.collectives import ALGORITHMS
    assert table_problem([131072], ["native", "torus2d"], ALGORITHMS) is None
    assert problem in table_problem(bounds, names, ALGORITHMS)
