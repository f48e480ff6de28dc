"""Throughput refit from the run's own step times: what a bigger batch really buys here.

The cost model's profile may not be calibrated for the machine the run is on, so adaptive
runs fit Pollux's iteration model (arXiv:2008.12260, section 3.2) with gamma = 1 on the
measured exposed all-reduce wait (``sync``) to their own steps::

    step(m, s)       = s (a + b m) + sync     seconds per optimizer step (m per rank, s accum)
    throughput(m, s) = ranks m s / step(m, s)  samples/s

The first ``warmup_steps`` after each change are left out; medians over the latest ``WINDOW``
steps per split; a line through two or more per-rank batches, else the cost model's shape
scaled; the error is the median relative residual (goodput's hysteresis). Rules in full:
docs/adaptive-batch.md, "Throughput refit". Example (2 ms a micro-batch, 1 ms a sample,
300 ms of sync on 4 ranks)::

    >>> refit = StepTimeRefit(4, min_steps=5, warmup_steps=1)
    >>> for m in (16, 32):
    ...     for _ in range(6):
    ...         refit.observe(m, 1, 0.002 + 0.001 * m + 0.3, 0.3)
    >>> fit = refit.fit()
    >>> fit.how, round(float(step_time(fit, 64, 2)), 4), round(float(fit.error), 6)
    ('line', 0.432, 0.0)
"""
from collections import deque, namedtuple

import numpy as np

WINDOW = 256   # used steps kept per split, the latest (bounds memory and the fit's cost per step)
MIN_STEPS = 5  # used steps at the batch in use before the refit replaces the cost model
WARMUP_STEPS = 2   # steps after each change left out (graph rebuild, allocator, caches)
EXCHANGE_STEPS = 10   # steps whose rank-mean times a multi-rank run exchanges in one all-reduce
                      # (examples/imagenet/run_step.py): the refit sees a step at most 9 steps late

StepFit = namedtuple("StepFit", [
    "a_s",           # seconds per micro-batch, whatever its size
    "b_s",           # seconds per sample (per rank)
    "sync_local",    # per-rank batches with a measured sync (sorted array)
    "sync_s",        # median sync seconds at each of them
    "error",         # median relative residual of the used steps
    "ranks",         # ranks the steps ran on
    "counted",       # {(m, s): used steps} of the batches the fit uses
    "how",           # "line" (two or more per-rank batches) or "shape" (the cost model's, scaled)
    "of_prior",      # True: the steps are an earlier run's (load_prior), this run has none yet
])


def check_state(state):
    """ValueError saying what is wrong unless ``state`` has :meth:`StepTimeRefit.state`'s form
    (a file edited by hand or cut short would fail later, mid-run, on every rank)."""
    try:
        ranks, samples = state["ranks"], state["samples"]
        problems = [] if isinstance(ranks, int) and ranks >= 1 else [f"ranks {ranks!r}"]
        for m, s, times in samples:
            if not (isinstance(m, int) and isinstance(s, int) and m >= 1 and s >= 1):
                problems.append(f"split {m!r} x {s!r}")
            elif not all(len(t) == 2 and np.all(np.isfinite(np.asarray(t, float))) for t in times):
                problems.append(f"a step at {m} x {s} not [step_s, sync_s] in seconds")
    except (KeyError, TypeError, ValueError) as e:     # no field, not a list, not numbers
        raise ValueError(f"not a step-time record ({type(e).__name__}: {e})") from None
    if problems:
        raise ValueError("not a step-time record: " + "; ".join(problems[:3]))


