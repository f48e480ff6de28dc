"""One typed configuration for examples/imagenet/train.py: defaults, recipe file, env, CLI.

Every field of ``TrainConfig`` is a CLI flag (``--base-lr``), an environment variable
(``NNABLA_TORUS_BASE_LR``) and a recipe key (``base_lr``). Precedence, highest first:
command line > recipe file (``-C``) > environment > the default written below. Example::

    cfg = parse_config(["-C", "sony-224s", "--epochs", "2"])
    cfg.batch_schedule        # "0:34816,5:69632" from the recipe
    cfg.source["epochs"]      # "cli"
"""
import argparse
import dataclasses
import difflib
import importlib.util
import os

from image_lists import split_source
from nnabla_torus.comm import failfast
from nnabla_torus.comm.collectives import ALGORITHMS
from nnabla_torus.comm.settings import KNOBS
from nnabla_torus.planning import step_refit
from nnabla_torus.planning.controller import (ADAPTIVE_LRS, LR_AT_CHANGE, LR_SCALINGS, MAX_RSE,
                                             MIN_SAMPLES, BatchSizeController)
from nnabla_torus.knobs import add_knob, check_output_path, env_value, number
from nnabla_torus.planning.machine_profile import GPU_PROFILES, Shape, load_profile
from nnabla_torus.planning.recipe_files import RECIPE_DIR, read_recipe
from nnabla_torus.planning.schedules import DECAYS, BatchSchedule, LearningRateSchedule
from nnabla_torus.comm.topology import parse_grid

BACKEND_ENV = KNOBS["backend"].env    # the communicator's backend variable
DEFAULT_RECIPE = "digits-cpu"        # used when neither -C nor --data-dir is given
DEFAULT_DATA_RECIPE = "resnet50-90ep"  # used with --data-dir and no -C
# recipe blocks that are not knobs: citations of the provenance tags, the published results
RECIPE_META_KEYS = ("sources", "expected")

CHOICES = {
    "arch": ("resnet18", "resnet34", "resnet50"),      # models.ARCHS
    "optimizer": ("momentum", "lars"),
    "lr_decay": DECAYS,
    "lr_scaling": LR_SCALINGS,
    "type_config": ("float", "half"),
    "context": ("cpu", "cudnn"),
    "algorithm": ("planned", *ALGORITHMS),
    "plan": ("on", "off"),
    "bad_images": ("skip", "stop"),
    "batch_change_lr": LR_AT_CHANGE,
    "adaptive_lr": ADAPTIVE_LRS,
    "stride_on": ("3x3", "1x1"),
    "bn_statistics": ("per_gpu",),
    "gpu_model": ("", *GPU_PROFILES),
}
# Old spellings still accepted (flag, variable, recipe), each logged once with its new name:
# "auto" was the example's name for the planner's choice, which the communicator's own
# algorithm "auto" (a per-message-size table) made ambiguous.
RENAMED_VALUES = {"algorithm": {"auto": "planned"}, "plan": {"auto": "on"}}
MAX_EPOCHS = 1e6        # passes over the data: far beyond any recipe, below int overflow
MAX_BUCKET_MIB = 1e6    # one all-reduce bucket, MiB (1 TB: more than any model's gradients)
# Allowed range of every numeric knob: a parser for the flag, the variable and the recipe value.
POSITIVE, FRACTION = dict(low=0, strict=True), dict(low=0, high=1, strict_high=True)
RANGES = {
    "width": number(float, **POSITIVE), "image_size": number(int, low=1),
    "min_crop_area": number(float, low=0, strict=True, high=1),
    "train_images": number(int, low=0), "local_batch": number(int, low=1),
    "min_batch": number(int, low=0), "max_batch": number(int, low=0),
    "adaptive_min_samples": number(int, low=2), "adaptive_max_rse": number(float, **POSITIVE),
    "adaptive_refit_steps": number(int, low=0), "adaptive_refit_warmup": number(int, low=0),
    "epochs": number(float, low=0, strict=True, high=MAX_EPOCHS), "base_lr": number(float, **POSITIVE),
    "reference_batch": number(int, low=1), "warmup_epochs": number(float, low=0),
    "gamma": number(float, low=0, strict=True, high=1), "power": number(float, **POSITIVE),
    "momentum": number(float, **FRACTION), "weight_decay": number(float, low=0),
    "lars_coefficient": number(float, low=0), "label_smoothing": number(float, **FRACTION),
    # nn.seed takes a C int (OverflowError from 2**31); more epochs or a bigger bucket than
    # these overflow the step and byte counts (int(inf)) long before anything trains
    "loss_scale": number(float, **POSITIVE), "seed": number(int, low=0, high=2 ** 31 - 1),
    "bucket_mib": number(float, low=0, strict=True, high=MAX_BUCKET_MIB),
    "checkpoint_every": number(int, low=0), "max_nonfinite_steps": number(int, low=0),
    "max_steps": number(int, low=0), "log_every": number(int, low=0),
    "hosts": number(int, low=0), "gpus_per_host": number(int, low=0),
    "inter_bandwidth": number(float, low=0),
}


