"""Virtual ranks: our collective code (MPI backend's step generators, communicator routes) run
for up to thousands of ranks in one process, sums checked exactly on integer-valued inputs."""
import time

import numpy as np
import pytest

from nnabla_torus.planning import planner
from nnabla_torus.sim.virtual import Deadlock, World, make_ranks, run_allreduce
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.schedules import BatchSchedule
from tests.slowdown import scaled


def exact(p, algorithm, grid, per_host, n, dtype=np.float32, pipeline_bytes=8 << 20, seed=0):
    """All-reduce p integer-valued buffers of n elements; True when every rank holds the sum."""
    rng = np.random.default_rng(seed)
    bufs = [rng.integers(-8, 9, n).astype(dtype) for _ in range(p)]
    expect = np.sum(np.stack(bufs).astype(np.int64), axis=0)
    run_allreduce(bufs, algorithm, grid, per_host, pipeline_bytes=pipeline_bytes)
    return all(np.array_equal(b.astype(np.int64), expect) for b in bufs)


SMALL_GRIDS = [
    (8, "torus2d", "4x2", 4, 37), (8, "torus2d", "2x4", 2, 5), (6, "torus2d", "3x2", 3, 1),
    (15, "torus2d", "5x3", 5, 101), (7, "torus2d", None, 1, 13),     # prime: a ring
    (12, "ring", None, 4, 29), (5, "ring", None, 1, 3), (1, "ring", None, 1, 4),
    (12, "hierarchical", None, 4, 31), (12, "hierarchical", None, 3, 0),
    (9, "hierarchical", None, 3, 17), (8, "native", None, 4, 11),
]


@pytest.mark.parametrize("p,algorithm,grid,per_host,n", SMALL_GRIDS)
def test_small_grids_exact(p, algorithm, grid, per_host, n):
    assert exact(p, algorithm, grid, per_host, n)


def test_every_algorithm_has_a_small_grid_case():
    """A new algorithm (docs/contributing.md#add-an-all-reduce-algorithm) needs its cases."""
    from nnabla_torus.comm.collectives import REGISTRY
    missing = set(REGISTRY) - {case[1] for case in SMALL_GRIDS}
    assert not missing, f"no SMALL_GRIDS case for {sorted(missing)}"


@pytest.mark.parametrize("p,grid,per_host,n,pipe", [
    (8, "4x2", 4, 1000, 400),      # 10 pieces of 100 elements
    (12, "3x4", 3, 517, 300),      # odd size, uneven pieces
    (16, "2x8", 2, 64, 4),         # more pieces than a row's chunks
])
def test_pipelined_lanes_exact(p, grid, per_host, n, pipe):
    bufs_per_rank = n * 4
    world = World(p)
    backends, routes = make_ranks(world, per_host, "torus2d", grid, pipeline_bytes=pipe)
    assert routes[0].pipelined and len(backends[0].pieces(np.zeros(n, np.float32))) > 1
    assert bufs_per_rank > pipe and exact(p, "torus2d", grid, per_host, n, pipeline_bytes=pipe)


def test_float16_sums_exact_for_small_integers():
    assert exact(16, "torus2d", "4x4", 4, 50, dtype=np.float16)


@pytest.mark.slow
def test_paper_scale_exact_on_planner_grids():
    """2,176 ranks on 64x34 and the grids the planner picks for the paper's schedule."""
    prof = load_profile("abci")
    phases = planner.plan_schedule(prof, "resnet50", BatchSchedule.parse("0:34816,5:69632"), 32)
    cases = {(2176, "64x34")} | {(best.gpus, best.grid) for _, best in phases
                                 if best.algorithm == "torus2d"}
    assert {gpus for gpus, _ in cases} == {1088, 2176}
    for gpus, grid in sorted(cases):
        start = time.process_time()
        assert exact(gpus, "torus2d", grid, 4, 2 * gpus + 3, seed=gpus), (gpus, grid)
        print(f"{gpus} ranks torus2d {grid}: exact in {time.process_time() - start:.1f} s CPU")


def test_hierarchical_paper_scale_exact():
    assert exact(272, "hierarchical", None, 4, 272 + 5)   # columns: rings of 68 hosts


def test_grid_that_does_not_fit_is_the_communicators_error():
    with pytest.raises(ValueError, match="grid 64x34 has 2176 ranks but the world has 1088"):
        make_ranks(World(1088), 4, "torus2d", "64x34")
    with pytest.raises(ValueError, match="must divide the virtual world size"):
        make_ranks(World(10), 4, "ring")


def test_deadlock_is_an_error_naming_the_waiting_ranks():
    world = World(4)
    backends, _ = make_ranks(world, 2, "ring")

    def body(b):  # every rank receives from its left neighbour, nobody sends
        group = b.world_group
        b.wait([group.comm.Irecv(np.zeros(1), (group.rank - 1) % 4, tag=5)], "lonely recv",
               [group.world_rank(group.rank - 1)])
    start = time.monotonic()
    with pytest.raises(Deadlock, match="4 of 4 virtual ranks can never finish.*lonely recv"):
        world.run(body, backends)
    assert time.monotonic() - start < scaled(5)


def test_rank_exception_names_the_rank():
    world = World(3)
    backends, _ = make_ranks(world, 1, "ring")

    def body(b):
        if b.rank == 2:
            raise ValueError("bad buffer")
    with pytest.raises(RuntimeError, match="virtual rank 2 of 3: ValueError: bad buffer"):
        world.run(body, backends)


def test_mismatched_message_sizes_are_refused():
    world = World(2)
    backends, _ = make_ranks(world, 1, "ring")

    def body(b):
        c = b.world_group.comm
        req = c.Isend(np.zeros(3), 1) if b.rank == 0 else c.Irecv(np.zeros(2), 0)
        b.wait([req], "size mismatch", [])
    with pytest.raises(RuntimeError, match="has 24 bytes, the receive expects 16"):
        world.run(body, backends)


def test_lanes_waiting_for_each_other_are_a_deadlock():
    world = World(1)
    backends, _ = make_ranks(world, 1, "ring")

    def lane():
        yield (lambda: False), "", []

    with pytest.raises(RuntimeError, match="its lanes wait for each other"):
        world.run(lambda b: b.run_lanes([lane(), lane()]), backends)