class StepTimeRefit:
    """Step times observed by a run, and the fit of :data:`StepFit` to them; see module doc.

    ``shape``: (a_s, b_s) of the cost model's compute per micro-batch at these ranks, whose
    shape the fit scales while one per-rank batch is measured (None: proportional to m).
    """

    def __init__(self, ranks, shape=None, min_steps=MIN_STEPS, warmup_steps=WARMUP_STEPS):
        if min_steps < 1 or warmup_steps < 0:
            raise ValueError(f"min_steps = {min_steps} must be >= 1 and warmup_steps = "
                             f"{warmup_steps} >= 0 (e.g. 5 and 2)")
        self.ranks, self.shape = int(ranks), shape
        self.min_steps, self.warmup_steps = int(min_steps), int(warmup_steps)
        self.samples = {}            # (m, s) -> [(step seconds, sync seconds)] used
        self.prior = {}              # the same, of an earlier run (load_prior): used until
                                     # this run has min_steps of its own at any split
        self._key, self._skip = None, 0
        self._fit = None             # fit() of the samples as they are (None: to compute)

    def observe(self, local_batch, accum_steps, step_s, sync_s):
        """Record one optimizer step at per-rank ``local_batch`` x ``accum_steps``: its
        seconds and the seconds it waited for the all-reduce (same on every rank: pass
        rank-averaged figures, or the ranks' decisions could differ)."""
        key = (int(local_batch), int(accum_steps))
        if key != self._key:
            self._key, self._skip = key, self.warmup_steps
        if self._skip > 0:
            self._skip -= 1
            return
        if np.isfinite(step_s) and np.isfinite(sync_s) and step_s > 0:
            self.samples.setdefault(key, deque(maxlen=WINDOW)).append((float(step_s),
                                                                       float(sync_s)))
            self._fit = None

    def state(self):
        """The used steps, for a checkpoint: ``{"ranks": r, "samples": [[m, s, [[step_s,
        sync_s], ...]], ...]}`` (JSON-able)."""
        return {"ranks": self.ranks, "samples": [[m, s, [list(t) for t in times]] for
                                                 (m, s), times in sorted(self.samples.items())]}

    def load_state(self, state):
        """Take the used steps of :meth:`state`; a reason string (nothing loaded) when they
        were measured on another number of ranks (their times belong to that world), else None."""
        if state["ranks"] != self.ranks:
            return (f"the checkpoint's step times were measured on {state['ranks']} ranks, "
                    f"this run has {self.ranks}: the throughput is measured anew")
        self.samples = {(int(m), int(s)): deque(map(tuple, times), maxlen=WINDOW)
                        for m, s, times in state["samples"]}
        self._fit = None
        return None

    def load_prior(self, state):
        """Take an earlier run's :meth:`state` as a prior (the same rule on the rank count as
        :meth:`load_state`). The fit uses the prior's steps until this run has ``min_steps`` of
        its own at any split, then only this run's: an earlier run's times are another
        machine state (a slower night, other jobs), and a line through its splits and this
        run's gave residuals of 11-12 % and held 128 to epoch 5 on the emulated cluster
        (docs/adaptive-batch.md, "Priors"). Returns the reason string or None."""
        if state["ranks"] != self.ranks:
            return (f"the prior's step times were measured on {state['ranks']} ranks, this run "
                    f"has {self.ranks}: not used")
        self.prior = {(int(m), int(s)): list(map(tuple, times)) for m, s, times in state["samples"]}
        self._fit = None
        return None

    def steps_at(self, local_batch, accum_steps):
        """Used (post-warm-up) steps measured at this split by this run."""
        return len(self.samples.get((int(local_batch), int(accum_steps)), ()))

    def ready(self, local_batch, accum_steps):
        """The confidence rule: ``min_steps`` used steps at the batch in use, this run's (the
        prior's while this run has none at any split, as in :meth:`fit`)."""
        key = (int(local_batch), int(accum_steps))
        fit = self.fit()
        steps = self.prior if fit is not None and fit.of_prior else self.samples
        return len(steps.get(key, ())) >= self.min_steps

    def fit(self):
        """The :data:`StepFit` of the counted batches; None while none has ``min_steps``
        (computed once per new observation: the controller asks every step, the times arrive
        every ``EXCHANGE_STEPS``)."""
        if self._fit is None:
            self._fit = self._compute_fit()
        return self._fit

    def _compute_fit(self):
        counted = {k: v for k, v in self.samples.items() if len(v) >= self.min_steps}
        of_prior = not counted
        if of_prior:
            counted = {k: v for k, v in self.prior.items() if len(v) >= self.min_steps}
        if not counted:
            return None
        keys = sorted(counted)
        local = np.array([m for m, _ in keys], float)
        times = [np.array(counted[k]) for k in keys]
        compute = np.array([np.median((t[:, 0] - t[:, 1]) / s) for t, (_, s) in zip(times, keys)])
        sync = np.array([np.median(t[:, 1]) for t in times])
        a = b = -1.0
        if len(set(local)) >= 2:
            b, a = np.polyfit(local, compute, 1)
        how = "line"
        if a < 0 or b <= 0:
            how = "shape"
            pa, pb = self.shape if self.shape is not None else (0.0, 1.0)
            shape = pa + pb * local
            k = float(np.dot(compute, shape) / np.dot(shape, shape))
            a, b = k * pa, k * pb
        by_local = {}
        for m, value in zip(local, sync):       # per-rank batches measured with several s
            by_local.setdefault(m, []).append(value)
        sync_local = np.array(sorted(by_local))
        fit = StepFit(float(a), float(b), sync_local,
                      np.array([np.median(by_local[m]) for m in sync_local]), 0.0,
                      self.ranks, {k: len(counted[k]) for k in keys}, how, of_prior)
        predicted = [step_time(fit, m, s) for m, s in keys]
        residual = np.concatenate([np.abs(t[:, 0] - want) / want
                                   for t, want in zip(times, predicted)])
        return fit._replace(error=float(np.median(residual)))