def knob(default, help):
    """A dataclass field with its help text (shown by --help and in the config log)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    """All knobs of one training run; units in the comments."""
    # data and model
    data_dir: str = knob("", "root of an ImageNet layout: train/ and val/ of class folders, or "
                             "with train.txt and val.txt lists; empty = the embedded digits data")
    output_dir: str = knob("runs/imagenet", "folder for monitors, the plot and checkpoints")
    arch: str = knob("resnet50", "network: resnet18 | resnet34 | resnet50")
    width: float = knob(1.0, "channel width multiplier")
    image_size: int = knob(224, "training crop and validation centre crop, pixels")
    min_crop_area: float = knob(0.08, "smallest area fraction of the random-resized training crop")
    flip: bool = knob(True, "random horizontal flips in training (off for digits and text)")
    train_images: int = knob(0, "use only N training images, a subset drawn with --seed (0 = all)")
    bad_images: str = knob("skip", "undecodable images: skip (leave them out, count and name "
                                   "them each epoch) | stop (end the job naming the file)")
    # global batch and its control
    batch_schedule: str = knob("0:256", "global batch per epoch range, epoch:images,... (images per step)")
    local_batch: int = knob(32, "at most this many images per rank per forward/backward")
    adaptive_batch: bool = knob(False, "choose the global batch by goodput (cost-model "
                                       "throughput x statistical efficiency from the measured "
                                       "noise scale) instead of the schedule")
    adaptive_min_samples: int = knob(MIN_SAMPLES, "adaptive mode: noise-scale observations "
                                                  "(steps) before the first decision")
    adaptive_max_rse: float = knob(MAX_RSE, "adaptive mode: largest relative standard error of "
                                            "the noise scale a decision may use (the first "
                                            "decision: up to 1, priced by the run's length)")
    adaptive_refit_steps: int = knob(step_refit.MIN_STEPS, "adaptive mode: measured steps at the "
                                     "batch in use before goodput's throughput comes from the "
                                     "run's own step times instead of the cost model (0 = never)")
    adaptive_refit_warmup: int = knob(step_refit.WARMUP_STEPS, "adaptive mode: steps after each "
                                      "batch change left out of the measured step times")
    adaptive_lr: str = knob(ADAPTIVE_LRS[0], "adaptive mode: lr at a batch B: scaling "
                            "(lr_scaling at B, as the fixed policies) | gain (B0's lr x the "
                            "goodput gain, Pollux/AdaScale)")
    batch_prior: str = knob("auto", "adaptive mode: what decisions use before the run measures: "
                            "auto (the stored prior of an earlier run of this model, data, rank "
                            "count and machine, else the published figures for the model) | "
                            "none (measure from B0) | a batch_prior.json path")
    min_batch: int = knob(0, "adaptive mode: lower bound of the global batch and the goodput "
                             "model's reference batch B0 (0 = the schedule's first batch)")
    max_batch: int = knob(0, "adaptive mode: upper bound of the global batch (0 = ranks x local_batch x 64)")
    # optimisation
    epochs: float = knob(90.0, "passes over the training data (fractions allowed)")
    optimizer: str = knob("momentum", "momentum SGD or LARS: momentum | lars")
    base_lr: float = knob(0.1, "learning rate at reference_batch images per step")
    reference_batch: int = knob(256, "the batch base_lr is meant for; lr follows lr_scaling from it")
    lr_scaling: str = knob("linear", "lr scaling with the global batch: " + " | ".join(LR_SCALINGS))
    batch_change_lr: str = knob("linear", "lr when the global batch changes: linear (follow "
                                          "lr_scaling) | keep (keep the first batch's lr)")
    warmup_epochs: float = knob(5.0, "linear warm-up from 0 to the scaled lr")
    lr_decay: str = knob("step", "lr decay after warm-up: " + " | ".join(DECAYS))
    milestones: str = knob("30,60,80", "step decay epochs")
    gamma: float = knob(0.1, "step decay factor per milestone")
    power: float = knob(2.0, "poly decay exponent")
    momentum: float = knob(0.9, "momentum coefficient")
    weight_decay: float = knob(1e-4, "L2 weight decay (see no_decay_bn_bias)")
    no_decay_bn_bias: bool = knob(True, "no weight decay (and no LARS) on batch-norm parameters "
                                        "and biases")
    lars_coefficient: float = knob(0.001, "LARS trust coefficient (eta)")
    label_smoothing: float = knob(0.0, "epsilon: target = (1 - eps) * one_hot + eps / classes")
    # model variant
    stride_on: str = knob("3x3", "bottleneck stride: 3x3 (ResNet v1.5) | 1x1 (v1, He et al.)")
    zero_init_last_gamma: bool = knob(True, "each residual block's last BN gamma starts at 0")
    bn_statistics: str = knob("per_gpu", "batch-norm statistics over: per_gpu (each rank's "
                                         "local batch; the only mode implemented)")
    # numerics and device
    context: str = knob("cpu", "nnabla extension: cpu | cudnn")
    type_config: str = knob("float", "float | half (half = FP16 with dynamic loss scaling; CUDA only)")
    loss_scale: float = knob(8.0, "initial dynamic loss scale (half only)")
    allow_tf32: bool = knob(False, "let cuDNN/cuBLAS use TF32 for float32 convolutions and "
                                   "matrix products on Ampere and newer GPUs (sets "
                                   "NNABLA_CUDA_ALLOW_TF32 before the CUDA extension loads; "
                                   "nnabla's default, off, is full FP32)")
    seed: int = knob(313, "random seed of model init and data order")
    # communication
    algorithm: str = knob("planned", "all-reduce: " + " | ".join(CHOICES["algorithm"]) + " "
                                     "(planned = the planner's choice at each global batch, "
                                     "torus2d with --plan off; auto: the old name of planned)")
    grid: str = knob("", "torus2d process grid XxY, e.g. 2x4 (empty = the planner's or the "
                         "communicator's choice from the hosts)")
    plan: str = knob("on", "planner: on (plan algorithm and grid at each global batch, log "
                           "the best rank count) | off (auto: the old name of on)")
    profile: str = knob("", "cluster profile for the planner: shipped name or YAML path "
                            "(empty = the one rule of every tool: cpu-2core for a CPU "
                            "context, else this host's GPU's profile, else abci)")
    hosts: int = knob(0, "hosts of the cluster the planner plans for (0 = the profile's)")
    gpus_per_host: int = knob(0, "GPUs per host of that cluster (0 = the profile's)")
    inter_bandwidth: float = knob(0.0, "its inter-host bandwidth per host, GB/s, all NICs "
                                       "together (0 = the profile's)")
    gpu_model: str = knob("", "per-GPU compute from this GPU's shipped profile: v100 | a100 | "
                              "h100 (empty = the profile's)")
    overlap: bool = knob(True, "all-reduce gradient buckets during backward")
    bucket_mib: float = knob(25.0, "bucket size for overlap, MiB")
    # bookkeeping
    checkpoint_every: int = knob(0, "optimizer steps between checkpoints (0 = only at the end)")
    max_nonfinite_steps: int = knob(3, "stop the run on every rank after this many steps in a "
                                       "row whose all-reduced gradients are not finite (a "
                                       "diverged run; checkpoints stop before it, fp16's "
                                       "skipped overflow steps count only at a loss scale "
                                       "<= 1; 0 = never)")
    resume: bool = knob(False, "continue from the newest good checkpoint in output_dir")
    init_params: str = knob("", "start from the parameters in this file: nn.save_parameters' "
                                ".h5/.protobuf or a .nnp, e.g. a run's model.h5 (empty = random "
                                "init; --resume wins over it)")
    elastic: bool = knob(False, "driven by nnabla-torus-run: at a new batch phase, checkpoint and "
                                "exit 75 to be relaunched on the rank count the planner picks; "
                                "SIGUSR1: checkpoint and exit 76 (0 = only log what it would do)")
    max_steps: int = knob(0, "stop after this many optimizer steps (0 = run all epochs); for tests")
    progress: bool = knob(True, "progress on rank 0: a tqdm bar when stderr is a terminal, "
                                "else a line every log_every steps")
    log_every: int = knob(50, "optimizer steps between progress lines when stderr is not a "
                              "terminal (0 = none)")
    # filled by parse_config: where each value came from (cli | recipe | env | default), and
    # one note per old spelling it renamed (RENAMED_VALUES), for the rank-0 log
    recipe: str = ""
    source: dict = dataclasses.field(default_factory=dict, repr=False)
    notes: list = dataclasses.field(default_factory=list, repr=False)

    def describe(self):
        """Return one line per knob: ``name = value  (source)``, for the rank-0 log."""
        lines = []
        for field in knob_fields():
            lines.append(f"  {field.name:<17} = {getattr(self, field.name)!r:<24} "
                         f"({self.source.get(field.name, 'default')})")
        return f"config (recipe {self.recipe or '-'}):\n" + "\n".join(lines)


def knob_fields():
    """The dataclass fields that are knobs (everything but the bookkeeping of parse_config)."""
    return [f for f in dataclasses.fields(TrainConfig) if f.name not in ("recipe", "source", "notes")]


PER_HOST = ("data_dir", "output_dir", "init_params", "batch_prior", "progress", "log_every")   # may differ:
# a host's own mount points, and rank 0's console; every other knob must be the same on all ranks


def agreement(cfg):
    """((name, value), ...) of the knobs every rank must have resolved alike (run_context.py
    compares them across ranks): all but ``PER_HOST``."""
    return tuple((f.name, getattr(cfg, f.name)) for f in knob_fields() if f.name not in PER_HOST)


def flag_of(name):
    """``base_lr`` -> ``--base-lr``."""
    return "--" + name.replace("_", "-")


def env_of(name):
    """``base_lr`` -> ``NNABLA_TORUS_BASE_LR``."""
    return "NNABLA_TORUS_" + name.upper()


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose usage error is one line (its usage text lists ~60 flags), once
    per job when every rank meets it (``failfast.wait_for_rank_zero``)."""

    def error(self, message):
        failfast.wait_for_rank_zero()
        self.exit(2, f"{self.prog}: error: {message} (flags: {self.prog} --help)\n")


