"""Every flag of examples/imagenet/train.py and of the benchmarks, with its bad values.

Each row: the flag's arguments and a fragment the error must contain (the value, the allowed
range or the choices). Errors come at parse time, before MPI or any work, as ValueError (train.py
config) or argparse's usage error (exit 2). Coverage tests check that every flag has a row.
"""
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "examples", "imagenet"))
import allreduce_bench  # noqa: E402
import make_imagenet_lists  # noqa: E402
import train_bench  # noqa: E402
from config import build_parser, flag_of, knob_fields, parse_config  # noqa: E402
from models import ARCHS  # noqa: E402

FILE = "@file"          # replaced by a path below an existing file: cannot be created

TRAIN = [
    (["-C", "nope"], "recipe 'nope' not found"),
    (["-C", "@bad.yaml"], ":2: not valid YAML"),
    (["--data-dir", "/no/such/folder"], "data_dir = '/no/such/folder' is not a folder"),
    (["--output-dir", FILE], "--output-dir = "),
    (["--arch", "vgg"], "invalid choice: 'vgg'"),
    (["--width", "0"], "width = 0.0 must be a finite number > 0"),
    (["--width", "nan"], "width = nan must be a finite number > 0"),
    (["--width", "inf"], "width = inf must be a finite number > 0"),
    (["--image-size", "0"], "image_size = 0 must be a finite number >= 1"),
    (["--min-crop-area", "0"], "min_crop_area = 0.0 must be a finite number in (0, 1]"),
    (["--min-crop-area", "1.5"], "in (0, 1]"),
    (["--flip", "maybe"], "argument --flip"),
    (["--train-images", "-1"], "train_images = -1 must be a finite number >= 0"),
    (["--bad-images", "ignore"], "invalid choice: 'ignore'"),
    (["--batch-schedule", "0:0"], "batch_schedule = '0:0'"),
    (["--batch-schedule", "x"], "batch_schedule = 'x'"),
    (["--local-batch", "0"], "local_batch = 0 must be a finite number >= 1"),
    (["--adaptive-batch", "maybe"], "argument --adaptive-batch"),
    (["--min-batch", "-1"], "min_batch = -1 must be a finite number >= 0"),
    (["--max-batch", "-1"], "max_batch = -1 must be a finite number >= 0"),
    (["--min-batch", "256", "--max-batch", "128"], "min_batch = 256 must be <= max_batch = 128"),
    (["--epochs", "0"], "epochs = 0.0 must be a finite number > 0"),
    (["--epochs", "-1"], "epochs = -1.0 must be a finite number > 0"),
    (["--epochs", "nan"], "epochs = nan must be a finite number > 0"),
    (["--optimizer", "adam"], "invalid choice: 'adam'"),
    (["--base-lr", "0"], "base_lr = 0.0 must be a finite number > 0"),
    (["--base-lr", "nan"], "base_lr = nan"),
    (["--reference-batch", "0"], "reference_batch = 0 must be a finite number >= 1"),
    (["--lr-scaling", "cube"], "invalid choice: 'cube'"),
    (["--warmup-epochs", "-1"], "warmup_epochs = -1.0 must be a finite number >= 0"),
    (["--warmup-epochs", "100"], "must be below epochs"),
    (["--lr-decay", "exp"], "invalid choice: 'exp'"),
    (["--milestones", "30,x"], "milestones = '30,x': expected comma-separated epochs"),
    (["--milestones", "60,30"], "strictly increasing"),
    (["--gamma", "0"], "gamma = 0.0 must be a finite number in (0, 1]"),
    (["--gamma", "2"], "in (0, 1]"),
    (["--power", "0"], "power = 0.0 must be a finite number > 0"),
    (["--momentum", "1"], "momentum = 1.0 must be a finite number in [0, 1)"),
    (["--momentum", "-0.1"], "in [0, 1)"),
    (["--weight-decay", "-1"], "weight_decay = -1.0 must be a finite number >= 0"),
    (["--lars-coefficient", "-1"], "lars_coefficient = -1.0 must be a finite number >= 0"),
    (["--label-smoothing", "1"], "label_smoothing = 1.0 must be a finite number in [0, 1)"),
    (["--context", "gpu"], "invalid choice: 'gpu'"),
    (["--type-config", "double"], "invalid choice: 'double'"),
    (["--loss-scale", "0"], "loss_scale = 0.0 must be a finite number > 0"),
    (["--seed", "-1"], "seed = -1 must be a finite number in [0, 4294967295]"),
    (["--algorithm", "tree"], "invalid choice: 'tree'"),
    (["--grid", "2y2"], "grid = '2y2'"),
    (["--plan", "maybe"], "invalid choice: 'maybe'"),
    (["--profile", "nope"], "no profile file or shipped profile 'nope'"),
    (["--overlap", "maybe"], "argument --overlap"),
    (["--bucket-mib", "0"], "bucket_mib = 0.0 must be a finite number > 0"),
    (["--checkpoint-every", "-1"], "checkpoint_every = -1 must be a finite number >= 0"),
    (["--resume", "maybe"], "argument --resume"),
    (["--max-steps", "-1"], "max_steps = -1 must be a finite number >= 0"),
    (["--progress", "maybe"], "argument --progress"),
    (["--log-every", "-1"], "log_every = -1 must be a finite number >= 0"),
]