def step_time(fit, local_batch, accum_steps):
    """Predicted seconds per step at per-rank ``local_batch`` x ``accum_steps`` (arrays)."""
    local = np.asarray(local_batch, float)
    accum = np.asarray(accum_steps, float)
    nearest = np.abs(np.log(local)[..., None] - np.log(fit.sync_local)).argmin(axis=-1)
    return accum * (fit.a_s + fit.b_s * local) + fit.sync_s[nearest]


def throughput(fit, local_batch, accum_steps):
    """Predicted samples/s of the ranks at per-rank ``local_batch`` x ``accum_steps``."""
    local, accum = np.asarray(local_batch, float), np.asarray(accum_steps, float)
    return fit.ranks * local * accum / step_time(fit, local, accum)


def measured_compute(comp, fit, model_line):
    """The profile's Compute ``comp`` rescaled to the run's measured steps: the one place a
    run's own step time enters the planner (advice, algorithm, elastic resizes, the adaptive
    controller all plan with it once the fit exists).

    ``model_line`` = (a_s, b_s): the cost model's compute per micro-batch of ``comp`` at the
    fit's ranks (TrainingPlanner.compute_line). Its fixed and per-sample parts are scaled by the
    measured ones, so the cost model then predicts the measured compute at these ranks and keeps
    its own shape (slot sharing) at other rank counts (the wait beyond the model's all-reduce
    is the caller's: ``Compute.step_wait_s``)::

        >>> from nnabla_torus.planning.costmodel import Compute
        >>> comp = Compute(0.01, 0.002, 1.0, 256, 1000, 0)
        >>> fit = StepFit(0.02, 0.001, np.array([8.]), np.array([0.]), 0.0, 4, {}, "line",
        ...               False)
        >>> new = measured_compute(comp, fit, (0.01, 0.002))
        >>> round(new.a_s, 6), round(new.b_s, 6)
        (0.02, 0.001)
    """
    a_model, b_model = model_line
    scale_b = fit.b_s / b_model if b_model > 0 else 1.0
    scale_a = fit.a_s / a_model if a_model > 0 else scale_b
    return comp._replace(a_s=comp.a_s * scale_a, b_s=comp.b_s * scale_b)


def describe(fit):
    """One line of the fit's numbers, for the decision log."""
    batches = ", ".join(f"{m}x{s}: {n}" for (m, s), n in sorted(fit.counted.items()))
    syncs = ", ".join(f"{s * 1e3:.0f}" for s in fit.sync_s)
    return (f"step = accum x ({fit.a_s * 1e3:.2f} ms + {fit.b_s * 1e3:.3f} ms/sample x local) "
            f"+ sync {syncs} ms ({fit.how} fit to the steps "
            f"{'an earlier run (the prior) ' if fit.of_prior else ''}measured at local x accum: "
            f"{batches}), residual error {fit.error:.1%}")