def build_parser():
    """The argparse parser: ``-C/--recipe`` plus one knob per TrainConfig field."""
    parser = OneLineParser(
        description="Data-parallel ImageNet training with nnabla-torus "
                    "(no arguments: a small ResNet on the embedded digits data).")
    parser.add_argument(
        "-C", "--recipe", default=env_value("NNABLA_TORUS_RECIPE", ""),
        help=f"recipe name in {RECIPE_DIR} (e.g. sony-224s) or a YAML path; "
                  f"empty = {DEFAULT_RECIPE} without --data-dir, {DEFAULT_DATA_RECIPE} with it "
             f"(env: NNABLA_TORUS_RECIPE, default: '')")
    defaults = TrainConfig()
    for field in knob_fields():
        help_text = field.metadata["help"]
        choices = CHOICES.get(field.name)
        if field.name in RENAMED_VALUES:
            choices = (*choices, *RENAMED_VALUES[field.name])
        add_knob(parser, flag_of(field.name), env=env_of(field.name),
                 default=getattr(defaults, field.name), type=RANGES.get(field.name, field.type),
                 help=help_text, choices=choices, dest=field.name)
    return parser


def load_recipe(name):
    """Read a recipe (a shipped name or a path, :mod:`nnabla_torus.planning.recipe_files`) into
    a dict of knobs; reject unknown keys by name.

    Values may carry provenance tags (``# published [source]: ...``, see
    :mod:`nnabla_torus.planning.provenance`); a published tag without a known source is an error. The
    ``sources:`` and ``expected:`` blocks (citations, published results) are not knobs.
    """
    values, path = read_recipe(name)
    values = {k: v for k, v in values.items() if k not in RECIPE_META_KEYS}
    valid = {f.name: f for f in knob_fields()}
    unknown = sorted(set(values) - set(valid))
    if unknown:
        hints = [f"{k} -> {close[0]}" for k in unknown
                 for close in [difflib.get_close_matches(k, list(valid), 1)] if close]
        raise ValueError(f"recipe {path}: unknown key(s) {unknown}"
                         + (f" (did you mean {', '.join(hints)}?)" if hints else "")
                         + f"; valid keys are {sorted(valid)} and the blocks "
                         f"{list(RECIPE_META_KEYS)}; rename or remove the key")
    return {key: coerce(key, valid[key].type, value, path) for key, value in values.items()}


