"""Planner: how many GPUs, which grid and all-reduce algorithm, which batch, now.

Every candidate (GPU count p, algorithm, grid X x Y, per-GPU batch b, accumulation s) is scored
with the cost model (:mod:`nnabla_torus.planning.costmodel`), all at once in numpy, by goodput
(:mod:`nnabla_torus.planning.goodput`'s, the objective the batch-size controller and the elastic
launcher use too) or by time to train under a minimum scaling efficiency. Time to train counts
the profile's fixed costs too (start-up, validation, input stalls: :mod:`.fixed_costs`); among
plans within the model's measured error of the fastest, the simplest wins (:mod:`.simplest`:
fewer GPUs, native, rows inside hosts). The scores, the candidate grids and GPU counts, and the
rack level: docs/planner.md#how-candidates-are-scored. Example (the paper's first
phase: 34,816 images at 32 per GPU)::

    >>> from nnabla_torus.planning.machine_profile import load_profile
    >>> best = plan(load_profile("abci"), "resnet50", target_batch=34816, local_batches=[32])
    >>> best.best.gpus, best.best.global_batch
    (1088, 34816)
"""
import math
import time
from collections import namedtuple

import numpy as np

from . import costmodel, goodput, simplest
from .candidates import batch_columns, gpu_counts, topology_columns
from .candidates import UnsplittableBatch, grids  # noqa: F401  (used as planner.X)
from .costmodel import ALGORITHMS
from .fixed_costs import fixed_seconds, input_wait_s, run_costs
from .machine_profile import model_of
from .profile_schema import backend_of

Plan = namedtuple("Plan", [
    "gpus", "grid", "algorithm", "local_batch", "accum_steps", "global_batch",
    "step_time_s", "images_per_s", "scaling_efficiency", "statistical_efficiency",
    "goodput", "time_to_train_s",
    "training_s",   # of time_to_train_s: the steps (dataset x epochs / goodput)
    "fixed_s",      # of time_to_train_s: start-up, validation, input stalls (fixed_costs)
], defaults=[0.0, 0.0])

PlanResult = namedtuple("PlanResult", [
    "best",        # Plan: the recommendation
    "per_gpus",    # [Plan]: the best plan for each candidate GPU count, by GPU count
    "candidates",  # {column: array}: every candidate scored (columns as in Plan)
    "seconds",     # planning time, seconds
    "kept",        # why the simplest plan was kept over a predicted-faster one ('' if not)
], defaults=[""])

IMAGENET_TRAIN_IMAGES = 1281167
BEYOND_PROFILE = 16  # beyond_profile plans up to this many times the profile's GPUs
# (abci: 69,632 GPUs, ~0.45 GB and ~3.5 s; memory grows ~6.5 KB per GPU of max_gpus)


def step_terms(net, comp, run, algorithm, p, b, s, x):
    """Seconds of one optimizer step by term: :func:`.costmodel.step_terms` and, where ``run``
    (a profile's ``run:`` block) has a loader rate, ``input_wait`` (its ``total`` included)."""
    terms = costmodel.step_terms(net, comp, algorithm, p, b, s, x)
    if run.get("loader_images_per_s"):
        terms["input_wait"] = input_wait_s(run, b * s * np.minimum(p, net.gpus_per_host),
                                           terms["total"])
        terms["total"] = terms["total"] + terms["input_wait"]
    return terms


def one_gpu_step_s(net, comp, run, b, s):
    """Seconds of the same step on one GPU, the reference of scaling efficiency: no all-reduce,
    the host's loader to itself."""
    single = (s * costmodel.compute_time(comp, 1, b, net.gpus_per_host)
              + costmodel.finite_check_s(comp))
    return single + input_wait_s(run, b * s, single)


