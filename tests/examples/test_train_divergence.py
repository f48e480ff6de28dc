"""A diverging run stops on every rank with one line, and keeps the checkpoints from before it
(before: --base-lr 1e6 trained on NaN to the end, and all three kept checkpoints were after
the divergence)."""
import numpy as np
import pytest

from tests.examples.test_train_plan import TRAIN
from tests.examples.train_output import summary_of
from tests.mpirun import run_mpi

DIVERGING = ["--train-images", "256", "--image-size", "16", "--local-batch", "16",
             "--batch-schedule", "0:32", "--reference-batch", "32", "--warmup-epochs", "0.1",
             "--epochs", "3", "--base-lr", "1e6", "--checkpoint-every", "1", "--progress", "0"]


@pytest.mark.slow
def test_a_diverged_run_stops_on_every_rank_and_keeps_the_finite_checkpoints(tmp_path):
    out = run_mpi(2, [TRAIN] + DIVERGING + ["--max-nonfinite-steps", "2", "--output-dir",
                                             str(tmp_path)], timeout=180, check=False)
    lines = [line for line in out.splitlines() if "the run diverged" in line]
    assert len(lines) == 1, out                                   # rank 0 only, once
    assert "gradients have not been finite for 2 steps (since step " in lines[0], lines[0]
    assert "Lower --base-lr (now 1e+06)" in lines[0] and "Traceback" not in out, out
    since = summary_of(out)["diverged_since_step"]
    stopped = summary_of(out)["steps"]
    assert stopped == since + 1, (since, stopped)                # 2 non-finite steps in a row
    loss = dict(np.loadtxt(tmp_path / "train_loss.series.txt", ndmin=2).tolist())
    kept = sorted(int(p.name[5:14]) for p in tmp_path.glob("ckpt-*.npz.chk"))
    assert kept and max(kept) < since, (kept, since)              # all from before it
    assert all(np.isfinite(loss[float(step)]) for step in kept), (kept, loss)
    assert not (tmp_path / "model.h5").exists()                   # no model of a diverged run
