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
import gpu_check  # noqa: E402
import make_imagenet_lists  # noqa: E402
import restart_cost  # noqa: E402
import train_bench  # noqa: E402
from tools.research import per_array_bench  # noqa: E402
from config import build_parser, flag_of, knob_fields, parse_config  # noqa: E402
from models import ARCHS  # noqa: E402

FILE = "@file"          # replaced by a path below an existing file: cannot be created

TRAIN = [
    (["-C", "nope"], "recipe 'nope' not found"),
    (["-C", "@bad.yaml"], ":2: not valid YAML"),
    (["--data-dir", "/no/such/folder"], "data_dir = '/no/such/folder' is not a folder"),
    # the layout is checked at parse, before the config dump (before: train.txt required,
    # a FileNotFoundError after 50 lines of config)
    (["--data-dir", "@empty-root"], "--data-dir @empty-root has no train/ folder; expected class "
                                    "folders @empty-root/train/<class>/*.JPEG, or images under "
                                    "@empty-root/train named with their labels in "
                                    "@empty-root/train.txt"),
    (["--data-dir", "@ok-root"], "--data-dir @ok-root: @ok-root/val has no class folders and "
                                 "@ok-root/val.txt does not exist"),
    (["--init-params", "/no/such/model.h5"], "init_params = '/no/such/model.h5' is not a file"),
    (["--batch-prior", "/no/such/prior.json"], "batch_prior = '/no/such/prior.json' is not a file"),
    (["--efficiency-fit", "/no/such/fit.json"], "efficiency fit '/no/such/fit.json' is "
                                                "unreadable ([Errno 2] No such file"),
    (["--output-dir", FILE], "--output-dir = "),
    (["--arch", "vgg"], "invalid choice: 'vgg'"),
    (["--width", "0"], "argument --width: must be a finite number > 0, got '0'"),
    (["--width", "nan"], "must be a finite number > 0, got 'nan'"),
    (["--width", "inf"], "must be a finite number > 0, got 'inf'"),
    (["--image-size", "0"], "argument --image-size: must be an integer >= 1, got '0'"),
    (["--min-crop-area", "0"], "must be a finite number > 0 and <= 1, got '0'"),
    (["--min-crop-area", "1.5"], "> 0 and <= 1, got '1.5'"),
    (["--flip", "maybe"], "argument --flip"),
    (["--dataset", "cifar"], "invalid choice: 'cifar'"),
    (["--val-crop", "0"], "must be a finite number > 0 and <= 1, got '0'"),
    (["--val-crop", "1.5"], "> 0 and <= 1, got '1.5'"),
    (["--train-images", "-1"], "argument --train-images: must be an integer >= 0"),
    (["--bad-images", "ignore"], "invalid choice: 'ignore'"),
    (["--batch-schedule", "0:0"], "batch_schedule = '0:0'"),
    (["--batch-schedule", "x"], "batch_schedule = 'x'"),
    (["--local-batch", "0"], "argument --local-batch: must be an integer >= 1, got '0'"),
    (["--adaptive-batch", "maybe"], "argument --adaptive-batch"),
    (["--min-batch", "-1"], "argument --min-batch: must be an integer >= 0"),
    (["--max-batch", "-1"], "argument --max-batch: must be an integer >= 0"),
    (["--min-batch", "256", "--max-batch", "128"], "min_batch = 256 must be <= max_batch = 128"),
    (["--epochs", "0"], "argument --epochs: must be a finite number > 0 and <= 1e+06, got '0'"),
    (["--epochs", "-1"], "must be a finite number > 0 and <= 1e+06, got '-1'"),
    (["--epochs", "nan"], "must be a finite number > 0 and <= 1e+06, got 'nan'"),
    (["--epochs", "1e308"], "argument --epochs: must be a finite number > 0 and <= 1e+06, got "
                            "'1e308'"),          # before: OverflowError (int(inf) steps)
    (["--optimizer", "adam"], "invalid choice: 'adam'"),
    (["--base-lr", "0"], "argument --base-lr: must be a finite number > 0"),
    (["--base-lr", "nan"], "got 'nan'"),
    (["--reference-batch", "0"], "argument --reference-batch: must be an integer >= 1"),
    (["--lr-scaling", "cube"], "invalid choice: 'cube'"),
    (["--batch-change-lr", "double"], "invalid choice: 'double'"),
    (["--adaptive-lr", "sqrt"], "invalid choice: 'sqrt'"),
    (["--warmup-epochs", "-1"], "argument --warmup-epochs: must be a finite number >= 0"),
    (["--warmup-epochs", "100"], "must be below epochs"),
    (["--lr-decay", "exp"], "invalid choice: 'exp'"),
    (["--milestones", "30,x"], "milestones = '30,x': expected comma-separated epochs"),
    (["--milestones", "60,30"], "strictly increasing"),
    (["--milestones", "30,-5"], "must be a finite number >= 0, got -5.0"),
    (["--gamma", "0"], "argument --gamma: must be a finite number > 0 and <= 1"),
    (["--gamma", "2"], "> 0 and <= 1, got '2'"),
    (["--power", "0"], "argument --power: must be a finite number > 0"),
    (["--momentum", "1"], "argument --momentum: must be a finite number >= 0 and < 1, got '1'"),
    (["--momentum", "-0.1"], ">= 0 and < 1, got '-0.1'"),
    (["--weight-decay", "-1"], "argument --weight-decay: must be a finite number >= 0"),
    (["--lars-coefficient", "-1"], "argument --lars-coefficient: must be a finite number >= 0"),
    (["--label-smoothing", "1"],
     "argument --label-smoothing: must be a finite number >= 0 and < 1"),
    (["--no-decay-bn-bias", "maybe"], "argument --no-decay-bn-bias"),
    (["--stride-on", "2x2"], "invalid choice: '2x2'"),
    (["--zero-init-last-gamma", "maybe"], "argument --zero-init-last-gamma"),
    (["--allow-tf32", "maybe"], "argument --allow-tf32"),
    (["--bind-gpu-numa", "maybe"], "argument --bind-gpu-numa"),
    (["--adaptive-min-samples", "-3"], "argument --adaptive-min-samples: must be an integer >= 2"),
    (["--adaptive-max-rse", "0"], "argument --adaptive-max-rse: must be a finite number > 0"),
    (["--adaptive-refit-steps", "-1"], "argument --adaptive-refit-steps: must be an integer >= 0"),
    (["--adaptive-refit-warmup", "1.5"], "argument --adaptive-refit-warmup: must be an integer"),
    (["--adaptive-shrink", "maybe"], "argument --adaptive-shrink"),
    (["--bn-statistics", "global"], "invalid choice: 'global'"),
    (["--context", "gpu"], "invalid choice: 'gpu'"),
    (["--type-config", "double"], "invalid choice: 'double'"),
    (["--loss-scale", "0"], "argument --loss-scale: must be a finite number > 0"),
    (["--seed", "-1"], "argument --seed: must be an integer >= 0 and <= 2147483647"),
    # nn.seed takes a C int (before: accepted up to 2**32 - 1, then OverflowError)
    (["--seed", "2147483648"], "argument --seed: must be an integer >= 0 and <= 2147483647, "
                               "got '2147483648'"),
    (["--algorithm", "tree"], "invalid choice: 'tree'"),
    (["--grid", "2y2"], "grid = '2y2'"),
    (["--plan", "maybe"], "invalid choice: 'maybe'"),
    (["--profile", "nope"], "no profile file or shipped profile 'nope'"),
    (["--hosts", "-1"], "argument --hosts: must be an integer >= 0 and <= 16384, got '-1'"),
    (["--gpus-per-host", "2.5"], "argument --gpus-per-host: must be an integer >= 0"),
    (["--inter-bandwidth", "-3"], "argument --inter-bandwidth: must be a finite number >= 0"),
    (["--gpu-model", "p100"], "invalid choice: 'p100'"),
    # A folder or malformed YAML is a message (before: IsADirectoryError / a YAML traceback).
    (["--profile", "@train"], "profile '@train': cannot read @train: Is a directory; give a "
                              "profile file (YAML or JSON) or a shipped name"),
    (["--profile", "@bad.yaml"], "profile '@bad.yaml': cannot read @bad.yaml: mapping values "
                                 "are not allowed here"),
    (["--overlap", "maybe"], "argument --overlap"),
    (["--bucket-mib", "0"], "argument --bucket-mib: must be a finite number > 0"),
    (["--bucket-mib", "1e308"], "argument --bucket-mib: must be a finite number > 0 and <= "
                                "1e+06, got '1e308'"),   # before: OverflowError
    (["--checkpoint-every", "-1"], "argument --checkpoint-every: must be an integer >= 0"),
    (["--val-every", "0"], "argument --val-every: must be a finite number > 0 and <= 1e+06, "
                           "got '0'"),
    (["--max-nonfinite-steps", "-1"], "argument --max-nonfinite-steps: must be an integer >= 0, "
                                      "got '-1'"),
    (["--resume", "maybe"], "argument --resume"),
    (["--elastic", "maybe"], "argument --elastic"),
    (["--max-steps", "-1"], "argument --max-steps: must be an integer >= 0"),
    (["--progress", "maybe"], "argument --progress"),
    (["--log-every", "-1"], "argument --log-every: must be an integer >= 0"),
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
    (["--iters", "0"], "argument --iters: must be an integer >= 1, got '0'"),
    (["--rounds", "0"], "argument --rounds: must be an integer >= 1, got '0'"),
    (["--warmup", "-1"], "argument --warmup: must be an integer >= 0, got '-1'"),
    (["--check-cost", "maybe"], "argument --check-cost: expected one of 1/0, true/false, "
                                "yes/no, on/off, got 'maybe'"),
    (["--json", FILE], "--json = "),
    (["--arrays", "0"], "argument --arrays: must be an integer >= 1, got '0'"),
    (["--sizes", "8", "--arrays", "3"], "size 8 must be >= 12 bytes (one float32 in each of "
                                        "--arrays 3)"),
    (["--inplace", "2"], "argument --inplace: expected one of 1/0"),
]

