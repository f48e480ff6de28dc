"""The flags of nnabla-torus-plan and the refusal of those a mode would ignore.

Each flag has an environment twin (NNABLA_TORUS_PLAN_*; ``--profile`` shares
NNABLA_TORUS_PROFILE with train.py); :func:`add_plan_knobs` adds them all to a parser,
:func:`refuse_ignored` refuses a flag given with a mode that does not use it (``IGNORED``).
"""
from ..knobs import TIMEOUT_MAX_S, BadValue, add_knob, number, writable_file
from ..planning import planner
from ..planning.costmodel import ALGORITHMS
from ..planning.machine_profile import add_profile_knob, add_shape_knobs, list_profiles
from ..planning.schedules import BatchSchedule

DEFAULT_EPOCHS = 90.0   # --epochs; with --recipe, another value replaces the recipe's
# Upper bounds of the model's and data's sizes (issue 65: --gflops-per-image 1e308 printed
# 400-digit times): a million training GFLOPs per image (30x a ViT-22B image), 10^12
# parameters, images or images/s, 10^5 epochs, a start-up of 10^6 s.
MAX_GFLOPS_PER_IMAGE = 1e6
MAX_COUNT = 10 ** 12
MAX_EPOCHS = 1e5
MAX_STARTUP_S = 1e6


def gpu_list(text):
    """``"1,4,8"`` -> [1, 4, 8]; each count an integer >= 1."""
    return [number(int, low=1, hint="GPU counts, e.g. 1,4,8")(c.strip()) for c in text.split(",")]


def schedule(text):
    """A BatchSchedule from ``"epoch:batch,..."``; its errors as argparse messages."""
    try:
        return BatchSchedule.parse(text)
    except ValueError as e:
        raise BadValue(str(e)) from None


def _add_search_knobs(parser):
    """What to plan on: the profile, model, GPU counts, algorithms and batches."""
    add_profile_knob(parser, help=f"cluster profile: shipped name "
                     f"({', '.join(list_profiles())}) or a file path")
    add_shape_knobs(parser)
    add_knob(parser, "--model", "NNABLA_TORUS_PLAN_MODEL", "resnet50",
             "model: one of the profile's, or any name with --gflops-per-image and --params")
    add_knob(parser, "--gflops-per-image", "NNABLA_TORUS_PLAN_GFLOPS_PER_IMAGE", None,
             "training GFLOPs per image of a model the profile does not know (6 x its forward "
             "multiply-adds; --nnp or --model-fn counts them): its step time is scaled from "
             "the profile's calibrated model",
             type=number(float, low=0, strict=True, high=MAX_GFLOPS_PER_IMAGE))
    add_knob(parser, "--params", "NNABLA_TORUS_PLAN_PARAMS", None,
             "parameters of that model (all-reduced as FP16: 2 bytes each)",
             type=number(int, low=1, high=MAX_COUNT))
    add_knob(parser, "--param-arrays", "NNABLA_TORUS_PLAN_PARAM_ARRAYS", None,
             "parameter arrays of that model (nnabla's all_reduce_callback checks each; None: "
             "unknown, those checks left out)", type=number(int, low=1, high=MAX_COUNT))
    add_knob(parser, "--max-gpus", "NNABLA_TORUS_PLAN_MAX_GPUS", None,
             "largest GPU count to consider (None: every GPU of the profile)",
             type=number(int, low=1))
    add_knob(parser, "--gpus", "NNABLA_TORUS_PLAN_GPUS", None,
             "comma-separated GPU counts to consider instead (e.g. 1,4,8)", type=gpu_list)
    add_knob(parser, "--allow-beyond-profile", "NNABLA_TORUS_PLAN_ALLOW_BEYOND_PROFILE", False,
             f"let --max-gpus/--gpus exceed the profile's GPUs (up to "
             f"{planner.BEYOND_PROFILE}x them)", type=bool, nargs="?", const=True)
    add_knob(parser, "--algorithms", "NNABLA_TORUS_PLAN_ALGORITHMS", ",".join(ALGORITHMS),
             "comma-separated all-reduce algorithms to consider")
    add_knob(parser, "--schedule", "NNABLA_TORUS_PLAN_SCHEDULE", None,
             "global-batch schedule 'epoch:batch,...' turned into GPU counts at --local-batch",
             type=schedule)
    add_knob(parser, "--batch", "NNABLA_TORUS_PLAN_BATCH", None,
             "fixed global batch (None: choose it from the noise scale)", type=number(int, low=1))
    add_knob(parser, "--nearest-batch", "NNABLA_TORUS_PLAN_NEAREST_BATCH", False,
             "when --batch cannot be split as GPUs x per-GPU batch x accumulation, plan the "
             "nearest feasible global batch instead (and say so); else that is an error "
             "naming the nearest ones", type=bool, nargs="?", const=True)
    add_knob(parser, "--local-batch", "NNABLA_TORUS_PLAN_LOCAL_BATCH", None,
             "fixed per-GPU batch (None: try powers of two up to the memory limit)",
             type=number(int, low=1))


