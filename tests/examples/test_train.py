"""The ImageNet example end to end at 2 ranks on a slice of the embedded digits data.

Training learns (loss falls, accuracy well above chance), every rank ends with the same
parameters, a batch change is logged, and an interrupted run resumed from its checkpoint
ends with exactly the parameters of an uninterrupted one. Also: N ranks x batch b take the
same step as one process with batch N*b.
"""
import json
import math
import os
import re

import numpy as np
import pytest

from tests.examples.train_output import summary_of
from tests.mpirun import expect_passed, run_mpi

PROG = "tests/examples/progs/train_check.py"
# 512 training images, 16 px, batch 32 -> 64 after epoch 1: a few seconds of compute per run.
SMALL = ["--train-images", "512", "--image-size", "16", "--local-batch", "16",
         "--batch-schedule", "0:32,1:64", "--reference-batch", "32", "--warmup-epochs", "0.5",
         "--progress", "0", "--seed", "5"]


@pytest.mark.slow
def test_end_to_end_two_ranks(tmp_path):
    out = run_mpi(2, [PROG] + SMALL + ["--epochs", "3", "--output-dir", str(tmp_path)],
                  timeout=240)
    assert "PARAMS_EQUAL" in out, out
    assert "realised as 2 ranks x 16 x 2 accumulation = 64" in out   # batch change + accumulation
    summary = summary_of(out)
    assert summary["ranks"] == 2 and summary["epochs"] == 3.0
    assert summary["batch_schedule"] == "0:32,1:64"
    assert summary["val_top1"] > 0.3, summary           # chance is 0.1
    loss = np.loadtxt(tmp_path / "train_loss.series.txt")[:, 1]
    assert loss[-3:].mean() < loss[:3].mean() - 0.2, loss
    assert (tmp_path / "training.png").stat().st_size > 1000
    assert [f for f in os.listdir(tmp_path) if f.endswith(".npz.chk")]


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    common = SMALL + ["--train-images", "128", "--epochs", "3", "--checkpoint-every", "3"]
    whole, part = tmp_path / "whole", tmp_path / "part"
    run_mpi(2, [PROG, "--save-params", str(tmp_path / "whole.npz")] + common +
            ["--max-steps", "7", "--output-dir", str(whole)], timeout=180)
    # Stopped after 3 steps (mid-epoch 0), then resumed: crosses the epoch end and the batch
    # change at epoch 1 after the restart.
    run_mpi(2, [PROG] + common + ["--max-steps", "3", "--output-dir", str(part)], timeout=180)
    out = run_mpi(2, [PROG, "--save-params", str(tmp_path / "part.npz")] + common +
                  ["--max-steps", "7", "--output-dir", str(part), "--resume", "1"], timeout=180)
    assert "resumed from" in out and "step 3" in out
    whole_params, part_params = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "part.npz")
    assert sorted(whole_params.files) == sorted(part_params.files)
    for name in whole_params.files:
        np.testing.assert_array_equal(part_params[name], whole_params[name], err_msg=name)


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_an_earlier_version_in_one_line(tmp_path):
    """A checkpoint from before the batch control was kept as AdaptiveBatch.state_dict() (its
    own plan/noise/refit/decisions fields) is refused on every rank, no traceback."""
    from nnabla_torus.training.checkpoint_file import load_latest_checkpoint, save_checkpoint
    common = SMALL + ["--train-images", "128", "--checkpoint-every", "3", "--max-steps", "3",
                      "--output-dir", str(tmp_path)]
    run_mpi(2, [PROG] + common, timeout=180)
    arrays, meta, path = load_latest_checkpoint(str(tmp_path))
    batch = meta.pop("batch")
    meta.update(plan=[batch["global_batch"], batch["local_batch"], batch["accum_steps"],
                      batch["lr_factor"], False, "restored"], noise=None, refit=None,
                decisions=None)
    save_checkpoint(str(tmp_path), meta["step"], arrays, meta)
    out = run_mpi(2, ["examples/imagenet/train.py"] + common + ["--resume", "1"], timeout=180,
                  check=False)
    line = (f"train.py: error: --resume: {path} is of an earlier train.py (its batch control "
            f"is not an AdaptiveBatch state); start a new run in another --output-dir")
    assert line in out and "Traceback" not in out, out


@pytest.mark.slow
def test_data_parallel_step_equals_single_process_big_batch():
    out = run_mpi(2, ["tests/examples/progs/check_dp_step.py"], timeout=180)
    expect_passed(out, "check_dp_step")


