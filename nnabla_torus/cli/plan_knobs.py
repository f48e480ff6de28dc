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
             "multiply-adds; model_cost.count_cost counts them from an nnabla graph): its step "
             "time is scaled from the profile's calibrated model",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--params", "NNABLA_TORUS_PLAN_PARAMS", None,
             "parameters of that model (all-reduced as FP16: 2 bytes each)",
             type=number(int, low=1))
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


def _add_objective_knobs(parser):
    """What a plan is scored by: noise scale, dataset, epochs, scaling efficiency."""
    add_knob(parser, "--noise-scale", "NNABLA_TORUS_PLAN_NOISE_SCALE", None,
             "gradient noise scale B_noise in samples (None: statistical efficiency 1)",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--base-batch", "NNABLA_TORUS_PLAN_BASE_BATCH", 256,
             "reference batch B0 of the statistical efficiency", type=number(int, low=1))
    add_knob(parser, "--dataset-size", "NNABLA_TORUS_PLAN_DATASET_SIZE",
             planner.IMAGENET_TRAIN_IMAGES, "training samples per epoch", type=number(int, low=1))
    add_knob(parser, "--epochs", "NNABLA_TORUS_PLAN_EPOCHS", DEFAULT_EPOCHS,
             "epochs to train (with --recipe: instead of the recipe's)",
             type=number(float, low=0, strict=True))
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
             "print the compute and all-reduce phase terms of the recommendation", type=bool,
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
    for add in (_add_search_knobs, _add_objective_knobs, _add_output_knobs,
                _add_explain_and_simulate_knobs):
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
                  "--simulate")]


def refuse_ignored(parser, args):
    """``parser.error`` for a flag that the mode of ``args`` would ignore (``IGNORED``)."""
    def given(flag):
        name = flag[2:].replace("-", "_")
        return getattr(args, name) != parser.get_default(name)
    for flag, mode, why in IGNORED:
        if given(flag) and (given(mode) if mode else not args.simulate):
            with_mode = f"with {mode}" if mode else "without --simulate"
            parser.error(f"{flag} has no effect {with_mode} ({why}): leave one of them out")
