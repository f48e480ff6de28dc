"""An nnabla-examples-style script (tests/mpi/progs/nnabla_style_train.py) runs unchanged but
for its import: at 2 and 4 ranks its parameters end bitwise equal on every rank and equal, to
float32 rounding, to one process training on the concatenated batches."""
import os

import numpy as np
import pytest

from tests.mpirun import expect_passed, run_mpi

PROG = "tests/mpi/progs/nnabla_style_train.py"
GLOBAL_BATCH = 8


def trained(tmp_path, ranks):
    out = str(tmp_path / f"ranks{ranks}")
    log = run_mpi(ranks, [PROG, "--batch-size", str(GLOBAL_BATCH // ranks), "--out", out],
                  timeout=180)
    assert "step 5 loss" in log, log
    expect_passed(log, f"nnabla_style_train on {ranks} ranks")
    return [load(os.path.join(out, f"params_rank{r}.h5")) for r in range(ranks)]


def load(path):
    import nnabla as nn
    nn.clear_parameters()
    nn.load_parameters(path)
    values = {k: v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()}
    nn.clear_parameters()
    return values


@pytest.mark.parametrize("ranks", [2, 4])
def test_script_matches_one_process(tmp_path, ranks):
    reference = trained(tmp_path, 1)[0]
    per_rank = trained(tmp_path, ranks)
    assert "bn1/bn/mean" in reference and "aux/affine/W" in reference
    for name, want in reference.items():
        for rank, params in enumerate(per_rank):
            assert np.array_equal(params[name], per_rank[0][name]), (name, rank)
        diff = np.max(np.abs(per_rank[0][name] - want))
        assert diff <= 1e-5 * (1 + np.max(np.abs(want))), (name, diff)
