"""Check a parsed TrainConfig: choices, ranges, schedules, paths, profile and context.

Each check raises ValueError naming the knob, its value, the allowed range and the fix.
"""
import importlib.util
import os

from dali_pipeline import MAX_VAL_RESIZE
from image_lists import split_source
from knob_table import CHOICES, RANGES, env_of, flag_of
from nnabla_torus.comm.settings import KNOBS
from nnabla_torus.knobs import check_output_path, number
from nnabla_torus.planning import efficiency_fit
from nnabla_torus.planning.machine_profile import Shape, load_profile
from nnabla_torus.planning.schedules import BatchSchedule
from nnabla_torus.comm.topology import parse_grid

BACKEND_ENV = KNOBS["backend"].env    # the communicator's backend variable


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
    if round(cfg.image_size / cfg.val_crop) > MAX_VAL_RESIZE:
        raise ValueError(f"val_crop = {cfg.val_crop:g} would resize validation images to a "
                         f"{cfg.image_size / cfg.val_crop:,.0f}-pixel shorter side (image_size "
                         f"{cfg.image_size} / val_crop); at image_size {cfg.image_size} it must "
                         f"be in [{cfg.image_size / MAX_VAL_RESIZE:.4g}, 1] (a shorter side of at "
                         f"most {MAX_VAL_RESIZE} pixels), e.g. 0.875 ({flag_of('val_crop')})")
    if cfg.warmup_epochs >= cfg.epochs:
        raise ValueError(f"warmup_epochs = {cfg.warmup_epochs} must be below "
                         f"epochs = {cfg.epochs}; "
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
                         f"(--data-dir), or none for the embedded data (--dataset)")
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
    if cfg.efficiency_fit:
        try:
            efficiency_fit.load(os.path.expanduser(cfg.efficiency_fit))
        except ValueError as e:
            raise ValueError(f"{e} ({flag_of('efficiency_fit')}, {env_of('efficiency_fit')})"
                             ) from None


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