@pytest.mark.slow
def test_adaptive_batch_decides_by_goodput(tmp_path):
    # 32 steps: the confidence rule is loosened so that decisions happen in so short a run.
    # The first decision comes at step 9-14 (timing and the data order vary it); with 16 steps
    # one CI run had none.
    out = run_mpi(2, [PROG] + SMALL + ["--train-images", "256", "--epochs", "4",
                                       "--adaptive-batch", "1", "--max-batch", "128",
                                       "--adaptive-min-samples", "4", "--adaptive-max-rse", "5",
                                       "--output-dir", str(tmp_path)], timeout=180)
    assert "PARAMS_EQUAL" in out, out
    assert "goodput: start at B0 = 32 until the noise scale is trustworthy" in out, out
    decisions = [line for line in out.splitlines() if "goodput: keep" in line
                 or "goodput: change" in line]
    assert decisions, out                                   # the first decision, with its numbers
    samples = int(re.search(r"\((\d+) samples\)", decisions[0]).group(1))
    assert samples >= 4 and "against a prediction error of" in decisions[0], decisions[0]
    # from 2 warm-up + 5 steps at B0 on, batches are priced with the run's measured step
    # times (the first such decision is logged)
    assert any("throughput from measured step times: step = accum x" in d
               for d in decisions), decisions
    assert summary_of(out)["batch_schedule"].startswith("0:32")
    noise = np.loadtxt(tmp_path / "noise_scale.series.txt", ndmin=2)
    assert len(noise) and np.all(noise[:, 1] > 0)


@pytest.mark.slow
def test_a_prior_decides_where_it_starts_then_the_runs_own_measurements(tmp_path):
    # An adaptive run writes batch_prior.json; the next run of the same model, data and ranks
    # measures at B0 until the prior starts (the first run's first trusted point), decides on
    # it there, then its own step times (exchanged at step 10) replace the prior's, and its
    # own noise scale overrides the prior's. Each moment is logged. (The first run is 6 epochs
    # of 512 images: a prior keeps only noise-scale points of relative error <= 0.5, and 3
    # epochs of 256 left 4 at 0.41-0.48, 3 of 512 six at 0.38-0.50.)
    common = SMALL + ["--adaptive-batch", "1", "--max-batch", "128", "--adaptive-max-rse", "5"]
    run_mpi(2, [PROG] + common + ["--adaptive-min-samples", "4", "--epochs", "6",
                                  "--output-dir", str(tmp_path / "first")], timeout=240)
    prior = tmp_path / "first" / "batch_prior.json"
    starts = json.load(open(prior))["noise_scale"][0][0]
    before = math.ceil(starts * 3 * 16)       # steps of the second run at B0 = 32 before it
    assert before <= 6, f"the prior starts at {starts:.1%}: too late for this test's 10 steps"
    out = run_mpi(2, [PROG] + common + ["--adaptive-min-samples", str(before + 2), "--epochs",
                                        "3", "--batch-prior", str(prior),
                                        "--output-dir", str(tmp_path / "second")], timeout=180)
    assert "PARAMS_EQUAL" in out, out
    assert f"batch prior: the run {tmp_path / 'first'} of " in out, out
    assert f"from {starts:.1%} of training on, with its step times" in out, out
    assert f"then decide on the prior (earlier run: {prior}) from {starts:.1%} of training" in out
    first = next(line for line in out.splitlines() if "goodput: keep" in line
                 or "goodput: change" in line)
    assert f"step {before}:" in first and "% of training, earlier run)" in first, first
    assert "the steps an earlier run (the prior) measured" in first, first
    assert "goodput: the measurement overrides the prior from now on" in out, out
    own = next(line for line in out.splitlines() if "own step times replace" in line)
    assert "the prior) measured" not in own, own
    assert (tmp_path / "second" / "batch_prior.json").exists()


