"""The generated tasks (recipes clusters-mlp and shapes-cpu) train a few steps at 2 ranks."""
import numpy as np
import pytest

from tests.examples.train_output import summary_of
from tests.mpirun import run_mpi

TRAIN = "examples/imagenet/train.py"


@pytest.mark.slow
@pytest.mark.parametrize("recipe,arch", [("clusters-mlp", "mlp x1.0"),
                                         ("shapes-cpu", "resnet18 x0.125")])
def test_task_trains_a_few_steps_at_two_ranks(tmp_path, recipe, arch):
    # The first run builds the set in the cache (clusters: ~30 s once), under a file lock.
    out = run_mpi(2, [TRAIN, "-C", recipe, "--train-images", "256", "--epochs", "1",
                      "--max-steps", "4", "--local-batch", "16", "--batch-schedule", "0:32",
                      "--progress", "0", "--log-every", "1", "--output-dir", str(tmp_path)],
                  timeout=300)
    assert f"{arch}:" in out and "256 training" in out, out[-3000:]
    summary = summary_of(out)
    assert summary["ranks"] == 2 and summary["steps"] == 4, summary
    loss = np.loadtxt(tmp_path / "train_loss.series.txt", ndmin=2)[:, 1]
    assert len(loss) >= 1 and np.isfinite(loss).all(), loss
    assert 0 <= summary["val_top1"] <= 1
    # clusters-mlp validates four times an epoch (--val-every 0.25; 8 steps an epoch here),
    # shapes-cpu at each epoch's end and the run's last step
    validated = [line.split(": train loss")[0][9:] for line in out.splitlines()
                 if "val top-1" in line and "train loss" in line]
    assert validated == (["epoch 0.25 step 2", "epoch 0.50 step 4"] if recipe == "clusters-mlp"
                         else ["epoch 0.50 step 4"]), out[-3000:]