def coerce(key, type_, value, where):
    """Convert a YAML value to the field's type (int -> float, list -> "a,b"), or raise."""
    if type_ is str and isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    ok = (type_ is float and isinstance(value, (int, float)) and not isinstance(value, bool)) or \
         (type_ is int and isinstance(value, int) and not isinstance(value, bool)) or \
         (type_ is bool and isinstance(value, bool)) or (type_ is str and isinstance(value, str))
    if not ok:
        raise ValueError(f"{where}: {key} = {value!r} must be a {type_.__name__}")
    return type_(value)


def parse_config(argv=None):
    """Parse ``argv`` (default: sys.argv) into a validated TrainConfig with ``source`` filled."""
    parser = build_parser()
    with_env = parser.parse_args(argv)            # CLI over environment over default
    names = [f.name for f in knob_fields()]
    parser.set_defaults(**{name: None for name in names})
    only_cli = parser.parse_args(argv)            # None wherever the CLI said nothing
    recipe_name = with_env.recipe or (DEFAULT_DATA_RECIPE if with_env.data_dir else DEFAULT_RECIPE)
    recipe = load_recipe(recipe_name)
    values, source = {}, {}
    for name in names:
        if getattr(only_cli, name) is not None:
            values[name], source[name] = getattr(only_cli, name), "cli"
        elif name in recipe:
            values[name], source[name] = recipe[name], "recipe"
        else:
            values[name] = getattr(with_env, name)
            source[name] = "env" if os.environ.get(env_of(name), "") != "" else "default"
    notes = [rename(values, name) for name in RENAMED_VALUES
             if values[name] in RENAMED_VALUES[name]]
    cfg = TrainConfig(**values, recipe=recipe_name, source=source, notes=notes)
    validate(cfg)
    if with_env.data_dir and not with_env.recipe:
        cfg.notes.append(data_recipe_note(cfg))
    return cfg


