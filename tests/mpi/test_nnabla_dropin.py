"""nnabla's communicator API on ours, under mpirun (``tests/mpi/progs/nnabla_dropin.py``):
every name and collective with nnabla's argument forms on every algorithm, the zeroing rule,
all_reduce_callback through backward, SyncBN against one-process batch normalization."""
import re

import pytest

from tests.mpirun import expect_passed, run_mpi

PROG = "tests/mpi/progs/nnabla_dropin.py"
CASES = [pytest.param("mpi", r, id=f"mpi-{r}") for r in (1, 2, 3, 4)]
CASES += [pytest.param("fake-nccl", r, id=f"fake-nccl-{r}") for r in (2, 4)]


@pytest.mark.parametrize("backend, ranks", CASES)
def test_nnabla_api_conformance(backend, ranks):
    out = run_mpi(ranks, [PROG], timeout=180, env={"NNABLA_TORUS_BACKEND": backend})
    expect_passed(out, f"nnabla_dropin on {ranks} ranks")
    ok = re.findall(r"^OK (.*) \(", out, re.M)
    for algorithm in ("torus2d", "ring", "native", "hierarchical", "auto"):
        for case in ("all_reduce forms", "zeroing rule", "reduce"):
            assert f"{algorithm}: {case}" in ok, (algorithm, case)
    for case in ("names and properties", "groups", "bcast", "all_gather and reduce_scatter",
                 "allreduce and context parameters", "zeroing demo", "bad input",
                 "all_reduce_callback",
                 "sync_batch_normalization", "sync_batch_normalization group and output_stat",
                 "sync_batch_normalization recompute", "sync_batch_normalization foreign comm"):
        assert case in ok, case
    # nnabla's rule: a gradient no rank computed is neither decayed nor updated, at any size.
    assert f"FIGURE zeroing demo: {ranks} ranks, w 1.0 -> 1.0000" in out