def _add_own_model_knobs(parser):
    """A model of the user's own, its cost counted from its nnabla graph (model_source)."""
    add_knob(parser, "--nnp", "NNABLA_TORUS_PLAN_NNP", None,
             "plan for the model in this .nnp file (nnabla.utils.save.save): its parameter "
             "arrays, bytes and FLOPs per image counted from its graph")
    add_knob(parser, "--nnp-network", "NNABLA_TORUS_PLAN_NNP_NETWORK", None,
             "the network of --nnp to count (None: the file's only network)")
    add_knob(parser, "--model-fn", "NNABLA_TORUS_PLAN_MODEL_FN", None,
             "plan for the model a Python function builds, MODULE:FUNCTION or FILE.py:FUNCTION; "
             "FUNCTION(batch_size) returns the loss Variable of a graph of batch_size images")


def _add_own_data_knobs(parser):
    """The user's data: start-up, validation and the input pipeline (fixed_costs)."""
    add_knob(parser, "--val-images", "NNABLA_TORUS_PLAN_VAL_IMAGES", None,
             "validation images, one forward pass each (None: the profile's validation for its "
             "own models, none for yours)", type=number(int, low=1, high=MAX_COUNT))
    add_knob(parser, "--validate-every", "NNABLA_TORUS_PLAN_VALIDATE_EVERY", 1.0,
             "epochs between validation passes of --val-images",
             type=number(float, low=0, strict=True, high=MAX_EPOCHS))
    add_knob(parser, "--loader-rate", "NNABLA_TORUS_PLAN_LOADER_RATE", None,
             "images/s one host's input pipeline delivers, measured or given (None: the "
             "profile's for its own models, not modelled for yours)",
             type=number(float, low=0, strict=True, high=MAX_COUNT))
    add_knob(parser, "--startup-s", "NNABLA_TORUS_PLAN_STARTUP_S", None,
             "seconds from launch to the first step on one host; the profile's growth per "
             "doubling of hosts is added (None: the profile's for its own models, none for "
             "yours)", type=number(float, low=0, high=MAX_STARTUP_S))


def _add_objective_knobs(parser):
    """What a plan is scored by: noise scale, dataset, epochs, scaling efficiency."""
    add_knob(parser, "--noise-scale", "NNABLA_TORUS_PLAN_NOISE_SCALE", None,
             "gradient noise scale B_noise in samples (None: statistical efficiency 1)",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--base-batch", "NNABLA_TORUS_PLAN_BASE_BATCH", 256,
             "reference batch B0 of the statistical efficiency", type=number(int, low=1))
    add_knob(parser, "--dataset-size", "NNABLA_TORUS_PLAN_DATASET_SIZE", None,
             f"training images per epoch (None: ImageNet's {planner.IMAGENET_TRAIN_IMAGES:,} "
             f"for the profile's own models; required for yours)",
             type=number(int, low=1, high=MAX_COUNT))
    add_knob(parser, "--epochs", "NNABLA_TORUS_PLAN_EPOCHS", DEFAULT_EPOCHS,
             "epochs to train (with --recipe: instead of the recipe's)",
             type=number(float, low=0, strict=True, high=MAX_EPOCHS))
    add_knob(parser, "--min-efficiency", "NNABLA_TORUS_PLAN_MIN_EFFICIENCY", 0.0,
             "minimum scaling efficiency of a plan (0..1)", type=number(float, low=0, high=1))


def _add_output_knobs(parser):
    """What is shown: table rows, JSON, plot, a recipe's prediction."""
    add_knob(parser, "--rows", "NNABLA_TORUS_PLAN_ROWS", "log",
             "table rows: 'log' (powers of two and the recommendation) or 'all'",
             choices=("log", "all"))
    add_knob(parser, "--json", "NNABLA_TORUS_PLAN_JSON", None,
             "write the table and recommendation as JSON to this path ('-': stdout)",
             type=writable_file)
    add_knob(parser, "--plot", "NNABLA_TORUS_PLAN_PLOT", None,
             "write a PNG of step time and scaling efficiency versus GPU count per algorithm",
             type=writable_file)
    add_knob(parser, "--recipe", "NNABLA_TORUS_PLAN_RECIPE", None,
             "predict this training recipe's end-to-end time (a shipped name, e.g. sony-224s, "
             "or a path) beside its published figures")
    add_knob(parser, "--fit-recipe", "NNABLA_TORUS_PLAN_FIT_RECIPE", None,
             "first fit the model's per-image compute (b_ms) to this recipe's published time, "
             "then predict --recipe with it (a held-out check when the recipes differ)")