def run_fixed_seconds(run, gpus_per_host, p, global_batch, dataset_size, epochs):
    """{startup, validation, loader_stalls: seconds} of a run on ``p`` GPUs at
    ``global_batch`` (:func:`.fixed_costs.fixed_seconds`)."""
    return fixed_seconds(run, -(-p // gpus_per_host), p, epochs,
                         np.ceil(dataset_size * epochs / global_batch))


def score(net, comp, p, algo, x, b, s, b_noise=None, base_batch=256,
          dataset_size=IMAGENET_TRAIN_IMAGES, epochs=90, run=None):
    """Score candidate arrays; returns {column: array} with the columns of Plan. ``run``: a
    profile's ``run:`` block (input pipeline, fixed costs; None: none)."""
    run = run or {"startup_s": 0.0, "loader_stall_ms": 0.0}
    step = np.empty(len(p))
    for a, name in enumerate(ALGORITHMS):
        m = algo == a
        if m.any():
            step[m] = step_terms(net, comp, run, name, p[m], b[m], s[m], x[m])["total"]
    global_batch = p * b * s
    throughput = global_batch / step
    stat = goodput.efficiency(global_batch, b_noise, base_batch)
    training = dataset_size * epochs / (throughput * stat)
    fixed = sum(run_fixed_seconds(run, net.gpus_per_host, p, global_batch, dataset_size,
                                  epochs).values())
    return {"gpus": p, "grid_x": x, "grid_y": p // x, "algorithm": algo, "local_batch": b,
            "accum_steps": s, "global_batch": global_batch, "step_time_s": step,
            "images_per_s": throughput,
            "scaling_efficiency": one_gpu_step_s(net, comp, run, b, s) / step,
            "statistical_efficiency": stat, "goodput": throughput * stat,
            "time_to_train_s": training + fixed, "training_s": training,
            "fixed_s": fixed + 0.0 * training}


def _row(cols, i):
    grid = f"{int(cols['grid_x'][i])}x{int(cols['grid_y'][i])}"
    return Plan(int(cols["gpus"][i]), grid, ALGORITHMS[int(cols["algorithm"][i])],
                int(cols["local_batch"][i]), int(cols["accum_steps"][i]),
                int(cols["global_batch"][i]), float(cols["step_time_s"][i]),
                float(cols["images_per_s"][i]), float(cols["scaling_efficiency"][i]),
                float(cols["statistical_efficiency"][i]), float(cols["goodput"][i]),
                float(cols["time_to_train_s"][i]), float(cols["training_s"][i]),
                float(cols["fixed_s"][i]))


def best_per_gpus(cols, mask=None):
    """Indices of the highest-goodput candidate for each GPU count, by GPU count.

    Candidates must be sorted by GPU count (as :func:`plan` builds them).
    """
    value = np.where(mask if mask is not None else True, cols["goodput"], -np.inf)
    counts, group = np.unique(cols["gpus"], return_inverse=True)
    starts = np.flatnonzero(np.r_[True, np.diff(group) != 0])
    top = np.maximum.reduceat(value, starts)
    hits = np.flatnonzero((value == top[group]) & np.isfinite(value))
    _, first = np.unique(group[hits], return_index=True)
    return hits[first]


def gpu_limit(prof, max_gpus=None, counts=None, beyond_profile=True):
    """The largest GPU count asked for (``max_gpus``, else ``max(counts)``, else the profile's
    GPUs). ValueError when a count is < 1, when it exceeds the profile's GPUs and not
    ``beyond_profile``, or when it exceeds ``BEYOND_PROFILE`` times them (``max_gpus`` plans
    every count up to it: ~6.5 KB each)."""
    have = prof.hosts * prof.network.gpus_per_host
    asked = [max_gpus] if max_gpus is not None else list(counts if counts is not None else [have])
    if not asked or min(asked) < 1:
        raise ValueError(f"GPU counts must be >= 1, got {asked}")
    top = int(max(asked))
    cap = have * BEYOND_PROFILE if beyond_profile else have
    if top > cap:
        fix = (f"plan at most {cap} GPUs ({BEYOND_PROFILE}x the profile)" if beyond_profile else
               f"plan at most {have}, pass --allow-beyond-profile to go up to "
               f"{have * BEYOND_PROFILE}, or describe a larger cluster in a profile file")
        raise ValueError(f"{top} GPUs is more than the {have} GPUs of profile {prof.name!r} "
                         f"({prof.hosts} hosts x {prof.network.gpus_per_host}): {fix}")
    return top


def plan(prof, model, max_gpus=None, counts=None, algorithms=ALGORITHMS, target_batch=None,
         local_batches=None, accum_steps=None, b_noise=None, base_batch=256,
         dataset_size=IMAGENET_TRAIN_IMAGES, epochs=90, min_efficiency=0.0, beyond_profile=True,
         max_global_batch=None, gpus=None):
    """Best plan for ``model`` on profile ``prof``; returns a PlanResult.

    ``target_batch``: keep the global batch fixed (a schedule phase); else every per-GPU batch
    in ``local_batches`` (default powers of two up to the memory limit) times ``accum_steps``
    is tried and B_noise (``b_noise``, samples) trades throughput against statistical
    efficiency. ``accum_steps`` defaults to (1, 2, 4, 8), or (1,) when neither a target nor
    B_noise is given (a larger batch would then look free). ``beyond_profile=False`` keeps
    GPU counts within the profile (:func:`gpu_limit`; the CLI's default).
    ``max_global_batch``: leave out larger global batches (statistical efficiency 0 beyond
    the largest batch known to train, :mod:`nnabla_torus.planning.large_batch`). ``gpus``: the
    ranks are GPUs (the NCCL backend: no MPI-only algorithm); None: as the profile's
    ``backend`` says (``profile_schema.backend_of``). Raises ValueError
    when no candidate meets ``min_efficiency``, and UnsplittableBatch (a ValueError naming
    the nearest feasible batches) when no candidate gives ``target_batch`` exactly.
    """
    start = time.perf_counter()
    net, comp = prof.network, model_of(prof, model)
    unknown = set(algorithms) - set(ALGORITHMS)
    if unknown:
        raise ValueError(f"unknown algorithm(s) {sorted(unknown)}; choose from {ALGORITHMS}")
    max_gpus = gpu_limit(prof, max_gpus, counts, beyond_profile)
    counts = np.asarray(counts if counts is not None else gpu_counts(max_gpus, net.gpus_per_host))
    if accum_steps is None:
        accum_steps = (1,) if target_batch is None and b_noise is None else (1, 2, 4, 8)
    if local_batches is None:
        local_batches = 2 ** np.arange(int(math.log2(comp.max_local_batch)) + 1)
    gpus = backend_of(prof) == "nccl" if gpus is None else gpus
    p, algo, x = topology_columns(counts, algorithms, net.gpus_per_host, gpus)
    i, b, s = batch_columns(p, target_batch, np.asarray(local_batches),
                             np.asarray(accum_steps), comp.max_local_batch)
    cols = score(net, comp, p[i], algo[i], x[i], b, s, b_noise, base_batch, dataset_size, epochs,
                 run_costs(prof))
    ok = cols["scaling_efficiency"] >= min_efficiency
    if max_global_batch is not None:
        ok &= cols["global_batch"] <= max_global_batch
    error = goodput.model_error_of(prof)
    value = {**cols, "goodput": 1.0 / cols["time_to_train_s"]}   # fastest run, fixed costs in
    best, fastest = simplest.choose(value, error, net.gpus_per_host, ALGORITHMS, ok)
    if best is None:
        top = float(cols["scaling_efficiency"].max())
        raise ValueError(f"no plan reaches scaling efficiency {min_efficiency}; the best "
                         f"candidate reaches {top:.3f}: lower --min-efficiency")
    per = [_row(cols, best if cols["gpus"][k] == cols["gpus"][best] else k)
           for k in best_per_gpus(cols, ok)]
    kept = simplest.why(value, best, fastest, error, net.gpus_per_host, ALGORITHMS)
    return PlanResult(_row(cols, best), per, cols, time.perf_counter() - start, kept)


def should_switch(current, proposed, threshold=goodput.MIN_GAIN):
    """Hysteresis: switch only when ``proposed`` (a Plan) beats ``current`` goodput by > threshold.

    AdaptDL fixed batch-size flapping with such a threshold (its issue #27: 5 %); pass the
    cost model's measured error (``goodput.model_error_of``) to switch only outside it.
    """
    if current is None:
        return True
    return proposed.goodput > current.goodput * (1.0 + threshold)


def plan_schedule(prof, model, schedule, local_batch, **kwargs):
    """GPU count per phase of a BatchSchedule at ``local_batch`` images per GPU (no accumulation).

    Returns [(start_epoch, Plan)]: the paper's 34,816 -> 69,632 at 32 per GPU gives 1,088 ->
    2,176 GPUs. Raises ValueError when a phase's batch is not a multiple of ``local_batch``.
    """
    if local_batch < 1:
        raise ValueError(f"per-GPU batch {local_batch} must be >= 1")
    phases = []
    for start, batch in schedule.phases:
        if batch % local_batch:
            raise ValueError(f"schedule batch {batch} at epoch {start:g} is not a multiple of "
                             f"the per-GPU batch {local_batch}; pick batches that divide")
        gpus = batch // local_batch
        result = plan(prof, model, counts=[gpus], target_batch=batch,
                      local_batches=[local_batch], accum_steps=[1], **kwargs)
        phases.append((start, result.best))
    return phases


def predict_efficiency(prof, model, gpus, local_batch, algorithms=ALGORITHMS):
    """Predicted weak-scaling efficiency on ``gpus`` GPUs at ``local_batch`` each (best grid)."""
    result = plan(prof, model, counts=[gpus], target_batch=gpus * local_batch,
                  local_batches=[local_batch], accum_steps=[1], algorithms=algorithms)
    return result.best.scaling_efficiency


ResizeDecision = namedtuple("ResizeDecision", [
    "gpus",               # GPU count to run the rest of the phase on
    "plan",               # Plan on ``gpus`` (grid, algorithm, local batch, accumulation)
    "resize",             # True: restart on ``gpus``; False: keep the current count
    "gain_s",             # predicted seconds saved over the phase by ``plan``'s count (no cost)
    "restart_cost_s",     # seconds one checkpoint-restart costs
    "break_even_images",  # phase length (images) from which the restart pays; inf if never
    "reason",             # one line: what, why, predicted gain
])


def plan_resize(prof, model, global_batch, current_gpus, phase_images, restart_cost_s,
                max_gpus=None, fixed_gpus=None, local_batches=None, **kwargs):
    """Whether to restart on another GPU count for the rest of a batch phase; a ResizeDecision.

    The phase has ``phase_images`` images left at ``global_batch`` (fixed by the schedule, so
    the statistical efficiency is equal and throughput decides). A restart costs
    ``restart_cost_s`` seconds (process start, import, graph build, checkpoint write and read,
    input pipeline start); it is made only when the time saved over the rest of the phase,
    ``phase_images * (1/throughput_now - 1/throughput_new)``, exceeds that cost. Break-even:
    ``restart_cost_s / (1/throughput_now - 1/throughput_new)`` images. ``current_gpus`` None
    is the first launch (no restart to pay). ``fixed_gpus`` (a fixed GPU-count schedule)
    overrides the choice, and the reason still gives the planner's prediction for it.
    ``max_gpus``: the slots that exist (default: the profile's). Example (the paper's second
    phase, 85 epochs of ImageNet at 69,632 on 1,088 GPUs)::

        d = plan_resize(load_profile("abci"), "resnet50", 69632, 1088, 85 * 1281167, 60.0,
                        local_batches=[32])
        d.gpus, d.resize        # (2176, True)
    """
    limit = prof.hosts * prof.network.gpus_per_host
    max_gpus = min(max_gpus or limit, limit)
    if local_batches is None:
        local_batches = 2 ** np.arange(int(math.log2(model_of(prof, model).max_local_batch)) + 1)
    common = dict(target_batch=global_batch, local_batches=local_batches, **kwargs)
    if fixed_gpus is not None:
        best = plan(prof, model, counts=[fixed_gpus], **common).best
    else:
        best = plan(prof, model, max_gpus=max_gpus, **common).best
    if current_gpus is None:
        why = ("fixed GPU-count schedule" if fixed_gpus is not None else
               f"the planner's fastest count up to {max_gpus}")
        return ResizeDecision(best.gpus, best, True, 0.0, 0.0, 0.0,
                              f"launch {_ranks(best.gpus)} ({best.algorithm} on {best.grid}, "
                              f"{best.local_batch} x {best.accum_steps} per rank) at global "
                              f"batch {global_batch}: {why}, predicted "
                              f"{best.images_per_s:.0f} images/s")
    now = plan(prof, model, counts=[current_gpus], **common).best
    per_image = 1.0 / now.images_per_s - 1.0 / best.images_per_s     # seconds saved per image
    gain = phase_images * per_image
    break_even = restart_cost_s / per_image if per_image > 0 else math.inf
    head = (f"global batch {global_batch}, {phase_images:.0f} images left in the phase: "
            f"{current_gpus} -> {_ranks(best.gpus)} ({best.algorithm} on {best.grid}, "
            f"{best.local_batch} x {best.accum_steps} per rank) predicted "
            f"{now.images_per_s:.0f} -> {best.images_per_s:.0f} images/s, saves {gain:.1f} s "
            f"against a restart of {restart_cost_s:.1f} s (break-even "
            f"{break_even:.3g} images)")
    if best.gpus == current_gpus:
        why = ("the fixed GPU-count schedule" if fixed_gpus is not None else
               "the planner's fastest count")
        return ResizeDecision(best.gpus, best, False, 0.0, restart_cost_s, math.inf,
                              f"keep {_ranks(current_gpus)} at global batch {global_batch}: "
                              f"{why} ({best.algorithm} on {best.grid})")
    if fixed_gpus is not None:
        return ResizeDecision(best.gpus, best, True, gain, restart_cost_s, break_even,
                              f"resize (fixed GPU-count schedule): {head}")
    if gain > restart_cost_s:
        return ResizeDecision(best.gpus, best, True, gain, restart_cost_s, break_even,
                              f"resize: {head}")
    return ResizeDecision(current_gpus, now, False, gain, restart_cost_s, break_even,
                          f"decline: {head}; the restart does not pay")


def _ranks(count):
    return f"{count} rank" + ("" if count == 1 else "s")