TRAIN_BENCH = [
    (["--arch", "vgg"], "invalid choice: 'vgg'"),
    (["--width", "0"], "argument --width: must be a finite number > 0, got '0'"),
    (["--width", "nan"], "got 'nan'"),
    (["--image-size", "0"], "argument --image-size: must be an integer >= 1"),
    (["--classes", "0"], "argument --classes: must be an integer >= 1"),
    (["--batch", "0"], "argument --batch: must be an integer >= 1"),
    (["--iters", "0"], "argument --iters: must be an integer >= 1, got '0'"),
    (["--warmup", "-1"], "argument --warmup: must be an integer >= 0, got '-1'"),
    (["--bucket-mib", "inf"], "argument --bucket-mib: must be a finite number > 0, got 'inf'"),
    (["--overlap", "2"], "invalid choice: '2'"),
    (["--context", "gpu"], "invalid choice: 'gpu'"),
    (["--type-config", "double"], "invalid choice: 'double'"),
    (["--json", FILE], "--json = "),
    (["--scaling", "1,x"], "--scaling: must be an integer >= 1 (rank counts, e.g. 1,2,4), got 'x'"),
    (["--scaling", "0,2"], "--scaling: must be an integer >= 1 (rank counts, e.g. 1,2,4), got '0'"),
]

