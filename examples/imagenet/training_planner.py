"""The planner inside the training loop: all-reduce algorithm and grid for the launched ranks.

At the first step and whenever the batch-size controller changes the global batch, every rank
scores the plans of :mod:`nnabla_torus.planning.planner` for its world size and that batch and
picks the fastest algorithm and grid, switching later only for a gain above the planner's
hysteresis (``planner.should_switch``). It also logs, as advice, the rank count the profile's
whole machine would be fastest with (the run keeps its ranks), and gives the controller's
adaptive mode its predicted throughput (:meth:`TrainingPlanner.throughput`). A network the
profile does not know is priced from its own FLOPs (``nnabla_torus.planning.model_cost``); once
the run has measured its steps (``step_refit``), every decision plans with the measured step
time (:meth:`TrainingPlanner.use_measured`). A plan is a pure
function of its inputs, so every rank computes the same one; rank 0's choice is still
broadcast (``replan_and_switch``). The rules in full: docs/planner.md#the-examples-planner.
Example::

    planner = TrainingPlanner.from_config(cfg, n_params=705608 // 4, world_size=4,
                                          dataset_size=1437, applies=True, ranks_per_host=4)
    choice, lines = planner.replan(batch_plan, in_use=("torus2d", "2x2"))
    # choice: ("ring", "4x1") to switch to, or None to keep; lines: the log, for rank 0
"""
import math

import nnabla as nn
import numpy as np

from nnabla_torus.planning import costmodel, goodput, overlap_choice, planner, step_refit
from nnabla_torus.comm.collectives import REGISTRY
from nnabla_torus.planning.costmodel import ALGORITHMS
from nnabla_torus.planning.machine_profile import Shape, load_profile, resolve_profile
from nnabla_torus.comm.topology import Grid, parse_grid

from profile_compute import find_compute
from report import ranks


def local_batch_choices(limit):
    """Per-rank batches the advice may use: powers of two up to ``limit``, and ``limit``."""
    return sorted({2 ** k for k in range(int(math.log2(limit)) + 1)} | {limit})


def plan_dict(plan):
    """The JSON form of a planner.Plan: its run settings and predicted speed."""
    return {"gpus": plan.gpus, "algorithm": plan.algorithm, "grid": plan.grid,
            "local_batch": plan.local_batch, "accum_steps": plan.accum_steps,
            "global_batch": plan.global_batch, "step_time_s": round(plan.step_time_s, 4),
            "images_per_s": round(plan.images_per_s, 1)}


