"""One typed configuration for examples/imagenet/train.py: defaults, recipe file, env, CLI.

Every field of ``TrainConfig`` is a CLI flag (``--base-lr``), an environment variable
(``NNABLA_TORUS_BASE_LR``) and a recipe key (``base_lr``). Precedence, highest first
(docs/imagenet.md#where-each-setting-comes-from): flag > environment > the recipe given with
``-C`` > the default recipe (``DEFAULT_RECIPE``, ``DEFAULT_DATA_RECIPE``) > the default written
in ``knob_table``. This module parses and builds the run's schedules; ``knob_table`` holds the
knobs and ``config_checks`` checks them. Example::

    cfg = parse_config(["-C", "sony-224s", "--epochs", "2"])
    cfg.batch_schedule        # "0:34816,5:69632" from the recipe
    cfg.source["epochs"]      # "cli"
"""
import argparse
import difflib
import os

from config_checks import check_context  # noqa: F401  (tests import it from here)
from config_checks import milestones, validate
from knob_table import (CHOICES, RANGES, RENAMED_VALUES, WORDS, TrainConfig, env_of, flag_of,
                        knob_fields)
from nnabla_torus.comm import failfast
from nnabla_torus.planning import efficiency_fit
from nnabla_torus.knobs import add_knob, env_value
from nnabla_torus.training import AdaptiveBatch
from nnabla_torus.planning.recipe_files import RECIPE_DIR, read_recipe
from nnabla_torus.planning.schedules import BatchSchedule, LearningRateSchedule

DEFAULT_RECIPE = "digits-cpu"        # used when neither -C nor --data-dir is given
DEFAULT_DATA_RECIPE = "resnet50-90ep"  # used with --data-dir and no -C
# recipe blocks that are not knobs: citations of the provenance tags, the published results
RECIPE_META_KEYS = ("sources", "expected")


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
    :mod:`nnabla_torus.planning.provenance`); a published tag without a known source is an
    error. The ``sources:`` and ``expected:`` blocks (citations, published results) are not
    knobs.
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
    """Convert a YAML value to the field's type (int -> float, list -> "a,b") or one of the
    knob's ``WORDS`` (``checkpoint_every: auto``), or raise."""
    words = WORDS.get(key, ())
    if isinstance(value, str) and value.strip().lower() in words:
        return value.strip().lower()
    if type_ is str and isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    ok = (type_ is float and isinstance(value, (int, float)) and not isinstance(value, bool)) or \
         (type_ is int and isinstance(value, int) and not isinstance(value, bool)) or \
         (type_ is bool and isinstance(value, bool)) or (type_ is str and isinstance(value, str))
    if not ok:
        article = "an" if type_.__name__[0] in "aeiou" else "a"
        raise ValueError(f"{where}: {key} = {value!r} must be {article} {type_.__name__}"
                         + "".join(f" or {word}" for word in words))
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
    from_recipe = "recipe" if with_env.recipe else "default recipe"
    values, source = {}, {}
    for name in names:
        if getattr(only_cli, name) is not None:
            values[name], source[name] = getattr(only_cli, name), "cli"
        elif os.environ.get(env_of(name), "") != "":
            values[name], source[name] = getattr(with_env, name), "env"
        elif name in recipe:
            values[name], source[name] = recipe[name], from_recipe
        else:
            values[name], source[name] = getattr(with_env, name), "default"
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



def build_schedules(cfg, comm, throughput=None, model_error=None, prior=None,
                    epoch_images=None, refit_steps=0, refit_warmup=0, compute_line=None):
    """Return (AdaptiveBatch, LearningRateSchedule) for ``cfg`` on ``comm``'s ranks.

    The learning rate of a step at fractional epoch e is
    ``lr_schedule.lr(e) * batch.plan(e).lr_factor``. With --adaptive-batch the run starts at the
    schedule's first batch unless ``min_batch`` is set, and the batch maximises goodput with
    ``throughput`` (TrainingPlanner.throughput; None: flat) and the cost model's
    ``model_error`` as hysteresis, until the run's measured step times (``refit_steps`` > 0,
    ``refit_warmup``, the cost model's ``compute_line``) have measured the batch in use;
    ``prior`` (priors.Prior) decides before the run has measured, and ``epoch_images`` (the
    training set) prices the first decision by the run's length.
    """
    schedule = BatchSchedule.parse(cfg.batch_schedule)
    adaptive = bool(cfg.adaptive_batch)
    batch = AdaptiveBatch(
        comm, cfg.local_batch, schedule=None if adaptive else schedule,
        base_batch=cfg.reference_batch, lr_scaling=cfg.lr_scaling,
        lr_at_change=cfg.batch_change_lr,
        min_batch=cfg.min_batch or (schedule.batch(0) if adaptive else None),
        max_batch=cfg.max_batch or None, throughput=throughput,
        min_samples=cfg.adaptive_min_samples, max_rse=cfg.adaptive_max_rse,
        refit_steps=refit_steps, refit_warmup=refit_warmup, compute_line=compute_line,
        adaptive_lr=cfg.adaptive_lr, prior=prior, epochs=cfg.epochs, epoch_images=epoch_images,
        efficiency=(efficiency_fit.load(os.path.expanduser(cfg.efficiency_fit))
                    if adaptive and cfg.efficiency_fit else None),
        shrink=cfg.adaptive_shrink,
        **({} if model_error is None else {"model_error": model_error}))
    lr_schedule = LearningRateSchedule(
        cfg.base_lr, cfg.epochs, warmup_epochs=cfg.warmup_epochs, decay=cfg.lr_decay,
        milestones=milestones(cfg.milestones),
        gamma=cfg.gamma, power=cfg.power)
    return batch, lr_schedule
