"""A model the profile does not know is priced from its own cost (FLOPs counted from the nnabla
graph, scaled from a calibrated model on the same device), never another model's step time."""
import json
import math
import os

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import pytest

from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.planning import model_cost
from nnabla_torus.planning.machine_profile import load_profile
from tests.slowdown import scaled


def test_count_cost_counts_convolution_and_affine_multiply_adds():
    nn.clear_parameters()
    x = nn.Variable((3, 5, 17, 17))
    h = PF.convolution(x, 7, (3, 3), pad=(1, 1), stride=(2, 2), name="c")    # 7 x 9 x 9 out
    h = F.relu(PF.batch_normalization(h, name="bn"))
    y = PF.affine(h, 11, name="fc")
    cost = model_cost.count_cost(y)
    conv = 7 * 9 * 9 * (5 * 3 * 3)
    fc = (7 * 9 * 9) * 11
    assert cost.forward_macs == conv + fc
    # trained parameters only: the batch-norm statistics are not all-reduced gradients
    assert cost.params == 7 * 5 * 9 + 7 + 2 * 7 + (7 * 9 * 9) * 11 + 11
    assert cost.gflops_per_image == pytest.approx((conv + fc) * 6 / 1e9)


def test_grouped_convolution_counts_only_its_group():
    nn.clear_parameters()
    y = PF.convolution(nn.Variable((1, 8, 6, 6)), 8, (3, 3), group=4, name="g")
    assert model_cost.count_cost(y).forward_macs == 8 * 4 * 4 * (2 * 3 * 3)


def test_a_model_is_priced_from_the_nearest_calibrated_model():
    prof = load_profile("abci")
    comp, note = model_cost.priced_compute(prof, 24.54 / 2, 2 * 11_699_112, 256)
    assert comp.b_s == pytest.approx(prof.models["resnet50"].b_s / 2)
    assert comp.a_s == prof.models["resnet50"].a_s and comp.grad_bytes == 2 * 11_699_112
    assert "priced from its own cost" in note and "resnet50" in note