class TrainingPlanner:
    """Plans of one run (profile, model, world size); see module doc."""

    def __init__(self, prof, model, note, world_size, applies, dataset_size, epochs,
                 ranks_per_host):
        self.prof, self.model, self.note = prof, model, note     # note: lines for the log
        self.world_size, self.applies = world_size, applies
        # The launched world: its real hosts (uneven ones: the profile's g, no hierarchical).
        self.here = prof._replace(network=prof.network._replace(
            gpus_per_host=ranks_per_host or prof.network.gpus_per_host))
        self.algorithms = tuple(a for a in ALGORITHMS
                                if ranks_per_host or REGISTRY[a].layout != "hosts")
        self.common = dict(dataset_size=dataset_size, epochs=epochs)
        self.batch = None        # global batch of the latest plan
        self.settled = False     # True once the algorithm in use is a plan's choice
        self.summary = None      # the latest plan's JSON form
        self.advised = world_size  # GPU count advised (starts at the launched one; moves only
        #                            by more than the model error)
        self.model_error = goodput.model_error_of(prof)
        self.estimate = prof.models[model]   # Compute before any measured step
        self.measured = None                 # step_refit.StepFit in use (None: the estimate)
        self.first_estimate = None           # plan_dict of the first plan in use (estimated)
        self.in_force = None                 # (BatchPlan, algorithm, grid) of the plan in use

    @classmethod
    def from_config(cls, cfg, n_params, world_size, dataset_size, applies, ranks_per_host,
                    gflops_per_image=None):
        """Load the profile (the one rule: machine_profile.resolve_profile), reshaped by
        --hosts/--gpus-per-host/--inter-bandwidth/--gpu-model, and plan for this model: its
        gradient bytes, cfg.local_batch limit, its compute (find_compute; ``gflops_per_image``
        from model_cost.count_cost prices a network the profile does not know).

        ``applies``: whether the run follows the plan (``--algorithm planned``, no ``--grid``) or
        only logs it. ``ranks_per_host``: of the launched world (``comm.hosts.ranks_per_host``,
        0 when hosts hold unequal numbers). Raises ValueError for an unknown profile.
        """
        name, why = resolve_profile(cfg.profile, gpus=cfg.context != "cpu")
        prof = load_profile(name, Shape(cfg.hosts or None, cfg.gpus_per_host or None,
                                        cfg.inter_bandwidth or None, cfg.gpu_model or None))
        model, comp, note = find_compute(prof, cfg.arch, cfg.width, cfg.image_size,
                                         gflops_per_image)
        # Gradients are all-reduced in the training precision; the recipe bounds the batch.
        comp = comp._replace(grad_bytes=n_params * (2 if cfg.type_config == "half" else 4),
                             max_local_batch=cfg.local_batch)
        lines = ([f"profile {prof.name} ({why})"] +
                 [f"profile reshaped: {n}" for n in prof.extra["shape"]] + [note] * bool(note))
        prof = prof._replace(models={model: comp})
        return cls(prof, model, lines, world_size, applies, dataset_size, cfg.epochs,
                   ranks_per_host)

    def overlap_choice(self, local_batch, grid_x):
        """overlap_choice.OverlapChoice for this world at ``local_batch`` per rank (torus on
        rows of ``grid_x``): torus2d after backward or native overlapped."""
        return overlap_choice.choose(self.here.network, self.prof.models[self.model],
                                     self.world_size, local_batch, grid_x)

    def score(self, batch_plan, algorithm, grid):
        """planner.Plan of running ``algorithm`` on ``grid`` ("XxY") at ``batch_plan``."""
        net, comp = self.here.network, self.prof.models[self.model]
        columns = planner.score(
            net, comp, np.array([self.world_size]), np.array([ALGORITHMS.index(algorithm)]),
            np.array([parse_grid(grid).x]), np.array([batch_plan.local_batch]),
            np.array([batch_plan.accum_steps]), **self.common)
        return planner._row(columns, 0)

    def best_here(self, batch_plan):
        """The fastest planner.Plan on the launched ranks at the controller's split."""
        return planner.plan(self.here, self.model, counts=[self.world_size],
                            algorithms=self.algorithms, target_batch=batch_plan.global_batch,
                            local_batches=[batch_plan.local_batch],
                            accum_steps=[batch_plan.accum_steps], **self.common).best

    def best_anywhere(self, global_batch, counts=None):
        """The fastest planner.Plan at ``global_batch`` over every rank count of the profile
        (or over ``counts``); planner.UnsplittableBatch when no rank count splits it exactly."""
        limit = self.prof.models[self.model].max_local_batch
        return planner.plan(self.prof, self.model, target_batch=global_batch, counts=counts,
                            local_batches=local_batch_choices(limit), **self.common).best

    def advise(self, global_batch):
        """The rank count to advise at ``global_batch``: the fastest, unless the count advised
        before is within the model error of it (hysteresis). Returns (Plan, held Plan or None)."""
        best = self.best_anywhere(global_batch)
        if best.gpus == self.advised:
            self.advised = best.gpus
            return best, None
        try:
            before = self.best_anywhere(global_batch, counts=[self.advised])
        except planner.UnsplittableBatch:   # the count advised before cannot run this batch
            self.advised = best.gpus
            return best, None
        if planner.should_switch(before, best, max(goodput.MIN_GAIN, self.model_error)):
            self.advised = best.gpus
            return best, None
        return before, best

    def compute_line(self, comp=None):
        """(a_s, b_s): the cost model's seconds per micro-batch of the launched ranks as
        a_s + b_s x local_batch (the shape the step-time refit scales to its measurements), of
        ``comp`` (None: the compute planned with now)."""
        net, comp = self.here.network, comp or self.prof.models[self.model]
        a, a_plus_b = (float(costmodel.compute_time(comp, self.world_size, m, net.gpus_per_host))
                       for m in (0, 1))
        return a, a_plus_b - a

    def use_measured(self, fit):
        """Plan every later decision (algorithm and grid, rank-count advice, elastic resizes,
        the adaptive controller's prediction) with the run's measured step time: the estimate
        rescaled to ``fit`` (step_refit.measured_compute; None: nothing measured yet), plus
        the wait the fit measured beyond the model's all-reduce at the plan in force
        (``Compute.step_wait_s``, on every plan of more than one rank: rank skew or a busy
        scheduler, which the model has no term for; a model slower than the run keeps its
        own). Returns the log line when it first takes effect, else None."""
        if fit is None:
            return None
        first = self.measured is None
        self.measured = fit
        comp = step_refit.measured_compute(self.estimate, fit, self.compute_line(self.estimate))
        self.prof.models[self.model] = comp
        if self.in_force is None:
            return None
        batch_plan, algorithm, grid = self.in_force
        modelled = self.score(batch_plan, algorithm, grid).step_time_s
        measured = float(step_refit.step_time(fit, batch_plan.local_batch,
                                              batch_plan.accum_steps))
        wait = max(0.0, measured - modelled) if self.world_size > 1 else 0.0
        self.prof.models[self.model] = comp._replace(step_wait_s=wait)
        now = self.score(batch_plan, algorithm, grid)
        if self.summary is not None:        # the monitors' prediction follows the newest fit
            self.summary["in_use"] = plan_dict(now)
        if not first:
            return None
        before = self.first_estimate["images_per_s"] if self.first_estimate else float("nan")
        waits = (f"; {wait * 1e3:.1f} ms a step of it is waiting the model's all-reduce does "
                 f"not explain, added to every plan on more than one rank" if wait else "")
        return (f"planner: the run's measured step time replaces the estimate from now on: "
                f"{algorithm} on {grid} at {batch_plan.local_batch} x {batch_plan.accum_steps} "
                f"per rank, estimated {rate(before)} -> measured {rate(now.images_per_s)} images/s "
                f"({step_refit.describe(fit)}{waits})")

    def run_summary(self):
        """The plan for the run's summary JSON: the plan in force at the end priced with the
        measured step time (``in_use``) beside the first estimate (``first_estimate``) and
        ``step_time_source`` ("measured" or "estimate"); None before any plan."""
        if self.summary is None:
            return None
        out = dict(self.summary, first_estimate=self.first_estimate,
                   step_time_source="measured" if self.measured is not None else "estimate")
        if self.in_force is not None:
            out["in_use"] = plan_dict(self.score(*self.in_force))
        return out

    def throughput(self, local_batch, accum_steps):
        """Predicted samples/s of the launched ranks at per-rank ``local_batch`` x
        ``accum_steps`` (arrays), with the fastest algorithm (its default grid)."""
        net, comp = self.here.network, self.prof.models[self.model]
        local, accum = np.asarray(local_batch), np.asarray(accum_steps)
        step = np.min([costmodel.step_time(net, comp, a, self.world_size, local, accum)
                       for a in self.algorithms], axis=0)
        return self.world_size * local * accum / step

    def replan(self, batch_plan, in_use):
        """Return (choice, log lines) for ``batch_plan`` with ``in_use`` = (algorithm, grid).

        ``choice`` is (algorithm, grid) to switch to, or None to keep ``in_use``; the grid is
        None for the algorithms that take none. Call at the first step and at batch changes.
        The first call takes the best plan outright; once ``settled`` (after a choice, or set
        when a checkpoint restores one) only a gain above the hysteresis threshold switches.
        """
        first = self.batch is None
        self.batch = batch_plan.global_batch
        best = self.best_here(batch_plan)
        current = self.score(batch_plan, *in_use) if in_use[1] else None
        head = (f"planner ({self.prof.name}): global batch {self.batch} on "
                f"{ranks(self.world_size)} ({batch_plan.local_batch} x "
                f"{batch_plan.accum_steps} each): ")
        lines = [f"planner: {line}" for line in self.note] if first else []
        choice, kept = None, current
        if not self.applies:
            lines.append(head + f"{best.algorithm} on {best.grid} predicted "
                         f"{ratio(best, current)} of {in_use[0]} on {in_use[1]}; keeping "
                         f"{in_use[0]} as set (--algorithm planned and no --grid let it choose)")
        elif (best.algorithm, best.grid) == tuple(in_use):
            lines.append(head + f"{best.algorithm} on {best.grid}, predicted "
                         f"{best.step_time_s:.3g} s/step, {rate(best.images_per_s)} images/s")
        elif not self.settled or current is None or planner.should_switch(current, best):
            grid = best.grid if REGISTRY[best.algorithm].takes_grid else None
            choice, kept = (best.algorithm, grid), best
            lines.append(head + f"{best.algorithm} on {best.grid}, predicted "
                         f"{best.step_time_s:.3g} s/step, {rate(best.images_per_s)} images/s"
                         + ("" if not self.settled or current is None else
                            f" (switching from {in_use[0]} on {in_use[1]}: "
                            f"{ratio(best, current)})"))
        else:
            lines.append(head + f"keeping {in_use[0]} on {in_use[1]} ({best.algorithm} on "
                         f"{best.grid} would be {ratio(best, current)}, below the "
                         f"switching threshold)")
        self.settled = self.settled or self.applies
        running = kept or best
        self.in_force = (batch_plan, running.algorithm, running.grid)
        self.first_estimate = self.first_estimate or plan_dict(running)
        try:
            anywhere, held = self.advise(self.batch)
        except planner.UnsplittableBatch as e:   # advice only for the batch being trained
            lines.append(f"planner: no advice on the rank count: {e}")
            self.summary = {"profile": self.prof.name, "model": self.model,
                            "global_batch": self.batch, "recommended": None,
                            "in_use": plan_dict(kept or best), "speedup": None}
            return choice, lines
        lines.append(self.advice(anywhere, kept or best, held))
        self.summary = {"profile": self.prof.name, "model": self.model,
                        "global_batch": self.batch, "recommended": plan_dict(anywhere),
                        "in_use": plan_dict(kept or best),
                        "speedup": round(anywhere.goodput / (kept or best).goodput, 3)}
        return choice, lines

    def advice(self, anywhere, running, held=None):
        """One line: the rank count the profile's machine would be fastest with, versus now;
        ``held``: a faster count not advised because its gain is inside the model error."""
        within = "" if held is None else (
            f": {ranks(held.gpus)} would be {held.goodput / anywhere.goodput:.2f}x as fast, a "
            f"gain inside the cost model's error "
            f"{max(goodput.MIN_GAIN, self.model_error):.0%}")
        split = f"{anywhere.local_batch}" + (f" x {anywhere.accum_steps} accumulation"
                                            if anywhere.accum_steps > 1 else "")
        if anywhere.gpus == self.world_size:
            verdict = "are the fastest choice of" if held is None else "are kept on"
            return (f"planner: at global batch {self.batch} the {ranks(self.world_size)} as "
                    f"launched {verdict} {self.prof.name}{within}")
        gain = anywhere.goodput / running.goodput
        verdict = (f"predicted {gain:.2f}x faster" if gain >= 1.01 else
                   f"predicted as fast ({gain:.2f}x) with fewer ranks")
        return (f"planner: at global batch {self.batch} {self.prof.name} would be fastest with "
                f"{ranks(anywhere.gpus)} x {split} ({anywhere.algorithm} on {anywhere.grid}, "
                f"{verdict}); running {ranks(self.world_size)} as launched{within}")


