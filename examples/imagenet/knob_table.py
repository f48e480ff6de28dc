"""The knobs of examples/imagenet/train.py: TrainConfig, each knob's help, choices and range.

Every field of ``TrainConfig`` is a knob: a CLI flag (``flag_of``), an environment variable
(``env_of``) and a recipe key; ``config.parse_config`` fills it, ``config_checks`` checks it.
"""
import dataclasses

from dali_pipeline import VAL_CROP
from nnabla_torus.comm.collectives import ALGORITHMS
from nnabla_torus.planning import step_refit
from nnabla_torus.planning.controller import (ADAPTIVE_LRS, LR_AT_CHANGE, LR_SCALINGS, MAX_RSE,
                                             MIN_SAMPLES)
from nnabla_torus.knobs import number
from nnabla_torus.planning.machine_profile import GPU_PROFILES
from nnabla_torus.planning.profile_reshape import MAX_GPUS_PER_HOST, MAX_HOSTS, inter_bandwidth
from nnabla_torus.planning.schedules import DECAYS

CHOICES = {
    "arch": ("resnet18", "resnet34", "resnet50", "mlp"),      # models.ARCHS
    "dataset": ("digits", "clusters", "shapes"),              # embedded.ensure_dataset's sets
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
# Words a numeric knob takes besides its numbers, as a flag, a variable and a recipe value.
WORDS = {"checkpoint_every": ("auto",)}


def steps_or_auto(text):
    """``auto`` or optimizer steps, an integer >= 0 (--checkpoint-every)."""
    if str(text).strip().lower() in WORDS["checkpoint_every"]:
        return "auto"
    return number(int, low=0, hint="or auto")(text)


RANGES = {
    "width": number(float, **POSITIVE), "image_size": number(int, low=1),
    "min_crop_area": number(float, low=0, strict=True, high=1),
    "val_crop": number(float, low=0, strict=True, high=1),
    "train_images": number(int, low=0), "local_batch": number(int, low=1),
    "min_batch": number(int, low=0), "max_batch": number(int, low=0),
    "adaptive_min_samples": number(int, low=2), "adaptive_max_rse": number(float, **POSITIVE),
    "adaptive_refit_steps": number(int, low=0), "adaptive_refit_warmup": number(int, low=0),
    "epochs": number(float, low=0, strict=True, high=MAX_EPOCHS),
    "val_every": number(float, low=0, strict=True, high=MAX_EPOCHS),
    "base_lr": number(float, **POSITIVE),
    "reference_batch": number(int, low=1), "warmup_epochs": number(float, low=0),
    "gamma": number(float, low=0, strict=True, high=1), "power": number(float, **POSITIVE),
    "momentum": number(float, **FRACTION), "weight_decay": number(float, low=0),
    "lars_coefficient": number(float, low=0), "label_smoothing": number(float, **FRACTION),
    # nn.seed takes a C int (OverflowError from 2**31); more epochs or a bigger bucket than
    # these overflow the step and byte counts (int(inf)) long before anything trains
    "loss_scale": number(float, **POSITIVE), "seed": number(int, low=0, high=2 ** 31 - 1),
    "bucket_mib": number(float, low=0, strict=True, high=MAX_BUCKET_MIB),
    "checkpoint_every": steps_or_auto, "max_nonfinite_steps": number(int, low=0),
    "max_steps": number(int, low=0), "log_every": number(int, low=0),
    "hosts": number(int, low=0, high=MAX_HOSTS),
    "gpus_per_host": number(int, low=0, high=MAX_GPUS_PER_HOST),
    "inter_bandwidth": inter_bandwidth,
}


def knob(default, help):
    """A dataclass field with its help text (shown by --help and in the config log)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class TrainConfig:
    """All knobs of one training run; units in the comments."""
    # data and model
    data_dir: str = knob("", "root of an ImageNet layout: train/ and val/ of class folders, or "
                             "with train.txt and val.txt lists; empty = the embedded --dataset")
    dataset: str = knob("digits", "embedded data set used without --data-dir, made here once: "
                                  "digits (scikit-learn's, 32 px) | clusters (100,000 noisy "
                                  "8 px Gaussian clusters, 25 % label noise) | shapes (8,000 "
                                  "16 px images of 4 shapes); docs/tasks.md")
    output_dir: str = knob("runs/imagenet", "folder for monitors, the plot and checkpoints")
    arch: str = knob("resnet50", "network: resnet18 | resnet34 | resnet50 | mlp")
    width: float = knob(1.0, "channel width multiplier")
    image_size: int = knob(224, "training crop and validation centre crop, pixels")
    min_crop_area: float = knob(0.08, "smallest area fraction of the random-resized training crop")
    flip: bool = knob(True, "random horizontal flips in training (off for digits and text)")
    val_crop: float = knob(VAL_CROP, "share of the shorter side the validation centre crop covers "
                                  "(0.875: 224 of 256 as He et al. 2016; 1: the whole image; at "
                                  "least image_size / 4096)")
    train_images: int = knob(0, "use only N training images, a subset drawn with --seed (0 = all)")
    bad_images: str = knob("skip", "undecodable images: skip (leave them out, count and name "
                                   "them each epoch) | stop (end the job naming the file)")
    # global batch and its control
    batch_schedule: str = knob("0:256", "global batch per epoch range, epoch:images,... "
                                        "(images per step)")
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
    adaptive_shrink: bool = knob(False, "adaptive mode: let decisions after the first one on "
                                 "the run's own noise scale lower the batch (off: from then on "
                                 "it only grows, as Sony's batch-size control)")
    batch_prior: str = knob("auto", "adaptive mode: what decisions use before the run measures: "
                            "auto (the stored prior of an earlier run of this model, data, rank "
                            "count and machine, else the published figures for the model) | "
                            "none (measure from B0) | a batch_prior.json path")
    efficiency_fit: str = knob("", "adaptive mode: an efficiency_fit.json (tools/"
                               "time_to_accuracy.py efficiency) whose factor, fitted to fixed "
                               "runs of the task, scales phi = B_simple, its error added to "
                               "phi's (empty: phi = B_simple)")
    min_batch: int = knob(0, "adaptive mode: lower bound of the global batch and the goodput "
                             "model's reference batch B0 (0 = the schedule's first batch)")
    max_batch: int = knob(0, "adaptive mode: upper bound of the global batch (0 = ranks x "
                             "local_batch x 64)")
    # optimisation
    epochs: float = knob(90.0, "passes over the training data (fractions allowed)")
    val_every: float = knob(1.0, "epochs between validations (0.25: four an epoch; the run's "
                                 "last step validates too): finer times to a target accuracy")
    optimizer: str = knob("momentum", "momentum SGD or LARS: momentum | lars")
    base_lr: float = knob(0.1, "learning rate at reference_batch images per step")
    reference_batch: int = knob(256, "the batch base_lr is meant for; lr follows lr_scaling "
                                     "from it")
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
    type_config: str = knob("float", "float | half (half = FP16 with dynamic loss scaling; "
                                     "CUDA only)")
    loss_scale: float = knob(8.0, "initial dynamic loss scale (half only)")
    allow_tf32: bool = knob(False, "let cuDNN/cuBLAS use TF32 for float32 convolutions and "
                                   "matrix products on Ampere and newer GPUs (sets "
                                   "NNABLA_CUDA_ALLOW_TF32 before the CUDA extension loads; "
                                   "nnabla's default, off, is full FP32)")
    bind_gpu_numa: bool = knob(True, "bind each rank to its share of its GPU's NUMA node's "
                                     "CPUs, within those it was given (CUDA context only; the "
                                     "communicator's NNABLA_TORUS_BIND_GPU_NUMA)")
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
    gpu_model: str = knob("", "per-GPU compute from this GPU's shipped profile: "
                              + " | ".join(GPU_PROFILES) + " (empty = the profile's)")
    overlap: bool = knob(True, "all-reduce gradient buckets during backward")
    bucket_mib: float = knob(25.0, "bucket size for overlap, MiB")
    # bookkeeping
    checkpoint_every: int = knob(0, "optimizer steps between checkpoints (0 = only at the end; "
                                 "auto = Young/Daly's interval from the run's measured step and "
                                 "checkpoint times and the profile's run.mtbf_hours)")
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
    # filled by parse_config: where each value came from (SOURCES), and one note per old
    # spelling it renamed (RENAMED_VALUES), for the rank-0 log
    recipe: str = ""
    source: dict = dataclasses.field(default_factory=dict, repr=False)
    notes: list = dataclasses.field(default_factory=list, repr=False)

    def describe(self):
        """Return one line per knob: ``name = value  (where it came from)``, for the rank-0
        log: the flag, the variable, the recipe, the default recipe or the built-in default."""
        lines = []
        for field in knob_fields():
            lines.append(f"  {field.name:<17} = {getattr(self, field.name)!r:<24} "
                         f"({self.origin(field.name)})")
        return (f"config (recipe {self.recipe or '-'}; flag > environment > recipe > default "
                f"recipe > built-in default):\n" + "\n".join(lines))

    def origin(self, name):
        """Where knob ``name``'s value came from, as the log says it: ``flag --epochs``,
        ``env NNABLA_TORUS_EPOCHS``, ``recipe sony-224s``, ``default recipe digits-cpu`` or
        ``built-in default``."""
        source = self.source.get(name, "default")
        return {"cli": f"flag {flag_of(name)}", "env": f"env {env_of(name)}",
                "recipe": f"recipe {self.recipe}",
                "default recipe": f"default recipe {self.recipe}"}.get(source,
                                                                        "built-in default")


def knob_fields():
    """The dataclass fields that are knobs (everything but the bookkeeping of parse_config)."""
    return [f for f in dataclasses.fields(TrainConfig)
            if f.name not in ("recipe", "source", "notes")]


# may differ: a host's own mount points, and rank 0's console; every other knob must be the
# same on all ranks
PER_HOST = ("data_dir", "output_dir", "init_params", "batch_prior", "efficiency_fit", "progress",
            "log_every")


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
