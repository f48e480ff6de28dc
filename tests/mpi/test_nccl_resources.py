"""NCCL communicators are made only when used (issue 33): counted on the fake NCCL, summed over
the job's ranks (tests/mpi/progs/count_nccl_comms.py). Before: the float16 communicator copied
every group at its creation, a 1-rank column got an NCCL communicator, and groups of a plan
left behind (the planner's torus2d 2x4 on one host, then native) kept theirs."""
import pytest

from tests.mpirun import expect_passed, run_mpi

PROG = "tests/mpi/progs/count_nccl_comms.py"


@pytest.mark.parametrize("ranks, per_host, steps, at_init, total", [
    # one host, auto then torus2d 4x1: the 1-rank columns make none (before: 4 + 4)
    pytest.param(4, "4", ["set:auto", "set:torus2d@4x1", "f32"], 4, 4, id="4-one-host"),
    # one host, the planner's torus2d 2x4, then native: only the world, per dtype (before: 48)
    pytest.param(8, "8", ["set:torus2d@2x4", "set:native", "f32", "f16"], 8, 16,
                 id="8-planner-then-native", marks=pytest.mark.slow),
    # 2 hosts x 4, FP16 training: float32 world at init; float16 world, rows, columns on use
    # (before: 24 at init, 48 in all)
    pytest.param(8, "4", ["f16"], 8, 32, id="8-two-hosts-fp16", marks=pytest.mark.slow),
])
def test_nccl_communicators_are_made_on_first_use(ranks, per_host, steps, at_init, total):
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": per_host}
    out = run_mpi(ranks, [PROG, "--at-init", str(at_init), "--total", str(total), *steps],
                  timeout=240, env=env)
    expect_passed(out, "count_nccl_comms")