def test_the_cli_prices_an_unknown_model_and_says_so(tmp_path, capsys):
    plan_cli.main(["--profile", "dgx-h100", "--hosts", "4", "--model", "resnet18",
                   "--gflops-per-image", "10.88", "--params", "11699112",
                   "--dataset-size", "1281167", "--json", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert "# model resnet18: priced from its own cost: 10.9 training GFLOPs" in out
    assert "no statistical limit known" in out
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["model_note"].startswith("model resnet18: priced")


def test_calibrate_adds_a_model_to_a_profile_in_one_command(tmp_path):
    """tools/calibrate.py --add-model-to: one-rank step times (here saved records) fitted as
    a + b x batch, FLOPs counted, the profile written with the model beside the others."""
    import subprocess
    import sys
    records = [{"ranks": 1, "local_batch": m, "step_time_s": 0.1 + 0.02 * m, "overlap": False}
               for m in (8, 16, 32)]
    (tmp_path / "train.json").write_text(json.dumps(records))
    out = tmp_path / "mine.yaml"
    done = subprocess.run([sys.executable, "tools/calibrate.py", "--add-model-to", "cpu-2core",
                           "--arch", "resnet18", "--width", "0.25", "--image-size", "64",
                           "--classes", "10", "--train-json", str(tmp_path / "train.json"),
                           "--out", str(out)], capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, done.stderr
    prof = load_profile(str(out))
    comp = prof.models["resnet18-w0.25-64px"]
    assert comp.a_s == pytest.approx(0.1) and comp.b_s == pytest.approx(0.02)
    assert comp.slots_per_host == prof.models["resnet18-w0.125-16px"].slots_per_host == 1
    assert prof.extra["gflops_per_image"]["resnet18-w0.25-64px"] == pytest.approx(0.06636, 1e-3)
    assert set(prof.models) == set(load_profile("cpu-2core").models) | {"resnet18-w0.25-64px"}


def test_adding_a_model_keeps_the_profiles_file_its_keys_and_its_comments(tmp_path):
    """--add-model-to FILE without --out writes FILE+MODEL.yaml beside it and leaves FILE as
    it was; the new file keeps every comment (the values' sources) and every key of a model
    the calibration does not measure (grad_arrays). Before: FILE rewritten in place, its
    comments and grad_arrays gone."""
    import shutil
    import subprocess
    import sys
    from nnabla_torus.planning.machine_profile import PROFILE_DIR
    records = [{"ranks": 1, "local_batch": m, "step_time_s": 0.1 + 0.02 * m, "overlap": False}
               for m in (8, 16, 32)]
    (tmp_path / "train.json").write_text(json.dumps(records))
    mine = tmp_path / "mine.yaml"
    shutil.copy(os.path.join(PROFILE_DIR, "cpu-2core.yaml"), mine)
    text = mine.read_text().replace("  resnet18-w0.125-16px:\n",
                                    "  resnet18-w0.125-16px:\n    grad_arrays: 62  # counted\n")
    mine.write_text(text)
    for arch_width in ("0.25", "0.125"):       # a new model, then the profile's own again
        done = subprocess.run(
            [sys.executable, "tools/calibrate.py", "--add-model-to", str(mine), "--arch",
             "resnet18", "--width", arch_width, "--image-size", "64" if arch_width == "0.25"
             else "16", "--classes", "10", "--train-json", str(tmp_path / "train.json")],
            capture_output=True, text=True, timeout=scaled(300))
        assert done.returncode == 0, done.stderr
        assert mine.read_text() == text                        # the user's file is untouched
    added = tmp_path / "mine+resnet18-w0.25-64px.yaml"
    again = tmp_path / "mine+resnet18-w0.125-16px.yaml"
    assert f"wrote {again}" in done.stdout
    comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    for path in (added, again):
        lines = path.read_text().splitlines()
        assert all(c in lines for c in comments), path
        assert "    grad_arrays: 62  # counted" in lines, path
    prof = load_profile(str(added))
    assert set(prof.models) == set(load_profile("cpu-2core").models) | {"resnet18-w0.25-64px"}
    assert prof.models["resnet18-w0.125-16px"].grad_arrays == 62
    assert load_profile(str(again)).models["resnet18-w0.125-16px"].b_s == pytest.approx(0.02)


@pytest.mark.parametrize("records, message", [
    ([{"ranks": 1, "local_batch": 8, "step_time_s": math.nan},
      {"ranks": 1, "local_batch": 16, "step_time_s": math.nan}],
     "@: record 0 has step_time_s = nan, not a finite number of seconds > 0; measure again "
     "(without --train-json) or correct the record"),
    ([{"ranks": 1, "local_batch": 8, "step_time_s": -0.5}], "record 0 has step_time_s = -0.5"),
    ([{"ranks": 1, "local_batch": 0, "step_time_s": 0.5}], "record 0 has local_batch = 0"),
    ([{"ranks": 1, "local_batch": 8, "step_time_s": "0.5"}], "has step_time_s = '0.5'"),
    ([{"ranks": 2, "local_batch": 8, "step_time_s": 0.5}, {"ranks": 4, "local_batch": 8,
                                                            "step_time_s": 0.7}],
     "@ has no one-rank records (ranks [2, 4]): --add-model-to fits one rank's step times"),
    ({"ranks": 1, "local_batch": 8, "step_time_s": 0.5},
     "@ holds a JSON dict, not the list of records tools/train_bench.py --json writes"),
    (None, "cannot read @ (No such file or directory); give the --json file of "
           "tools/train_bench.py"),
])
def test_bad_step_records_write_no_profile(tmp_path, records, message):
    """Before: NaN or negative step times wrote a profile of b_ms NaN or -62.5 and exited 0;
    no one-rank record, a JSON object or a missing file were tracebacks."""
    from tools import calibrate
    source = tmp_path / "train.json"
    if records is not None:
        source.write_text(json.dumps(records))
    out = tmp_path / "mine.yaml"
    with pytest.raises(SystemExit) as caught:
        calibrate.main(["--add-model-to", "cpu-2core", "--arch", "resnet18", "--width", "0.25",
                        "--image-size", "16", "--classes", "10", "--train-json", str(source),
                        "--out", str(out)])
    line = str(caught.value)
    assert line.startswith("calibrate: error: ") and message.replace("@", str(source)) in line
    assert "\n" not in line and not out.exists()
