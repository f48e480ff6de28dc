"""nnabla's communicator API on ours, under mpirun (``tests/mpi/progs/nnabla_dropin.py``):
every name and collective with nnabla's argument forms on every algorithm, the zeroing rule,
all_reduce_callback through backward, SyncBN against one-process batch normalization."""
import os
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tests.mpirun import expect_passed, run_mpi
from tests.slowdown import scaled

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
                 "sync_batch_normalization recompute", "sync_batch_normalization first-class",
                 "sync_batch_normalization foreign comm"):
        assert case in ok, case
    # nnabla's rule: a gradient no rank computed is neither decayed nor updated, at any size.
    assert f"FIGURE zeroing demo: {ranks} ranks, w 1.0 -> 1.0000" in out


def test_cpu_sync_bn_graph_saves_and_nnabla_cli_infer_runs_it(tmp_path):
    """A graph with the CPU SyncBN saves to .nnp (as BatchNormalization: nnabla v1.39.0 cannot
    save its own SyncBN) and ``nnabla_cli infer`` runs it: the output is the one-process
    batch normalization of the input batch (issue 33)."""
    env = {"NNABLA_TORUS_BACKEND": "mpi", "DROPIN_ONLY": "saved", "SYNC_BN_NNP_DIR": str(tmp_path)}
    expect_passed(run_mpi(2, [PROG], timeout=120, env=env), "nnabla_dropin on 2 ranks")
    with zipfile.ZipFile(tmp_path / "sync_bn.nnp") as nnp:
        nntxt = nnp.read("network.nntxt").decode()
    assert 'type: "BatchNormalization"' in nntxt and "Sync" not in nntxt, nntxt
    cli = os.path.join(os.path.dirname(sys.executable), "nnabla_cli")
    done = subprocess.run([cli, "infer", "-c", str(tmp_path / "sync_bn.nnp"), "-b", "3",
                           "-o", str(tmp_path / "out"), str(tmp_path / "x.bin")],
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stdout + done.stderr
    want = np.load(tmp_path / "want.npy")
    got = np.concatenate([np.fromfile(tmp_path / f"out_{i}.bin", np.float32)
                          for i in range(len(want))])   # one file per sample
    np.testing.assert_allclose(got, want.ravel(), rtol=1e-5, atol=1e-5)
