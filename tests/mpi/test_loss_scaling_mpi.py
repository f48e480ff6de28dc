"""Dynamic loss scaling around the overlapped all-reduce equals nnabla's updater (1, 2, 4 ranks)."""
import pytest

from tests.mpirun import expect_passed, run_mpi


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_loss_scaling_matches_nnabla_updater(ranks):
    out = run_mpi(ranks, ["tests/mpi/progs/check_loss_scaling.py"], timeout=180)
    expect_passed(out, "check_loss_scaling")
    for scenario in ("natural", "injected"):
        for mode in ("plain", "overlap"):
            assert f"{ranks} ranks {scenario} {mode}:" in out, out
