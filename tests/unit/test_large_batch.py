"""A default a user can train with: ResNet-50 on ImageNet is planned at most at the largest
published trainable batch when no noise scale is given, said in the plan; other models say that
no statistical limit is known; every plan names its statistical efficiency's source."""
import json

import pytest

from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.planning.large_batch import efficiency_source, published_limit


def plan(tmp_path, *argv):
    plan_cli.main(list(argv) + ["--json", str(tmp_path / "p.json")])
    return json.loads((tmp_path / "p.json").read_text())


def test_abci_resnet50_without_a_noise_scale_is_a_batch_people_trained(tmp_path, capsys):
    report = plan(tmp_path, "--profile", "abci", "--model", "resnet50")
    best = report["recommendation"]
    # before: 4,312 GPUs at global batch 1,103,872, "time to train 22.9 s"
    assert best["global_batch"] <= 65536 and best["global_batch"] >= 32768
    assert report["statistical_efficiency_source"] == "published default"
    out = capsys.readouterr().out
    assert "published default, global batch at most 65,536" in out
    assert "Yamazaki (Fujitsu) 81,920" in out and "Jia 65,536" in out


def test_a_given_noise_scale_replaces_the_published_default(tmp_path):
    report = plan(tmp_path, "--profile", "abci", "--model", "resnet50", "--noise-scale", "1e6")
    assert report["statistical_efficiency_source"] == "given noise scale"
    assert report["recommendation"]["global_batch"] > 65536


def test_other_models_say_no_statistical_limit_is_known(tmp_path, capsys):
    report = plan(tmp_path, "--profile", "cpu-2core", "--model", "resnet18-w0.125-16px")
    assert report["statistical_efficiency_source"] == "none"
    assert "no statistical limit known" in capsys.readouterr().out


def test_the_table_uses_full_column_names(tmp_path, capsys):
    plan(tmp_path, "--profile", "abci", "--max-gpus", "8")
    header = [line for line in capsys.readouterr().out.splitlines()
              if "GPUs" in line and "grid" in line][0]
    for title in ("per-GPU batch", "accumulation", "global batch", "scaling efficiency",
                  "statistical efficiency", "time to train (s)"):
        assert title in header
    assert " acc " not in header and " stat " not in header and " scale " not in header


@pytest.mark.parametrize("model, limit", [("resnet50", 65536), ("resnet50-w1-224px", 65536),
                                          ("resnet50-w0.25-64px", None), ("vgg16", None)])
def test_published_limits(model, limit):
    got = published_limit(model)
    assert (got and got.max_batch) == limit or got is limit is None


def test_sources():
    assert efficiency_source("resnet50", 2000.0, measured=True).kind == "measured noise scale"
    assert efficiency_source("resnet50", batch_fixed=True).max_batch is None
