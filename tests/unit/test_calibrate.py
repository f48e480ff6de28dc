"""Calibration fitter on synthetic measurements from known parameters."""
import numpy as np
import pytest

from nnabla_torus.planning import calibrate, costmodel
from nnabla_torus.planning.costmodel import Compute, Link, Network, Software


def true_network():
    return Network(Link(30e-6, 2e9), Link(50e-6, 0.125e9), 0.2e-9, 8, 2, 10000,
                   {"native": Software(0.0, 0.5e-9), "ring": Software(80e-6, 0.1e-9),
                    "torus2d": Software(90e-6, 0.2e-9), "hierarchical": Software(100e-6, 0.3e-9)})


def synthetic_allreduce(net, rng, noise=0.03):
    records = []
    for ranks, grids in ((2, ["2x1"]), (4, ["2x2"]), (8, ["2x4", "4x2"])):
        for nbytes in (4096, 65536, 1 << 20, 1 << 24, 1 << 27):
            runs = [("torus2d", g) for g in grids] + [("ring", f"{ranks}x1"),
                                                       ("hierarchical", f"{ranks}x1"),
                                                       ("native", "-")]
            for algorithm, grid in runs:
                r = {"algorithm": algorithm, "grid": grid, "ranks": ranks, "bytes": nbytes,
                     "correct": True}
                t = float(calibrate.predict_allreduce(net, [r])[0])
                r["time_us"] = t * 1e6 * np.exp(rng.normal(0, noise))
                records.append(r)
    return records


def test_fit_network_recovers_predictions():
    rng = np.random.default_rng(0)
    truth = true_network()
    records = synthetic_allreduce(truth, rng)
    base = truth._replace(intra=Link(1e-3, 1e8), software={})
    net, report = calibrate.fit_network(records, base)
    assert report["allreduce_mdape"] < 0.05
    # the model it found predicts unseen sizes as the truth does
    for algorithm in costmodel.ALGORITHMS:
        want = costmodel.allreduce_time(truth, algorithm, 8, 3e6, 4)
        got = costmodel.allreduce_time(net, algorithm, 8, 3e6, 4)
        assert got == pytest.approx(want, rel=0.1)


def test_fit_compute_recovers_coefficients():
    rng = np.random.default_rng(1)
    net = true_network()
    truth = Compute(0.02, 0.004, 2.5, 64, 2_800_000, 2)
    records = []
    for ranks in (1, 2, 4):
        for batch in (4, 8, 16, 32):
            for overlap in (0, 1):
                r = {"ranks": ranks, "local_batch": batch, "overlap": overlap}
                t = calibrate.predict_steps(net, truth, [r], "torus2d")[0]
                r["step_time_s"] = t * np.exp(rng.normal(0, 0.02))
                records.append(r)
    comp, report = calibrate.fit_compute(records, net, truth._replace(a_s=1, b_s=1, gamma=1),
                                         "torus2d", max_slots=2)
    assert report["compute_slots_chosen"] == 2 and report["step_mdape"] < 0.04
    assert comp.a_s == pytest.approx(0.02, rel=0.2) and comp.b_s == pytest.approx(0.004, rel=0.1)


def test_mdape_and_errors():
    assert calibrate.mdape([1.1, 0.9, 2.0], [1.0, 1.0, 1.0]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="no correct"):
        calibrate.fit_network([], true_network())


def test_auto_tables_from_benchmark_records_round_trip_through_a_profile(tmp_path):
    from nnabla_torus.planning.machine_profile import load_profile, profile_to_dict, save_profile
    records = [{"algorithm": "native", "ranks": 4, "ranks_per_host": 4, "bytes": 4096},
               {"algorithm": "auto", "ranks": 4, "ranks_per_host": 4, "bytes": 4096,
                "auto_bounds": [2097152], "auto_algorithms": ["native", "torus2d"]},
               {"algorithm": "auto", "ranks": 8, "ranks_per_host": 8, "bytes": 4096,
                "auto_bounds": [], "auto_algorithms": ["torus2d"]}]
    tables = calibrate.auto_tables(records)
    assert tables == {(4, 4): ([2097152], ["native", "torus2d"]), (8, 8): ([], ["torus2d"])}
    prof = load_profile("cpu-2core")
    path = str(tmp_path / "p.yaml")
    save_profile(prof._replace(extra=dict(prof.extra, auto_tables=tables)), path)
    assert load_profile(path).extra["auto_tables"] == tables
    assert "auto_tables" not in profile_to_dict(prof)   # none measured: not written


@pytest.mark.parametrize("entry, text", [
    ({"ranks": 4, "ranks_per_host": 4, "bounds": [10], "algorithms": ["native"]},
     "one algorithm more than bounds"),
    ({"ranks": 4, "ranks_per_host": 4, "bounds": [], "algorithms": ["tree"]}, "'tree'"),
    ({"ranks": 4, "ranks_per_host": 4, "bounds": [20, 10], "algorithms": ["native"] * 3},
     "ascending"),
    ({"ranks": 4, "bounds": [], "algorithms": ["native"]}, "ranks_per_host"),
])
def test_a_bad_auto_table_is_named(entry, text):
    from nnabla_torus.planning.machine_profile import (load_profile, profile_from_dict,
                                                       profile_to_dict)
    raw = dict(profile_to_dict(load_profile("cpu-2core")), auto_tables=[entry])
    with pytest.raises(ValueError, match="auto_tables\\[0\\]") as err:
        profile_from_dict(raw)
    assert text in str(err.value)


def test_the_benchmark_measures_every_registered_algorithm(monkeypatch):
    """Each algorithm's software term is fitted from its own records; before, a hand list left
    a new algorithm with the fit's start value."""
    from nnabla_torus.comm.collectives import REGISTRY
    from tools import calibrate as calibrate_tool
    asked = []
    monkeypatch.setattr(calibrate_tool, "run_json_tool",
                        lambda ranks, tool, args: asked.append(args) or [])
    calibrate_tool.measure_allreduce([4], "4K", 1, 1, log=lambda line: None)
    [args] = asked
    assert set(args[args.index("--algorithms") + 1].split(",")) == {*REGISTRY, "auto"}
