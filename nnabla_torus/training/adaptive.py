"""The batch size from the state of learning, inside a user's own nnabla loop.

``AdaptiveBatch`` tells the loop, at each step, the per-rank batch, the gradient accumulation
and the learning-rate factor (and the global batch) that maximise goodput: throughput x
statistical efficiency, from the gradient noise scale the communicator's all-reduce measures
(docs/adaptive-batch.md). It measures the step time itself and averages it over the ranks,
so that every rank decides alike, and keeps its own all-reduces (and any other, BN
statistics) out of the noise-scale norms. It wires the package's pieces together:
:class:`~nnabla_torus.planning.controller.BatchSizeController` (the decision, bounds, priors,
learning rate), :class:`~nnabla_torus.planning.noise_scale.NoiseScaleEstimator` and
:class:`~nnabla_torus.planning.step_refit.StepTimeRefit`. examples/imagenet/train.py runs its
batch control through it.

When the batch cannot move (one rank and no prior, min_batch = max_batch, nothing to price a
larger batch), ``fixed`` says why and it is the first of ``pop_notes()``. Example (2 ranks,
``nnabla-torus-mpirun -np 2 loop.py``; the same loop as docs/planner.md, which CI runs)::

    import nnabla as nn
    import nnabla.functions as F
    import nnabla.parametric_functions as PF
    import nnabla.solvers as S
    import numpy as np

    import nnabla_torus as C
    from nnabla_torus.training import AdaptiveBatch

    comm = C.MultiProcessDataParallelCommunicator(nn.Context())
    comm.init()
    rng = np.random.default_rng(comm.rank)
    batch = AdaptiveBatch(comm, max_local_batch=256, min_batch=16, max_batch=512, base_batch=16)
    PF.affine(nn.Variable((1, 2048)), 128, name="fc")             # the parameters
    solver = S.Momentum(0.0005, 0.9)
    solver.set_parameters(nn.get_parameters())
    graphs = {}                                                    # one per (local, accum)
    for step in range(200):
        plan = batch.plan(epoch=step / 200, solvers=[solver])     # the same on every rank
        if (plan.local_batch, plan.accum_steps) not in graphs:
            x, t = nn.Variable((plan.local_batch, 2048)), nn.Variable((plan.local_batch, 128))
            loss = F.mean(F.squared_error(PF.affine(x, 128, name="fc"), t)) / plan.accum_steps
            graphs[plan.local_batch, plan.accum_steps] = x, t, loss
        x, t, loss = graphs[plan.local_batch, plan.accum_steps]
        solver.set_learning_rate(0.0005 * plan.lr_factor)
        batch.begin_step()                     # drops other all-reduces' norms, starts the clock
        solver.zero_grad()
        for micro in range(plan.accum_steps):
            x.d = rng.normal(size=x.shape)
            t.d = x.d[:, :128] + rng.normal(size=t.shape)      # noisy labels: a large phi
            loss.forward()
            loss.backward()
        comm.all_reduce([p.grad for p in nn.get_parameters().values()], division=True)
        batch.end_step()                       # the noise scale and the rank-mean step time
        solver.update()
        for line in batch.pop_notes() + ([plan.reason] if plan.changed else []):
            if comm.rank == 0:
                print(f"step {step}: {line}")
"""
import time

import numpy as np

from nnabla_torus.planning.controller import (BatchPlan, BatchSizeController, momentum_scale,
                                              resplit)
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from nnabla_torus.planning.splits import MAX_ACCUM, split_batch
from nnabla_torus.planning.step_refit import (EXCHANGE_STEPS, MIN_STEPS, WARMUP_STEPS,
                                              StepTimeRefit, describe)

DECISION_FIELDS = ("decisions", "own_decisions", "measured", "prior_overridden")