ALLREDUCE_BENCH = [
    (["--sizes", "12Q"], "--sizes: size '12Q' is not a number with K/M/G suffix"),
    (["--sizes", "-1"], "--sizes: size -1 must be >= 4 bytes (one float32)"),
    (["--sizes", "2"], "size 2 must be >= 4 bytes"),
    (["--sizes", "inf"], "is not a number"),
    (["--sizes", ","], "size 0 must be >= 4 bytes"),
    (["--algorithms", "torus"], "--algorithms: unknown ['torus']"),
    (["--grids", "2y"], "--grids: grid '2y'"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--iters", "0"], "--iters = 0 must be a finite number >= 1"),
    (["--rounds", "0"], "--rounds = 0 must be a finite number >= 1"),
    (["--warmup", "-1"], "--warmup = -1 must be a finite number >= 0"),
    (["--json", FILE], "--json = "),
]

TRAIN_BENCH = [
    (["--arch", "vgg"], "invalid choice: 'vgg'"),
    (["--width", "0"], "--width = 0.0 must be a finite number > 0"),
    (["--width", "nan"], "--width = nan"),
    (["--image-size", "0"], "--image-size = 0 must be a finite number >= 1"),
    (["--classes", "0"], "--classes = 0 must be a finite number >= 1"),
    (["--batch", "0"], "--batch = 0 must be a finite number >= 1"),
    (["--iters", "0"], "--iters = 0 must be a finite number >= 1"),
    (["--warmup", "-1"], "--warmup = -1 must be a finite number >= 0"),
    (["--bucket-mib", "inf"], "--bucket-mib = inf must be a finite number > 0"),
    (["--overlap", "2"], "invalid choice: '2'"),
    (["--json", FILE], "--json = "),
    (["--scaling", "1,x"], "--scaling '1,x' must be comma-separated rank counts"),
    (["--scaling", "0,2"], "every rank count must be >= 1"),
]

LISTS = [
    (["--train-dir", "@train", "--workers", "0"], "--workers = 0 must be a finite number >= 1"),
    (["--train-dir", "@train", "--verify", "maybe"], "argument --verify"),
    (["--train-dir", "@train", "--out-dir", FILE], "--out-dir = "),
    (["--train-dir", "/no/such/train"], "--train-dir /no/such/train does not exist"),
    (["--train-dir", "@train", "--val-dir", "/no/val"], "--val-dir /no/val does not exist"),
    (["--train-dir", "@train", "--val-map", "/no/map.txt"], "--val-map /no/map.txt does not exist"),
    ([], "--train-dir (or NNABLA_TORUS_TRAIN_DIR) is required"),
]


@pytest.fixture
def paths(tmp_path):
    """Substitutions for the placeholders of the tables."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "bad.yaml").write_text("epochs: 3\n  base_lr: 0.1\n")   # indented
    (tmp_path / "train" / "n01").mkdir(parents=True)
    return {FILE: str(tmp_path / "a-file" / "out"), "@bad.yaml": str(tmp_path / "bad.yaml"),
            "@train": str(tmp_path / "train")}


def error_of(parse, argv, capsys):
    """The message ``parse(argv)`` fails with: ValueError's text or argparse's stderr."""
    try:
        parse(argv)
    except ValueError as e:
        return str(e)
    except SystemExit as e:
        assert e.code not in (0, None), argv
        return e.code if isinstance(e.code, str) else capsys.readouterr().err
    pytest.fail(f"{argv} was accepted")


@pytest.mark.parametrize("parse,argv,fragment",
                         [(parse_config, *row) for row in TRAIN] +
                         [(allreduce_bench.parse_args, *row) for row in ALLREDUCE_BENCH] +
                         [(train_bench.parse_args, *row) for row in TRAIN_BENCH] +
                         [(make_imagenet_lists.main, *row) for row in LISTS],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_flag_is_refused_with_a_message(parse, argv, fragment, paths, capsys, monkeypatch):
    monkeypatch.delenv("NNABLA_TORUS_RECIPE", raising=False)
    argv = [paths.get(a, a) for a in argv]
    message = error_of(parse, argv, capsys)
    assert fragment in message, message
    assert "Traceback" not in message


@pytest.mark.parametrize("env,value,fragment", [
    ("NNABLA_TORUS_BUCKET_MIB", "nan", r"bucket_mib = nan .*NNABLA_TORUS_BUCKET_MIB"),
    ("NNABLA_TORUS_LOCAL_BATCH", "many", "NNABLA_TORUS_LOCAL_BATCH='many'"),
    ("NNABLA_TORUS_BAD_IMAGES", "ignore", "NNABLA_TORUS_BAD_IMAGES='ignore'"),
])
def test_bad_environment_twin_is_named(env, value, fragment, monkeypatch):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=fragment):
        parse_config([])


def test_bad_recipe_value_names_the_recipe_key(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("epochs: -3\n")
    with pytest.raises(ValueError, match=r"epochs = -3.0 must be a finite number > 0 .*recipe key"):
        parse_config(["-C", str(path)])


def flags_of(parser):
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}


@pytest.mark.parametrize("parser,table", [
    (build_parser(), TRAIN), (allreduce_bench.build_parser(), ALLREDUCE_BENCH),
    (train_bench.build_parser(), TRAIN_BENCH), (make_imagenet_lists.build_parser(), LISTS)])
def test_every_flag_has_a_bad_value_row(parser, table):
    covered = {a for argv, _ in table for a in argv if a.startswith("-")} | {"--recipe"}
    assert flags_of(parser) - covered == set()


def test_every_numeric_knob_has_a_range_and_arch_choices_match_the_models():
    from config import CHOICES, RANGES
    numeric = {f.name for f in knob_fields() if f.type in (int, float)}
    assert numeric == set(RANGES), numeric ^ set(RANGES)
    assert set(CHOICES["arch"]) == set(ARCHS)
    assert all(flag_of(name) in {a for argv, _ in TRAIN for a in argv} for name in RANGES)


def test_json_summary_values_are_strict_json():
    import json
    import train
    summary = train.strict_json({"val_top1": train.json_value(float("nan")), "speedup": float("inf"),
                                 "plan": {"times": [1.5, float("-inf")]}, "steps": 3})
    assert json.dumps(summary) == ('{"val_top1": null, "speedup": null, "plan": {"times": '
                                   '[1.5, null]}, "steps": 3}')
    assert train.json_value(None) is None and train.json_value(0.123456) == 0.1235
