"""Bucketed all-reduce during backward equals a plain all-reduce after it (2 ranks)."""
import pytest

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


@pytest.mark.parametrize("ranks", [2, 3])
def test_issue19_native_overlap_keeps_the_noise_scale_on_the_device(ranks):
    """With the noise scale tracked, native still overlaps through nnabla's callback; the
    norms are device kernels before each pack, no host sync in backward, and pop_sqnorms()
    equals the numpy reference (tests/mpi/progs/check_overlap.py device_norms). The old code
    fell back to one all-reduce after backward (a legacy-default collective and a host sync)."""
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": str(ranks)}
    out = run_mpi(ranks, ["tests/mpi/progs/check_overlap.py", "device-norms"], timeout=120,
                  env=env)
    expect_passed(out, "check_overlap")