def data_recipe_note(cfg):
    """What --data-dir without -C picked, and why (ImageNet's recipe, whatever the data)."""
    cpu = (" on a CPU context: a ResNet-50 step of 8 images at 224 px takes seconds there, "
           "so for a small image set" if cfg.context == "cpu" else "; for a small image set")
    return (f"note: --data-dir without -C uses the ImageNet recipe {DEFAULT_DATA_RECIPE} "
            f"({cfg.arch} x{cfg.width:g}, {cfg.image_size} px, global batch "
            f"{cfg.batch_schedule}, {cfg.epochs:g} epochs){cpu} pass a smaller recipe "
            f"(-C digits-cpu: resnet18 x0.125, 16 px) or set --arch, --width, --image-size "
            f"and --epochs")


def rename(values, name):
    """Replace the old spelling of knob ``name`` in ``values`` by the new; return the note."""
    old = values[name]
    values[name] = RENAMED_VALUES[name][old]
    return (f"note: {name} {old!r} is the old spelling of {values[name]!r}; write "
            f"{flag_of(name)} {values[name]} (the old one still works)")


def profile_shape(cfg):
    """The machine_profile.Shape of the --hosts, --gpus-per-host, --inter-bandwidth and
    --gpu-model knobs (0 / empty: the profile's value)."""
    return Shape(cfg.hosts or None, cfg.gpus_per_host or None, cfg.inter_bandwidth or None,
                 cfg.gpu_model or None)