PER_ARRAY_BENCH = [       # before: ValueError tracebacks (abc) or a "0 arrays" row (0)
    (["--arrays", "0"], "argument --arrays: must be an integer >= 1 (list lengths, e.g. "
                        "1,161,1000), got '0'"),
    (["--arrays", "abc"], "argument --arrays: must be an integer >= 1 (list lengths, e.g. "
                          "1,161,1000), got 'abc'"),
    (["--arrays", ","], "argument --arrays: expected list lengths, e.g. 1,161,1000, got ','"),
    (["--inplace", "2"], "argument --inplace: expected one of 1/0"),
    (["--repeats", "0"], "argument --repeats: must be an integer >= 1, got '0'"),
]

RESTART_COST = [          # before: --repeat 0 a statistics traceback, --ranks 0 "measured"
    (["--repeat", "0"], "argument --repeat: must be an integer >= 1, got '0'"),
    (["--ranks", "0"], "argument --ranks: must be an integer >= 1, got '0'"),
    (["--arch", "vgg"], "invalid choice: 'vgg'"),
    (["--width", "0"], "argument --width: must be a finite number > 0, got '0'"),
    (["--image-size", "0"], "argument --image-size: must be an integer >= 1, got '0'"),
    (["--local-batch", "0"], "argument --local-batch: must be an integer >= 1, got '0'"),
    (["--json", "/nonexistent/x.json"], "argument --json: cannot write '/nonexistent/x.json': "
                                        "give a file path in an existing writable folder"),
]

