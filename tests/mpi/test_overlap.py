"""Bucketed all-reduce during backward equals a plain all-reduce after it (2 ranks)."""
from tests.mpirun import expect_passed, run_mpi


def test_overlap_equals_plain_all_reduce():
    out = run_mpi(2, ["tests/mpi/progs/check_overlap.py"], timeout=120)
    expect_passed(out, "check_overlap")