@pytest.mark.slow
def test_an_efficiency_fit_file_prices_every_decision_and_caps_the_batch(tmp_path):
    # What `time_to_accuracy.py efficiency` writes, as a user passes it: the controller decides
    # on phi = factor x B_simple, says so at each decision, and never trains past the largest
    # batch of the runs the factor was fitted on (its --max-batch 128 capped at 96).
    # The file names its task: SMALL's model and data (a fit of another task is refused).
    from nnabla_torus.planning import efficiency_fit
    task = {"model": {"arch": "resnet18", "width": 0.125, "image_size": 16,
                      "parameters": 176402}, "data": {"data": "digits", "images": 512,
                                                      "classes": 10}}
    fit = tmp_path / "efficiency_fit.json"
    flags = SMALL + ["--adaptive-batch", "1", "--max-batch", "128",
                     "--adaptive-min-samples", "4", "--adaptive-max-rse", "5",
                     "--batch-prior", "none", "--efficiency-fit", str(fit),
                     "--epochs", "2", "--output-dir", str(tmp_path / "run")]
    other = dict(task, data=dict(task["data"], images=1438))
    efficiency_fit.save(efficiency_fit.Scale(50.0, 0.05, 10000.0, 200.0, 96, other), fit)
    out = run_mpi(2, ["examples/imagenet/train.py"] + flags, timeout=180, check=False)
    assert (f"train.py: error: efficiency fit '{fit}' was fitted on resnet18 x0.125 16 px "
            f"(176,402 parameters) on digits (1,438 images), not this run's resnet18 x0.125 "
            f"16 px (176,402 parameters) on digits (512 images)") in out, out
    assert "Traceback" not in out, out
    efficiency_fit.save(efficiency_fit.Scale(50.0, 0.05, 10000.0, 200.0, 96, task), fit)
    out = run_mpi(2, [PROG] + flags, timeout=180)
    assert "PARAMS_EQUAL" in out, out
    assert (f"goodput: efficiency fitted to fixed runs ({fit}): phi = 50.00 +- 5% x B_simple "
            f"(fitted phi 10000 over a measured B_simple of 200, runs up to batch 96)") in out, out
    assert ("goodput: max_batch 128 -> 96: the efficiency fit's runs went up to batch 96, and "
            "its factor is not taken past them") in out, out
    decisions = [line for line in out.splitlines() if "goodput: keep" in line
                 or "goodput: change" in line]
    assert decisions and all("x B_simple, fitted)" in d for d in decisions), decisions
    batches = np.loadtxt(tmp_path / "run" / "global_batch.series.txt", ndmin=2)[:, 1]
    assert batches.max() <= 96, batches


@pytest.mark.slow
def test_adaptive_resume_keeps_the_measured_step_times(tmp_path):
    # The checkpoint at step 11 holds the refit's steps (exchanged at step 10): the resumed
    # run restores them, and its decisions price batches with them, not with the cost model
    # again. (It may make none in its steps: while the best batch at the low end of phi is the
    # one in use, goodput.waiting keeps measuring, which then costs nothing; the first run
    # decided on the same numbers at step 9, so whether the resumed one logs a decision by
    # step 13 depended on the measured step times.)
    common = SMALL + ["--train-images", "256", "--epochs", "2", "--adaptive-batch", "1",
                      "--max-batch", "128", "--adaptive-min-samples", "4",
                      "--adaptive-max-rse", "5", "--checkpoint-every", "11",
                      "--output-dir", str(tmp_path)]
    run_mpi(2, [PROG] + common + ["--max-steps", "11"], timeout=180)
    out = run_mpi(2, [PROG] + common + ["--max-steps", "16", "--resume", "1"], timeout=180)
    assert "resumed from" in out and "step 11" in out, out
    assert "resume: the checkpoint's step times" not in out, out   # restored, not measured anew
    assert "resume: the batch-size controller continues after" in out, out
    decisions = [line for line in out.splitlines() if "goodput: keep" in line
                 or "goodput: change" in line]
    assert all("throughput from measured step times" in d for d in decisions), decisions


@pytest.mark.slow
def test_resume_continues_the_newest_run_in_the_folder(tmp_path):
    """make demo (a long run), then a shorter run into the same folder, then --resume 1: it
    resumed the long run's step 155 and overwrote model.h5 with its older weights, and said
    "val top-1 best None". Now the shorter run sets the long one aside, --resume 1 continues
    the shorter run and says which, and the best top-1 comes back with the checkpoint."""
    common = SMALL + ["--train-images", "128", "--epochs", "3", "--output-dir", str(tmp_path)]
    run_mpi(2, [PROG] + common + ["--max-steps", "9", "--checkpoint-every", "3"], timeout=180)
    out = run_mpi(2, [PROG] + common + ["--max-steps", "4", "--checkpoint-every", "2"],
                  timeout=180)
    last = re.search(r"held an earlier run \(checkpoints of steps 3-(\d+)\)", out)
    assert last, out
    aside = [d for d in os.listdir(tmp_path) if d.startswith("earlier-run-")]
    assert len(aside) == 1, aside
    assert (tmp_path / aside[0] / f"ckpt-{int(last.group(1)):09d}.npz.chk").exists()
    out = run_mpi(2, [PROG] + common + ["--max-steps", "6", "--resume", "1"], timeout=180)
    assert re.search(r"resumed from \S+ckpt-000000004\.npz\.chk: step 4, epoch [\d.]+, run \S+",
                     out), out
    assert summary_of(out)["val_top1"] is not None
    assert "val top-1 best None" not in out, out