def validate(cfg):
    """Raise ValueError naming the knob, its value, the allowed range and the fix."""
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{name} = {getattr(cfg, name)!r} is not one of {allowed}; "
                             f"set {flag_of(name)} or the recipe key {name}")
    for name, parse in RANGES.items():            # again: recipe values skip the parser
        try:
            parse(getattr(cfg, name))
        except ValueError as e:
            raise ValueError(f"{name} {e} (set {flag_of(name)}, the recipe key {name} or "
                             f"{env_of(name)})") from None
    if cfg.warmup_epochs >= cfg.epochs:
        raise ValueError(f"warmup_epochs = {cfg.warmup_epochs} must be below epochs = {cfg.epochs}; "
                         f"lower --warmup-epochs (0 = no warm-up) or raise --epochs")
    if cfg.min_batch and cfg.max_batch and cfg.min_batch > cfg.max_batch:
        raise ValueError(f"min_batch = {cfg.min_batch} must be <= max_batch = {cfg.max_batch} "
                         f"(--min-batch, --max-batch)")
    for name, parse in (("batch_schedule", BatchSchedule.parse), ("milestones", milestones),
                        ("grid", lambda text: text and parse_grid(text))):
        try:
            parse(getattr(cfg, name))
        except ValueError as e:
            raise ValueError(f"{name} = {getattr(cfg, name)!r}: {e} ({flag_of(name)})") from None
    if cfg.data_dir and not os.path.isdir(os.path.expanduser(cfg.data_dir)):
        raise ValueError(f"data_dir = {cfg.data_dir!r} is not a folder; pass the root holding "
                         f"train/ and val/ (class folders, or with train.txt and val.txt) "
                         f"(--data-dir), or none for the embedded digits data")
    if cfg.data_dir:                         # before the config dump, not after it
        for split in ("train", "val"):
            split_source(os.path.expanduser(cfg.data_dir), split)
    if cfg.profile:
        load_profile(cfg.profile, profile_shape(cfg))   # names the shipped profiles when
        # unknown
    check_output_path(flag_of("output_dir"), cfg.output_dir, folder=True)
    if cfg.init_params and not os.path.isfile(os.path.expanduser(cfg.init_params)):
        raise ValueError(f"init_params = {cfg.init_params!r} is not a file; pass parameters "
                         f"saved by nn.save_parameters (.h5, .protobuf) or a .nnp "
                         f"({flag_of('init_params')}, {env_of('init_params')})")
    if cfg.batch_prior not in ("auto", "none") and not os.path.isfile(
            os.path.expanduser(cfg.batch_prior)):
        raise ValueError(f"batch_prior = {cfg.batch_prior!r} is not a file; pass auto, none or "
                         f"the batch_prior.json an adaptive run wrote "
                         f"({flag_of('batch_prior')}, {env_of('batch_prior')})")