def rate(images_per_s):
    """images/s as "1,894,706", "97", "0.282" (three significant digits below 100)."""
    return f"{images_per_s:,.0f}" if images_per_s >= 100 else f"{images_per_s:.3g}"


def ratio(faster, slower):
    """"1.40x faster" or "0.95x (slower)" of two plans' goodput; "?" without ``slower``."""
    if slower is None:
        return "?"
    r = faster.goodput / slower.goodput
    return f"{r:.2f}x faster" if r >= 1 else f"{r:.2f}x (slower)"


def replan_and_switch(training_planner, batch_plan, comm, log):
    """Plan for ``batch_plan`` and switch ``comm`` to rank 0's choice (collective)."""
    choice, lines = training_planner.replan(batch_plan, (comm.algorithm, str(comm.grid)))
    for line in lines:
        log(line)
    # Every rank planned the same; rank 0's choice is sent anyway so no rounding can split them.
    grid = parse_grid(choice[1]) if choice and choice[1] else None
    code = np.array([-1, 0, 0], np.float32) if choice is None else np.array(
        [ALGORITHMS.index(choice[0]), grid.x if grid else 0, grid.y if grid else 0], np.float32)
    sent = nn.NdArray.from_numpy_array(code)
    comm.bcast([sent], src=0, inplace=True)
    algorithm, x, y = (int(v) for v in sent.data)
    if algorithm >= 0:
        comm.set_algorithm(ALGORITHMS[algorithm], Grid(x, y) if x else None)
