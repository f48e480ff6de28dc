"""Recipes say where every value comes from: provenance tags, sources, published results."""
import glob
import os

import pytest

from examples.imagenet.config import RECIPE_DIR, load_recipe, parse_config
from nnabla_torus.planning.machine_profile import PROFILE_DIR
from nnabla_torus.planning.provenance import load_tagged, parse_tags, require_tags, untagged

RECIPES = sorted(glob.glob(os.path.join(RECIPE_DIR, "*.yaml")))


def tagged(path):
    with open(path) as f:
        return load_tagged(f, path)


@pytest.mark.parametrize("path", RECIPES, ids=os.path.basename)
def test_every_recipe_value_is_tagged_and_published_ones_cite_a_source(path):
    values, tags = tagged(path)            # raises on a published tag without a known source
    assert untagged(tags) == [], f"{path}: values without a provenance tag"
    for key, tag in tags.items():
        if key.startswith("sources."):
            continue
        assert tag.kind in ("published", "derived", "assumed") and tag.note, key
        if tag.kind == "published":
            assert tag.sources and all(s in values["sources"] for s in tag.sources), key
    for name, citation in (values.get("sources") or {}).items():
        assert "arXiv:" in citation or "http" in citation, (name, citation)
    load_recipe(path)                      # and the training config still loads it


@pytest.mark.parametrize("path", RECIPES + glob.glob(os.path.join(PROFILE_DIR, "*.yaml")),
                         ids=os.path.basename)
def test_no_file_points_readers_outside_the_repository(path):
    text = open(path).read()
    assert "NOTES" not in text and "/work/" not in text


def test_sony_recipes_state_their_published_results_and_versions():
    v1, tags1 = tagged(os.path.join(RECIPE_DIR, "sony-224s.yaml"))
    v2, tags2 = tagged(os.path.join(RECIPE_DIR, "sony-122s.yaml"))
    assert v1["expected"] == {"time_s": 224, "top1": 0.7503, "gpus": 2176,
                              "scaling_efficiency": 0.9162, "scaling_gpus": 1088}
    assert v2["expected"] == {"time_s": 122}
    assert tags2["expected.time_s"].sources == ("v2",)
    # v1: batch-size control only; v2: and label smoothing. local_batch is derived.
    assert v1["label_smoothing"] == 0 and v2["label_smoothing"] > 0
    assert tags1["local_batch"].kind == "derived" and tags1["batch_schedule"].kind == "derived"
    assert tags1["warmup_epochs"].sources == tags1["type_config"].sources == ("infoq",)
    assert v1["batch_change_lr"] == "keep" and tags1["batch_change_lr"].kind == "assumed"
    for key in ("stride_on", "zero_init_last_gamma", "no_decay_bn_bias", "bn_statistics"):
        assert tags1[key].kind == "assumed", key
    cfg = parse_config(["-C", "sony-122s"])
    assert (cfg.label_smoothing, cfg.batch_change_lr, cfg.stride_on) == (0.1, "keep", "3x3")


def test_tag_parser_reads_kinds_sources_and_continuation_lines():
    lines = ["sources:", "  a: arXiv:1", "  b: https://x", "",
             "x: 1    # published [a, b]: the title", "        # and more",
             "y: 'p # q'  # derived: from x", "z: 3", "# a comment", "w: 4  # assumed"]
    tags = parse_tags(lines)
    assert tags["x"].sources == ("a", "b") and tags["x"].note == "the title and more"
    assert tags["y"].kind == "derived" and tags["z"] is None and tags["w"].kind == "assumed"
    assert untagged(tags) == ["z"]
    with pytest.raises(ValueError, match=r"z has no provenance tag.*# assumed: "):
        require_tags(tags, "t.yaml")


BAD_RECIPES = [
    ("epochs: 3   # published: the paper\n",
     r"epochs \(line 1\) is tagged published without a source; write '# published \[id\]: "),
    ("sources:\n  v1: arXiv:1811.05233v1\nepochs: 3  # published [v9]: x\n",
     r"epochs \(line 3\) cites unknown source\(s\) \['v9'\]; known: \['v1'\]; add them"),
    ("epoch: 3   # assumed: x\n",
     r"unknown key\(s\) \['epoch'\] \(did you mean epoch -> epochs\?\).*rename or remove"),
    ("batch_change_lr: double   # assumed: x\n", "batch_change_lr = 'double' is not one of"),
]


@pytest.mark.parametrize("text, message", BAD_RECIPES)
def test_bad_recipe_is_an_error_naming_the_key_and_the_fix(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        parse_config(["-C", str(path)])


def test_no_decay_bn_bias_off_puts_every_parameter_under_weight_decay():
    import sys
    import nnabla as nn
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
    import train
    from models import get_model
    nn.clear_parameters()
    with nn.parameter_scope("net"):
        get_model("resnet18", 10, width=0.125)(nn.Variable((1, 3, 16, 16)), test=False)
    params = nn.get_parameters()
    for flag, plain in (("1", True), ("0", False)):
        group = train.SolverGroup(parse_config(["--no-decay-bn-bias", flag]), params)
        sizes = {k: len(s.get_parameters()) for k, s in group.solvers.items()}
        assert sizes["decayed"] + sizes["plain"] == len(params)
        assert (sizes["plain"] > 0) == plain, sizes
    nn.clear_parameters()