def _add_explain_and_simulate_knobs(parser):
    """The recommendation's terms and the re-ranking by a timed simulation."""
    add_knob(parser, "--explain", "NNABLA_TORUS_PLAN_EXPLAIN", False,
             "print every term of the recommendation's step time, scaling efficiency and "
             "time to train (they sum to the table's values)", type=bool,
             nargs="?", const=True)
    add_knob(parser, "--simulate", "NNABLA_TORUS_PLAN_SIMULATE", 0,
             "re-rank the K best candidates (the best plan of each GPU count, by goodput; "
             "with --schedule: the phases) by a timed simulation of their all-reduce "
             "(nnabla_torus.sim.simulate; 0: off)", type=number(int, low=0))
    add_knob(parser, "--max-wall", "NNABLA_TORUS_PLAN_MAX_WALL", 600.0,
             "wall-clock seconds allowed per simulated all-reduce",
             type=number(float, low=0, strict=True, high=TIMEOUT_MAX_S))
    add_knob(parser, "--sim-engine", "NNABLA_TORUS_SIM_ENGINE", "auto",
             "engine of --simulate: simgrid (SimGrid replay), flow (our flow model) or auto "
             "(simgrid when libsimgrid-dev and g++ are here)",
             choices=("auto", "simgrid", "flow"))   # simulate.ENGINES (not imported: greenlet)


def add_plan_knobs(parser):
    """Every flag of nnabla-torus-plan, in its groups, on ``parser``."""
    for add in (_add_search_knobs, _add_own_model_knobs, _add_objective_knobs,
                _add_own_data_knobs, _add_output_knobs, _add_explain_and_simulate_knobs):
        add(parser)


# Flags a mode does not use: (flag, the mode's flag or None for "without --simulate", why).
# Given with that mode (a value other than the default) they are refused, not ignored.
IGNORED = [
    ("--max-gpus", "--gpus", "--gpus lists the GPU counts to plan"),
    ("--max-gpus", "--schedule", "each phase runs on batch / --local-batch GPUs"),
    ("--gpus", "--schedule", "each phase runs on batch / --local-batch GPUs"),
    ("--batch", "--schedule", "the schedule sets the global batch of each phase"),
    ("--nearest-batch", "--schedule", "each phase's batch must be a multiple of --local-batch"),
    ("--rows", "--schedule", "the table has one row per phase"),
    ("--plot", "--schedule", "the plot draws a table of GPU counts"),
    ("--max-wall", None, "it limits --simulate"),
    ("--sim-engine", None, "it chooses the engine of --simulate"),
] + [(flag, "--recipe", "--recipe predicts the recipe's own schedule and GPU counts")
     for flag in ("--max-gpus", "--gpus", "--allow-beyond-profile", "--schedule", "--batch",
                  "--nearest-batch", "--local-batch", "--noise-scale", "--base-batch",
                  "--min-efficiency", "--rows", "--plot", "--explain",
                  "--simulate")] + [
    (flag, "--recipe", "a recipe trains the profile's model")
    for flag in ("--nnp", "--model-fn")] + [
    (flag, mode, f"{mode} is the model") for mode in ("--nnp", "--model-fn")
    for flag in ("--model", "--gflops-per-image", "--params", "--param-arrays")] + [
    ("--nnp", "--model-fn", "plan one model at a time")]
# Flags that only act with another: (flag, the flag it needs, why).
NEEDS = [("--nnp-network", "--nnp", "it names a network of --nnp"),
         ("--validate-every", "--val-images", "it spaces the passes over --val-images"),
         ("--param-arrays", "--params", "it describes the model of --params")]


def refuse_ignored(parser, args):
    """``parser.error`` for a flag that the mode of ``args`` would ignore (``IGNORED``) or
    that lacks the flag it acts with (``NEEDS``)."""
    def given(flag):
        name = flag[2:].replace("-", "_")
        return getattr(args, name) != parser.get_default(name)
    for flag, mode, why in IGNORED:
        if given(flag) and (given(mode) if mode else not args.simulate):
            with_mode = f"with {mode}" if mode else "without --simulate"
            parser.error(f"{flag} has no effect {with_mode} ({why}): leave one of them out")
    for flag, needed, why in NEEDS:
        if given(flag) and not given(needed):
            parser.error(f"{flag} has no effect without {needed} ({why}): give {needed} too")
