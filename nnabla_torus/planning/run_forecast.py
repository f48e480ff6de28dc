"""Whole-run prediction: the end-to-end training time of a recipe on a cluster profile.

A recipe's batch schedule is cut into phases; the planner plans each phase once, at its global
batch B on B / local_batch GPUs (the paper's rule, :func:`planner.plan_schedule`), and
:func:`sum_phases` sums them, adding the fixed costs of the profile's ``run:`` block::

    total = start-up + validations + loader stalls (:mod:`.fixed_costs`)
            + sum over phases of ceil(epochs * dataset_size / B) * step_time

A published time is held against ``timed_s``, the total without start-up (*assumed*: published
times count from the first step, as MLPerf's run_start does).

:func:`fit_compute` solves for the per-image compute b of the model so that a recipe's
predicted time equals its published time; predictions of *other* published figures with that b
are the held-out check (docs/planner.md#whole-run-prediction-against-the-published-runs).
Example::

    >>> from nnabla_torus.planning.machine_profile import load_profile
    >>> recipe = load_recipe("sony-224s")
    >>> run = predict_run(load_profile("abci"), "resnet50", recipe)
    >>> [(p.plan.gpus, p.steps) for p in run.phases]
    [(1088, 184), (2176, 1564)]
"""
import math
import os
from collections import namedtuple

from . import planner
from .costmodel import ALGORITHMS
from .fixed_costs import fixed_seconds, run_costs  # run_forecast.run_costs, as before
from .machine_profile import model_of
from .planner import predict_efficiency  # noqa: F401  (run_forecast.predict_efficiency, as before)
from .recipe_files import read_recipe
from .schedules import BatchSchedule

RunRecipe = namedtuple("RunRecipe", [
    "name", "schedule", "local_batch", "epochs", "expected", "sources",
    "algorithm",   # the recipe's all-reduce algorithm when it names one of ALGORITHMS, else None
], defaults=[None])
PhaseRun = namedtuple("PhaseRun", [
    "start_epoch", "epochs", "steps", "plan", "seconds",   # plan: planner.Plan of the phase
])
RunPrediction = namedtuple("RunPrediction", [
    "phases",   # [PhaseRun]
    "fixed",    # {"startup": s, "validation": s, "loader_stalls": s}
    "total_s",  # seconds end to end
    "timed_s",  # total_s without start-up: what a published time is held against (module doc)
])


def load_recipe(name_or_path, epochs=None):
    """The parts of a training recipe a prediction needs (a shipped name or a path:
    :func:`.recipe_files.read_recipe`'s lookup); ``epochs`` replaces the recipe's."""
    values, path = read_recipe(name_or_path)
    missing = [k for k in ("batch_schedule", "local_batch", "epochs") if k not in values]
    if missing:
        raise ValueError(f"recipe {path}: a run prediction needs {missing}; add them")
    name = os.path.splitext(os.path.basename(path))[0]
    algorithm = values.get("algorithm")
    return RunRecipe(name, BatchSchedule.parse(values["batch_schedule"]),
                     int(values["local_batch"]), float(epochs or values["epochs"]),
                     values.get("expected") or {}, values.get("sources") or {},
                     algorithm if algorithm in ALGORITHMS else None)


def recipe_algorithms(recipe, algorithms=ALGORITHMS):
    """The algorithms to plan ``recipe`` with: the one it names, else ``algorithms``."""
    return [recipe.algorithm] if recipe.algorithm else list(algorithms)


def sum_phases(prof, recipe, phases, dataset_size=planner.IMAGENET_TRAIN_IMAGES):
    """RunPrediction of ``recipe`` (a RunRecipe) from its phases as the planner planned them
    ([(start_epoch, Plan)]: :func:`planner.plan_schedule`'s): each phase's steps and seconds,
    the fixed costs of ``prof``'s ``run:`` block, their total."""
    run, g = run_costs(prof), prof.network.gpus_per_host
    ends = [start for start, _ in phases[1:]] + [recipe.epochs]
    out = []
    for (start, plan), end in zip(phases, ends):
        epochs = max(0.0, min(end, recipe.epochs) - start)
        steps = math.ceil(epochs * dataset_size / plan.global_batch)
        out.append(PhaseRun(start, epochs, steps, plan, steps * plan.step_time_s))
    costs = [fixed_seconds(run, -(-ph.plan.gpus // g), ph.plan.gpus, ph.epochs, ph.steps)
             for ph in out]
    per_run = run["validations"] * run["validation_s"]     # counted once, not per phase
    fixed = {"startup": float(costs[0]["startup"]),          # on the first phase's hosts
             "validation": float(sum(c["validation"] for c in costs)) - per_run * (len(out) - 1),
             "loader_stalls": float(sum(c["loader_stalls"] for c in costs))}
    total = sum(fixed.values()) + sum(p.seconds for p in out)
    return RunPrediction(out, fixed, total, total - fixed["startup"])


def predict_run(prof, model, recipe, dataset_size=planner.IMAGENET_TRAIN_IMAGES,
                algorithms=ALGORITHMS):
    """RunPrediction of ``recipe`` (a RunRecipe) for ``model`` on ``prof``: the planner plans
    each phase once, :func:`sum_phases` sums them."""
    phases = planner.plan_schedule(prof, model, recipe.schedule, recipe.local_batch,
                                   algorithms=recipe_algorithms(recipe, algorithms),
                                   dataset_size=dataset_size, epochs=recipe.epochs)
    return sum_phases(prof, recipe, phases, dataset_size)


def with_compute(prof, model, b_s):
    """``prof`` with the model's seconds per image set to ``b_s``."""
    comp = model_of(prof, model)._replace(b_s=float(b_s))
    return prof._replace(models={**prof.models, model: comp})


def fit_compute(prof, model, recipe, published_s, dataset_size=planner.IMAGENET_TRAIN_IMAGES,
                algorithms=ALGORITHMS, tol_s=1e-3):
    """Seconds per image b that make ``recipe``'s predicted time ``published_s`` (bisection).

    Only b moves (a, the links and the run costs stay the profile's). Raises ValueError when
    even b = 0 predicts more than ``published_s`` (the rest of the profile is already too slow).
    """
    def total(b):
        return predict_run(with_compute(prof, model, b), model, recipe, dataset_size,
                           algorithms).timed_s
    low, high = 1e-12, 1e-3          # b > 0: a step of no time has no throughput
    if total(low) > published_s:
        raise ValueError(f"recipe {recipe.name}: even with no per-image compute the profile "
                         f"predicts {total(low):.1f} s > the published {published_s} s; "
                         f"its links, a_ms or run costs are too slow to fit")
    while total(high) < published_s:
        high *= 2
    while high - low > 1e-12 and total(high) - total(low) > tol_s:
        mid = 0.5 * (low + high)
        low, high = (mid, high) if total(mid) < published_s else (low, mid)
    return 0.5 * (low + high)