def scale_momentum(solvers, factor):
    """Multiply the momentum buffers of nnabla ``solvers`` by ``factor`` (a plan change's
    ``momentum_scale``: Goyal et al.'s momentum correction). Momentum and LARS keep the
    learning rate inside their one state (v <- m v + lr g), so it is scaled with the rate."""
    if factor == 1.0:
        return
    for solver in solvers:
        states = solver.get_states()
        for state in states.values():
            for var in state.pstate.values():
                var.d *= factor
        solver.set_states(states)


class AdaptiveBatch:
    """Batch, accumulation and learning-rate factor of each step, on every rank alike.

    ``comm``: the communicator (its ``size``; its gradient all-reduce gives the noise-scale
    norms, ``comm.track_sqnorms`` is set on). ``max_local_batch``: samples per rank per
    micro-batch at most (more are accumulated micro-batches). ``min_batch`` (B0, the start and
    the learning rate's reference, default ``comm.size``) and ``max_batch`` bound the global
    batch. ``base_batch`` and ``lr_scaling`` ("linear", "sqrt", "none") give ``lr_factor``.
    ``schedule`` (a BatchSchedule): follow it instead, nothing measured. ``throughput``: the
    cost model's samples/s at (local, accum) arrays (None: flat until measured). ``prior``
    (priors.Prior): decide on it before the run's own noise scale. ``refit_steps`` and
    ``refit_warmup``: measured steps per batch before its measured throughput is used, and
    steps left out after a change (0 steps: no measurement); ``compute_line``: the cost
    model's (a_s, b_s) for the refit's shape. ``options``: BatchSizeController's other
    keywords (``lr_at_change``, ``model_error``, ``min_samples``, ``max_rse``, ``adaptive_lr``,
    ``epochs``, ``epoch_images``, ``efficiency``, ``shrink``).
    """

    def __init__(self, comm, max_local_batch, min_batch=None, max_batch=None, base_batch=256,
                 lr_scaling="linear", schedule=None, throughput=None, prior=None,
                 refit_steps=MIN_STEPS, refit_warmup=WARMUP_STEPS, compute_line=None,
                 **options):
        self.comm = comm
        self.noise = None if schedule is not None else NoiseScaleEstimator()
        self.refit = StepTimeRefit(comm.size, compute_line, min_steps=refit_steps,
                                   warmup_steps=refit_warmup) if refit_steps else None
        # The refit's step times price batches only on several ranks: one rank's run is
        # priced by the cost model (and measures no noise scale of its own).
        deciding_refit = self.refit if comm.size > 1 else None
        self.notes = []
        if prior is not None and prior.step_times is not None and deciding_refit is not None:
            refused = deciding_refit.load_prior(prior.step_times)
            if refused:
                self.notes.append(f"batch prior: {refused}")
        self.controller = BatchSizeController(
            comm.size, max_local_batch, schedule=schedule, noise_scale=self.noise,
            base_batch=base_batch, lr_scaling=lr_scaling, min_batch=min_batch,
            max_batch=max_batch, throughput=throughput, refit=deciding_refit, prior=prior,
            **options)
        if self.noise is not None:
            comm.track_sqnorms = True
            self.noise.reference_batch = self.controller.min_batch   # EMA memory: per B0
        if self.refit is not None and compute_line is None:
            # No cost model: while one per-rank batch is measured, its compute is taken as
            # half fixed, half per sample at B0's (AdaptDL's rule, "optimistic with respect to
            # scaling up the batch size": adaptdl/speedup.py, fit). Proportional to the batch,
            # every batch would be as fast and B0 kept for good.
            b0_local = split_batch(self.controller.min_batch, comm.size, max_local_batch)[0]
            self.refit.shape = (float(b0_local), 1.0)
        self.fixed = self._why_fixed(prior, throughput)
        if self.fixed:
            self.notes.insert(0, self.fixed)
        self.exchanged = False     # True after an end_step that fed the refit new times
        self._pending = []         # (local, accum, step_s, sync_s) not yet exchanged
        self._tic = None
        self._observed = False     # the norms of this step's gradients were taken

    def _why_fixed(self, prior, throughput):
        """One line when the adaptive batch cannot move, else None."""
        ctrl = self.controller
        if self.noise is None:
            return None
        batches = np.unique(ctrl.candidates["global_batch"])
        start = f"adaptive batch: fixed at B0 = {ctrl.min_batch}: "
        if len(batches) == 1:
            return (start + f"it is the only global batch in [min_batch, max_batch] on "
                    f"{ctrl.world_size} rank(s) of at most {ctrl.max_local_batch} samples x "
                    f"{MAX_ACCUM} accumulation steps; raise max_batch")
        if ctrl.world_size == 1 and prior is None:
            return (start + "one rank measures no gradient noise scale (it compares each "
                    "rank's gradient with their average); run on 2 or more ranks, or pass a "
                    "prior")
        if throughput is None and ctrl.refit is None:
            return (start + "nothing prices a larger batch (no throughput= and "
                    "refit_steps=0): at a flat throughput B0 has the highest goodput; pass "
                    "throughput= or refit_steps > 0")
        return None

    def plan(self, epoch, solvers=()):
        """The BatchPlan of the step at fractional ``epoch`` (same on every rank):
        ``global_batch``, ``local_batch``, ``accum_steps``, ``lr_factor`` (times your
        learning rate), ``changed`` and ``reason``. At a change the momentum of ``solvers``
        (nnabla solvers) is scaled to the new rate (``scale_momentum``)."""
        before = self.controller.current
        plan = self.controller.plan(epoch)
        if plan.changed:
            scale_momentum(solvers, momentum_scale(before, plan))
        return plan

    def begin_step(self):
        """Call before the step's first forward: drops the norms of every all-reduce since the
        last step (this object's, BN statistics), starts the step's clock."""
        if self.noise is not None:
            self.comm.pop_sqnorms()
        self._observed = False
        self._tic = time.time()

    def observe_gradients(self, grad_scale=1.0):
        """Call after the gradient all-reduce (``end_step`` does when you did not): feeds its
        squared norms to the noise scale. ``grad_scale``: the FP16 loss scale the gradients
        are multiplied by. Returns the all-reduced gradients' squared norm, None on one rank or
        in schedule mode."""
        self._observed = True
        if self.noise is None:
            return None
        local_sqnorm, global_sqnorm = self.comm.pop_sqnorms()
        if self.comm.size == 1:
            return None
        plan = self.controller.current
        self.noise.update(local_sqnorm / grad_scale ** 2, plan.local_batch * plan.accum_steps,
                          global_sqnorm / grad_scale ** 2, plan.global_batch)
        return global_sqnorm

    def end_step(self, sync_s=0.0):
        """Call after the step (its update too); returns its seconds since ``begin_step``.

        ``sync_s``: the seconds the step waited for the gradient all-reduce after backward
        (0 when unknown). The times are averaged over the ranks in one all-reduce every
        ``EXCHANGE_STEPS`` steps, or as soon as the batch in use could be measured, so that a
        decision waits no longer than the refit needs (collective: call on every rank).
        """
        if self._tic is None:
            raise RuntimeError("AdaptiveBatch.end_step() without begin_step(): call "
                               "begin_step() before the step's first forward")
        if not self._observed:
            self.observe_gradients()
        step_s, self._tic = time.time() - self._tic, None
        self.exchanged = False
        if self.refit is not None:
            plan = self.controller.current
            self._pending.append((plan.local_batch, plan.accum_steps, step_s, sync_s))
            if self._exchange_due(plan):
                self._exchange()
        return step_s

    def _exchange_due(self, plan):
        refit = self.refit
        measurable = (not refit.ready(plan.local_batch, plan.accum_steps) and
                      len(self._pending) >= refit.warmup_steps + refit.min_steps)
        return len(self._pending) >= EXCHANGE_STEPS or measurable

    def _exchange(self):
        """Feed the refit the rank means of the pending step and wait seconds, all in one
        all-reduce (one per step cost ~7 ms a step on 4 ranks of a 2-core machine)."""
        refit = self.refit
        times = np.array([p[2:] for p in self._pending], np.float32)
        times = self.comm.allreduce_numpy(times) / self.comm.size
        before = refit.fit()
        for (local, accum, _, _), (step_s, wait_s) in zip(self._pending, times.tolist()):
            refit.observe(local, accum, step_s, wait_s)
        self._pending = []
        self.exchanged = True
        fit = refit.fit()
        if before is not None and before.of_prior and not fit.of_prior:
            self.notes.append(f"batch prior: this run's own step times replace the prior's "
                              f"from now on: {describe(fit)}")

    @property
    def noise_scale(self):
        """(phi in samples, its relative standard error), or None before any estimate."""
        if self.noise is None or self.noise.b_simple is None:
            return None
        return self.noise.b_simple, self.noise.rse

    def pop_notes(self):
        """Lines for the log since the last call: why the batch is fixed (first call), the
        decisions that kept the batch (a change is the plan's ``reason``), the prior's."""
        notes = self.notes + self.controller.pop_notes()
        self.notes = []
        return notes

    def state_dict(self):
        """The state a checkpoint keeps, a flat dict of numbers and numpy arrays: the plan in
        use, the noise-scale estimate, the decisions so far and the measured step times
        (``refit_steps``: rows of local, accum, step s, wait s). Pending, unexchanged step
        times are left out."""
        ctrl, state = self.controller, {"ranks": self.comm.size}
        if ctrl.current is not None:
            state.update(zip(("global_batch", "local_batch", "accum_steps", "lr_factor"),
                             ctrl.current[:4]))
        if self.noise is not None:
            noise = self.noise
            state.update(noise_sums=np.array(noise._sums, float), noise_weight=noise._weight,
                         noise_weight_sq=noise._weight_sq, noise_updates=noise.updates,
                         noise_skipped=noise.skipped,
                         noise_reference_batch=float(noise.reference_batch or 0))
            state.update((name, int(value)) for name, value in ctrl.state().items())
        if self.refit is not None:
            rows = [(m, s, step_s, sync_s) for m, s, times in self.refit.state()["samples"]
                    for step_s, sync_s in times]
            state["refit_steps"] = np.array(rows, float).reshape(-1, 4)
        return state

    def load_state_dict(self, state):
        """Continue from :meth:`state_dict` (on every rank); returns lines for the log. A state
        of another rank count keeps its global batch, split anew (``controller.resplit``), its
        decisions and noise scale, and measures the step times anew (they were that world's)."""
        ctrl, lines = self.controller, []
        if "global_batch" in state:
            ctrl.current = BatchPlan(int(state["global_batch"]), int(state["local_batch"]),
                                     int(state["accum_steps"]), float(state["lr_factor"]),
                                     False, "restored")
        if "global_batch" in state and int(state["ranks"]) != self.comm.size:
            ctrl.current, line = resplit(ctrl.current, self.comm.size, ctrl.max_local_batch,
                                         ctrl.lr_factor)
            lines.append(line)
        if self.noise is not None and "noise_sums" in state:
            noise = self.noise
            noise._sums = np.array(state["noise_sums"], float)
            noise._weight, noise._weight_sq = (float(state["noise_weight"]),
                                               float(state["noise_weight_sq"]))
            noise.updates, noise.skipped = int(state["noise_updates"]), int(state["noise_skipped"])
            noise.reference_batch = float(state["noise_reference_batch"]) or None
            lines.append(ctrl.load_state({name: state[name] for name in DECISION_FIELDS}))
        if self.refit is not None and "refit_steps" in state:
            samples = {}
            for m, s, step_s, sync_s in np.asarray(state["refit_steps"]).tolist():
                samples.setdefault((int(m), int(s)), []).append([step_s, sync_s])
            note = self.refit.load_state({"ranks": int(state["ranks"]), "samples": [
                [m, s, times] for (m, s), times in sorted(samples.items())]})
            lines += [note] if note else []
        return lines
