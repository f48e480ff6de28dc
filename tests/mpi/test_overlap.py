"""Bucketed all-reduce during backward equals a plain all-reduce after it (2 ranks)."""
from tests.mpirun import expect_passed, run_mpi


def test_overlap_equals_plain_all_reduce():
    out = run_mpi(2, ["tests/mpi/progs/check_overlap.py"], timeout=120)
    expect_passed(out, "check_overlap")


def test_issue19_overlap_on_nccl_runs_on_non_blocking_streams():
    """On the NCCL backend (fake, one host: native) the gradient collectives during backward
    are nnabla's all_reduce_callback packs on non-blocking streams, with no host sync
    (the fake's stream model, nnabla_torus/testing/fake_nccl.py). The old code did not
    overlap on NCCL (no collective during backward) or bucketed onto blocking streams."""
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": "2"}
    out = run_mpi(2, ["tests/mpi/progs/check_overlap.py", "device-streams"], timeout=120,
                  env=env)
    expect_passed(out, "check_overlap")