def check_context(context):
    """Raise ValueError unless ``context`` can run here: cudnn needs nnabla-ext-cuda, and the
    communicator's NCCL backend (NNABLA_TORUS_BACKEND) needs a CUDA context."""
    if context == "cudnn":
        try:
            found = importlib.util.find_spec("nnabla_ext.cudnn") is not None
        except ModuleNotFoundError:          # no nnabla_ext package at all
            found = False
        if not found:
            raise ValueError("context = 'cudnn' needs nnabla-ext-cuda, which is not installed; "
                             "install it (pip install -e '.[gpu]', docs/gpu.md) or train on "
                             "the CPU with --context cpu")
    backend = os.environ.get(BACKEND_ENV, "")
    if backend == "nccl" and context != "cudnn":
        raise ValueError(f"{BACKEND_ENV}=nccl needs a CUDA context, got --context {context}; "
                         f"unset {BACKEND_ENV} (or set it to mpi) for a CPU run, or pass "
                         f"--context cudnn on GPUs")


def milestones(text):
    """"30,60,80" -> [30.0, 60.0, 80.0]; raise ValueError unless finite, >= 0 and increasing."""
    try:
        values = [float(m) for m in text.split(",") if m.strip()]
    except ValueError:
        raise ValueError("expected comma-separated epochs, e.g. 30,60,80") from None
    for value in values:
        number(float, low=0)(value)
    if values != sorted(set(values)):
        raise ValueError("milestones must be strictly increasing, e.g. 30,60,80")
    return values


def build_schedules(cfg, world_size, noise_scale=None, throughput=None, model_error=None,
                    refit=None, prior=None, epoch_images=None):
    """Return (BatchSizeController, LearningRateSchedule) for ``cfg`` on ``world_size`` ranks.

    The learning rate of a step at fractional epoch e is
    ``lr_schedule.lr(e) * controller.plan(e).lr_factor``. With ``noise_scale`` (adaptive
    batch) the run starts at the schedule's first batch unless ``min_batch`` is set, and the
    batch maximises goodput with ``throughput`` (TrainingPlanner.throughput; None: flat) and the
    cost model's ``model_error`` as hysteresis, until ``refit`` (a StepTimeRefit fed with
    the run's step times) has measured the batch in use; ``prior`` (priors.Prior) decides
    before the run has measured, and ``epoch_images`` (the training set) prices the first
    decision by the run's length.
    """
    schedule = BatchSchedule.parse(cfg.batch_schedule)
    controller = BatchSizeController(
        world_size, cfg.local_batch, schedule=None if noise_scale else schedule,
        noise_scale=noise_scale, base_batch=cfg.reference_batch, lr_scaling=cfg.lr_scaling,
        lr_at_change=cfg.batch_change_lr,
        min_batch=cfg.min_batch or (schedule.batch(0) if noise_scale else None),
        max_batch=cfg.max_batch or None, throughput=throughput,
        min_samples=cfg.adaptive_min_samples, max_rse=cfg.adaptive_max_rse, refit=refit,
        adaptive_lr=cfg.adaptive_lr, prior=prior, epochs=cfg.epochs, epoch_images=epoch_images,
        **({} if model_error is None else {"model_error": model_error}))
    lr_schedule = LearningRateSchedule(
        cfg.base_lr, cfg.epochs, warmup_epochs=cfg.warmup_epochs, decay=cfg.lr_decay,
        milestones=milestones(cfg.milestones),
        gamma=cfg.gamma, power=cfg.power)
    return controller, lr_schedule
