"""Issue 48 in a plan: its epochs, what its time to train includes, where its compute comes from,
the model error its recommendation respects (in the table and the JSON), --epochs with recipes."""
import json

import pytest

from nnabla_torus.cli import plan as plan_cli


def run(capsys, tmp_path, *argv):
    out = tmp_path / "p.json"
    plan_cli.main([*argv, "--json", str(out)])
    return capsys.readouterr().out, json.loads(out.read_text())


def test_a_plan_says_its_epochs_what_time_to_train_includes_and_its_compute(capsys, tmp_path):
    text, report = run(capsys, tmp_path, "--profile", "dgx-h100", "--hosts", "4")
    assert "# time to train: 90 epochs of 1,281,167 images" in text
    assert "start-up, validation and input stalls" in text
    assert "# compute: model resnet50: fitted to published runs of 1-8 nodes" in text
    assert report["epochs"] == 90 and report["model_error"] == pytest.approx(0.04)
    assert report["model_note"].startswith("model resnet50: fitted")   # was '' (issue 48)
    best = report["recommendation"]
    assert best["time_to_train_s"] == pytest.approx(best["training_s"] + best["fixed_s"])
    assert best["fixed_s"] > 40                       # start-up of 4 DGX H100 nodes


def test_rows_stay_inside_hosts_unless_crossing_beats_the_model_error(capsys, tmp_path):
    text, report = run(capsys, tmp_path, "--profile", "dgx-h100", "--hosts", "32")
    assert report["recommendation"]["grid"] == "8x30"   # not 16x16, rows across hosts
    assert "rows inside hosts kept" in report["kept"] and "# simplest within" in text


def test_epochs_works_with_a_recipe(capsys, tmp_path):
    text, report = run(capsys, tmp_path, "--profile", "abci", "--recipe", "sony-224s",
                       "--epochs", "45")
    assert "45 epochs (--epochs)" in text
    assert sum(p["epochs"] for p in report["phases"]) == 45
    text, _ = run(capsys, tmp_path, "--profile", "abci", "--recipe", "sony-224s")
    assert "90 epochs (the recipe's)" in text


def test_one_dgx_a100_runs_nnablas_own_path_and_the_plan_says_so(capsys, tmp_path):
    """Issue 47: on one NCCL host the default first run takes native through nnabla's callback
    (its 161 one-byte checks at the host's MPI latency: 0.22 ms, under torus2d's 0.4 ms)."""
    text, report = run(capsys, tmp_path, "--profile", "dgx-a100", "--hosts", "1", "--model",
                       "resnet50", "--batch", "256")
    assert report["recommendation"]["algorithm"] == "native"
    assert report["recommendation"]["gpus"] == 8
    assert ("# native: nnabla's own all_reduce_callback, overlapped with backward" in text
            and "no overlap trial; its 161 one-byte MPI all-reduces cost 0.22 ms" in text)


def test_a_plan_says_why_native_was_not_recommended(capsys, tmp_path):
    text, report = run(capsys, tmp_path, "--profile", "dgx-a100", "--hosts", "4", "--batch",
                       "1024")
    assert report["recommendation"]["algorithm"] == "torus2d"
    assert "# native (nnabla's all_reduce_callback" in text and "161 one-byte MPI" in text


def test_schedules_and_recipes_say_their_epochs_and_compute(capsys, tmp_path):
    text, report = run(capsys, tmp_path, "--profile", "abci", "--schedule", "0:34816,5:69632",
                       "--local-batch", "32")
    assert "# compute: model resnet50: fitted" in text and report["epochs"] == 90
    text, report = run(capsys, tmp_path, "--profile", "abci", "--recipe", "sony-224s")
    assert "# compute: fitted to published runs" in text and report["epochs"] == 90
