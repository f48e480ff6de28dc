"""Resume at another world size: 4 ranks for 3 steps, then 2 or 8 ranks, against 4 throughout.

Global batch 64 (4 x 16). On 2 ranks the controller splits it as 16 x 2 accumulation and the
resharded epoch gives each micro-batch exactly one old rank's 16 images, so the gradients are
the same sums in another order: parameters and the final loss agree to float32 rounding
(measured: max |diff| 6e-8). On 8 ranks each rank takes half an old rank's batch (8 x 1):
BatchNorm normalises over 8 images instead of 16, so the steps differ slightly (measured after
3 steps: relative parameter difference 1.2e-3). BatchNorm running statistics are not compared:
their moving average advances once per micro-batch on each rank. Whole-image crops
(--min-crop-area 1) make the input independent of the DALI pipelines' random streams.
"""
import re
import shutil

import numpy as np
import pytest

from tests.mpirun import run_mpi

PROG = "tests/examples/progs/train_check.py"
TINY = ["--train-images", "512", "--image-size", "16", "--local-batch", "16",
        "--batch-schedule", "0:64", "--reference-batch", "64", "--warmup-epochs", "0.5",
        "--epochs", "2", "--min-crop-area", "1", "--progress", "0", "--seed", "5",
        "--checkpoint-every", "3"]


def final_loss(out):
    return float(re.search(r"FINAL_LOSS (\S+)", out).group(1))


def trainable(npz):
    return {k: npz[k] for k in npz.files if not k.endswith(("/mean", "/var"))}


def differences(a, b):
    """(max |a - b|, |a - b| / |a|) over all trainable parameters."""
    a, b = trainable(np.load(a)), trainable(np.load(b))
    assert sorted(a) == sorted(b)
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    rel = np.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a) / sum((a[k] ** 2).sum() for k in a))
    return diff, float(rel)


@pytest.mark.slow
def test_resume_on_two_and_eight_ranks_matches_four(tmp_path):
    whole = run_mpi(4, [PROG, "--save-params", str(tmp_path / "whole.npz")] + TINY +
                    ["--max-steps", "6", "--output-dir", str(tmp_path / "whole")], timeout=240)
    run_mpi(4, [PROG] + TINY + ["--max-steps", "3", "--output-dir", str(tmp_path / "part")],
            timeout=240)
    results = {}
    for ranks in (2, 8):
        folder = tmp_path / f"on{ranks}"
        shutil.copytree(tmp_path / "part", folder)
        out = run_mpi(ranks, [PROG, "--save-params", str(tmp_path / f"on{ranks}.npz")] + TINY +
                      ["--max-steps", "6", "--resume", "1", "--output-dir", str(folder)],
                      timeout=360)
        assert "PARAMS_EQUAL" in out, out
        assert f"written by 4 ranks, this run has {ranks}" in out, out
        assert "resumed from" in out and "step 3, epoch 0.375" in out, out
        split = {2: "2 ranks x 16 x 2 accumulation", 8: "8 ranks x 8 x 1 accumulation"}[ranks]
        assert split in out, out
        diff, rel = differences(tmp_path / "whole.npz", tmp_path / f"on{ranks}.npz")
        results[ranks] = (diff, rel, abs(final_loss(out) - final_loss(whole)))
        print(f"4 -> {ranks} ranks: max |param diff| {diff:.3g}, relative {rel:.3g}, "
              f"final loss diff {results[ranks][2]:.3g}")
    assert results[2][0] < 1e-6 and results[2][2] < 1e-5, results      # float32 rounding
    assert results[8][1] < 1e-2 and results[8][2] < 2e-2, results      # BN over 8, not 16