GPU_CHECK = [             # before: every check ran, then the results were lost
    (["--json", "/nonexistent/x.json"], "argument --json: cannot write '/nonexistent/x.json': "
                                        "give a file path in an existing writable folder"),
    (["--dry-run", "--gpus", "0"], "argument --gpus: must be an integer >= 1"),
]

LISTS = [
    (["--train-dir", "@train", "--workers", "0"], "argument --workers: must be an integer >= 1"),
    (["--train-dir", "@train", "--verify", "maybe"], "argument --verify"),
    (["--train-dir", "@train", "--out-dir", FILE], "--out-dir = "),
    (["--train-dir", "/no/such/train"], "--train-dir /no/such/train does not exist"),
    (["--train-dir", "@train", "--val-dir", "/no/val"], "--val-dir /no/val does not exist"),
    (["--train-dir", "@train", "--val-map", "/no/map.txt"], "--val-map /no/map.txt does not exist"),
    ([], "--train-dir (or NNABLA_TORUS_TRAIN_DIR) is required"),
    # Messages, not tracebacks (before: FileNotFoundError tracebacks).
    (["--train-dir", "@train"], "error: class folder @train/n01 holds no images (.jpeg, .jpg, "
                                ".png); remove it or add its images"),
    (["--train-dir", "@train-ok", "--val-dir", "@flat-val"], "error: validation folder "
                                                             "@flat-val has no class folders; "
                                                             "pass --val-map"),
]


