"""Noise-scale estimator fed by the all-reduce: within 15 % of the true B_simple at 2 and 4
ranks."""
import pytest

from tests.mpirun import expect_passed, run_mpi


@pytest.mark.parametrize("ranks", [2, 4])
def test_linear_regression_noise_scale(ranks):
    out = run_mpi(ranks, ["tests/mpi/progs/noise_scale_linreg.py", "--steps", "1000",
                          "--tolerance", "0.15"], timeout=180)
    expect_passed(out, "noise_scale_linreg")