@pytest.fixture
def paths(tmp_path):
    """Substitutions for the placeholders of the tables."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "bad.yaml").write_text("epochs: 3\n  base_lr: 0.1\n")   # indented
    (tmp_path / "train" / "n01").mkdir(parents=True)     # an empty class folder
    (tmp_path / "ok" / "train" / "n01").mkdir(parents=True)
    (tmp_path / "ok" / "train" / "n01" / "a.JPEG").write_bytes(b"x")
    (tmp_path / "ok" / "val").mkdir()                     # flat: images, no class folders
    (tmp_path / "ok" / "val" / "v1.JPEG").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    return {FILE: str(tmp_path / "a-file" / "out"), "@bad.yaml": str(tmp_path / "bad.yaml"),
            "@train": str(tmp_path / "train"), "@train-ok": str(tmp_path / "ok" / "train"),
            "@flat-val": str(tmp_path / "ok" / "val"), "@ok-root": str(tmp_path / "ok"),
            "@empty-root": str(tmp_path / "empty")}


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
                         [(make_imagenet_lists.main, *row) for row in LISTS] +
                         [(per_array_bench.parse_args, *row) for row in PER_ARRAY_BENCH] +
                         [(restart_cost.parse_args, *row) for row in RESTART_COST] +
                         [(gpu_check.build_parser().parse_args, *row) for row in GPU_CHECK],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_flag_is_refused_with_a_message(parse, argv, fragment, paths, capsys, monkeypatch):
    monkeypatch.delenv("NNABLA_TORUS_RECIPE", raising=False)
    argv = [paths.get(a, a) for a in argv]
    for placeholder, path in paths.items():              # messages name the real paths
        fragment = fragment.replace(placeholder, path)
    message = error_of(parse, argv, capsys)
    assert fragment in message, message
    assert "Traceback" not in message


def test_the_list_tool_and_the_loader_agree_on_names_with_spaces(tmp_path):
    """Before: the tool wrote "n01/a b.JPEG 0" and read_list (split(), 2 fields) refused it."""
    from PIL import Image
    from image_lists import read_list
    (tmp_path / "train" / "n01").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "train" / "n01" / "a b.JPEG")
    make_imagenet_lists.main(["--train-dir", str(tmp_path / "train")])
    files, labels, _ = read_list(str(tmp_path / "train.txt"), str(tmp_path / "train"))
    assert files == [str(tmp_path / "train" / "n01" / "a b.JPEG")] and labels == [0]


@pytest.mark.parametrize("env,value,fragment", [
    ("NNABLA_TORUS_BUCKET_MIB", "nan",
     r"NNABLA_TORUS_BUCKET_MIB='nan' .*must be a finite number > 0"),
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
    with pytest.raises(ValueError, match=r"epochs must be a finite number > 0 and <= 1e\+06, "
                                         r"got -3.0 .*recipe key"):
        parse_config(["-C", str(path)])


def flags_of(parser):
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}


@pytest.mark.parametrize("parser,table", [
    (build_parser(), TRAIN), (allreduce_bench.build_parser(), ALLREDUCE_BENCH),
    (train_bench.build_parser(), TRAIN_BENCH), (make_imagenet_lists.build_parser(), LISTS),
    (per_array_bench.build_parser(), PER_ARRAY_BENCH), (restart_cost.build_parser(), RESTART_COST),
    (gpu_check.build_parser(), GPU_CHECK)])
def test_every_flag_has_a_bad_value_row(parser, table):
    # --recipe is -C's long name; --no-install is a switch without a value
    covered = {a for argv, _ in table for a in argv if a.startswith("-")} | {"--recipe",
                                                                              "--no-install"}
    assert flags_of(parser) - covered == set()


def test_every_numeric_knob_has_a_range_and_arch_choices_match_the_models():
    from config import CHOICES, RANGES
    numeric = {f.name for f in knob_fields() if f.type in (int, float)}
    assert numeric == set(RANGES), numeric ^ set(RANGES)
    assert set(CHOICES["arch"]) == set(ARCHS)
    assert all(flag_of(name) in {a for argv, _ in TRAIN for a in argv} for name in RANGES)


def test_json_summary_values_are_strict_json():
    import json
    import report
    summary = report.strict_json({"val_top1": report.json_value(float("nan")),
                                  "speedup": float("inf"),
                                  "plan": {"times": [1.5, float("-inf")]}, "steps": 3})
    assert json.dumps(summary) == ('{"val_top1": null, "speedup": null, "plan": {"times": '
                                   '[1.5, null]}, "steps": 3}')
    assert report.json_value(None) is None and report.json_value(0.123456) == 0.1235


def test_a_cuda_context_without_the_cuda_extension_is_one_line():
    """Checked before the context is made (a recipe may name cudnn on any machine). Before:
    ModuleNotFoundError: No module named 'nnabla_ext.cudnn' (a traceback)."""
    import importlib.util
    from config import check_context
    try:
        if importlib.util.find_spec("nnabla_ext.cudnn") is not None:
            pytest.skip("nnabla-ext-cuda is installed here")
    except ModuleNotFoundError:
        pass
    with pytest.raises(ValueError, match=r"context = 'cudnn' needs nnabla-ext-cuda, which is not "
                                         r"installed; install it \(pip install -e '.\[gpu\]'"):
        check_context("cudnn")


def test_the_nccl_backend_on_a_cpu_context_is_one_line(monkeypatch):
    """Before: a RuntimeError traceback from the backend, after the config dump."""
    from config import check_context
    monkeypatch.setenv("NNABLA_TORUS_BACKEND", "nccl")
    with pytest.raises(ValueError, match=r"NNABLA_TORUS_BACKEND=nccl needs a CUDA context, got "
                                         r"--context cpu; unset NNABLA_TORUS_BACKEND"):
        check_context("cpu")


def test_a_usage_error_is_one_line(capsys):
    """Before: argparse's usage, 40 lines listing every flag, then the error."""
    with pytest.raises(SystemExit):
        parse_config(["--seed", "x"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: argument --seed:" in err and "--help" in err, err


def parameter_files(folder):
    """{name: (path, fragment)}: parameter files nnabla cannot read, and what the error says."""
    import h5py
    import numpy as np
    import nnabla as nn
    nn.clear_parameters()
    nn.parameter.get_parameter_or_create("w", (2, 3))
    good = folder / "good.h5"
    nn.save_parameters(str(good))
    nn.clear_parameters()
    files = {"garbage.h5": b"not hdf5" * 8, "truncated.h5": good.read_bytes()[:200],
             "truncated.nnp": b"PK\x03\x04" + b"x" * 40, "bad.protobuf": b"\xff\xfe garbage",
             "weights.pt": b"x"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    with h5py.File(folder / "plain.hdf5", "w") as f:      # HDF5, not nnabla's parameters
        f["x"] = np.zeros(3)
    return {
        "garbage.h5": "is not a readable .h5 parameter file (OSError: Unable to synchronously "
                      "open file (file signature not found)); give a model.h5 or model.nnp",
        "truncated.h5": "is not a readable .h5 parameter file (OSError: ",
        "truncated.nnp": "is not a readable .nnp parameter file (BadZipFile: File is not a zip "
                         "file)",
        "bad.protobuf": "is not a readable .protobuf parameter file (DecodeError: Error parsing "
                        "message with type 'NNablaProtoBuf')",
        "plain.hdf5": "is not a readable .hdf5 parameter file (KeyError: ",
        "weights.pt": "nnabla reads parameters from .h5 (.hdf5), .protobuf or .nnp files, not "
                      ".pt; give one of those",
    }


def test_init_params_that_nnabla_cannot_read_are_one_line(tmp_path):
    """Before: OSError, BadZipFile, DecodeError tracebacks; an HDF5 file named .hdf5 was
    skipped by nnabla ("missing conv1/conv/W ... and 97 more")."""
    import nnabla as nn
    from models.files import read_parameter_file
    for name, fragment in parameter_files(tmp_path).items():
        with pytest.raises(ValueError) as error:
            read_parameter_file(str(tmp_path / name))
        assert str(error.value).startswith(f"--init-params {tmp_path / name}"), error.value
        assert fragment in str(error.value) and "\n" not in str(error.value), str(error.value)
    (tmp_path / "good.hdf5").write_bytes((tmp_path / "good.h5").read_bytes())
    read_parameter_file(str(tmp_path / "good.hdf5"))       # nnabla's HDF5 under .hdf5: read
    assert list(nn.get_parameters(grad_only=False)) == ["w"]
    nn.clear_parameters()


def test_an_error_every_rank_meets_after_mpi_starts_is_printed_once(tmp_path):
    """--init-params is read after MPI starts, by every rank: rank 0 prints the line and its
    MPI_Abort ends the others during their wait (before: the same line from each of 3 ranks)."""
    from tests.examples.test_train_plan import TRAIN
    from tests.mpirun import run_mpi
    (tmp_path / "garbage.h5").write_bytes(b"not hdf5" * 8)
    out = run_mpi(3, [TRAIN, "--init-params", str(tmp_path / "garbage.h5"), "--epochs", "2",
                      "--progress", "0", "--output-dir", str(tmp_path / "run")],
                  timeout=120, check=False).replace("\0", "")   # mpirun's output may hold NULs
    lines = [line for line in out.splitlines() if "is not a readable .h5 parameter file" in line]
    assert len(lines) == 1 and lines[0].startswith("rank 0 on host "), out
    assert "Traceback" not in out, out
