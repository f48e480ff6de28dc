"""Batch-size controller: the training loop asks it "what batch now?" each step or epoch.

The target global batch comes from a :class:`~nnabla_torus.planning.schedules.BatchSchedule`
or, in adaptive mode, from goodput (:mod:`nnabla_torus.planning.goodput`): the batch this world
can realise between ``min_batch`` (B0) and ``max_batch`` with the highest throughput x E(B)
at the low end of phi's one-error band (``goodput.decide``). With a ``prior``
(:mod:`~nnabla_torus.planning.priors`: an earlier run's or a published noise scale) the first
decision is at step 0, or where the prior starts (``Prior.starts``), on the prior, until the
run's own estimate is trustworthy; without one (and before the prior starts), the first
decision waits while measuring pays for the run's length (``goodput.waiting``). After the
first decision on the run's own estimate the batch only grows (``shrink=True``: both ways). With
``efficiency`` (:mod:`~nnabla_torus.planning.efficiency_fit`: a factor on phi fitted to fixed runs
of the task) phi is the noise scale times that factor, its error added to phi's, and
``max_batch`` is at most the largest batch of those runs.
The throughput is the cost model's (``throughput``) until ``refit``
(:class:`~nnabla_torus.planning.step_refit.StepTimeRefit`) has measured the batch in use. No
decision before the noise scale is trustworthy (``min_samples``, ``max_rse``); a change only
when the predicted gain exceeds the prediction's error; every decision logged once with its
numbers (docs/adaptive-batch.md gives the rules and why). The rule is
:mod:`~nnabla_torus.planning.goodput_choice`'s, on the batches and splits of
:mod:`~nnabla_torus.planning.batch_candidates`; this module keeps their state, realises each
plan and logs it.

A batch is realised as ``world_size x local_batch x accum_steps`` (``local_batch <=
max_local_batch``): ``split_batch``'s split (the fewest accumulation steps) on a schedule, in
adaptive mode the split of each batch fastest at the low end of its throughput error. The
learning rate follows ``lr_scaling`` from ``base_batch`` (linear: Goyal et al.); in adaptive
mode the same rule at the batch (``adaptive_lr="scaling"``, the default) or B0's rate times the
goodput gain (``"gain"``, Pollux/AdaScale); ``lr_at_change="keep"`` keeps the first batch's
rate (Smith et al., arXiv:1711.00489). Example (the paper's 34K -> 68K at epoch 5 on a fixed
1,088 ranks takes 2 micro-batches; the paper doubled the GPUs instead)::

    >>> from nnabla_torus.planning.schedules import BatchSchedule
    >>> ctrl = BatchSizeController(1088, 32, schedule=BatchSchedule.parse("0:34816,5:69632"))
    >>> p = ctrl.plan(5.0)
    >>> p.global_batch, p.local_batch, p.accum_steps, p.lr_factor, p.changed
    (69632, 32, 2, 272.0, True)
"""
import logging
import math
from collections import namedtuple

import numpy as np

from . import goodput
from .batch_candidates import candidate_table
from .goodput_choice import GoodputChoice
from .splits import MAX_ACCUM, split_batch

LOG = logging.getLogger("nnabla_torus.planning.controller")

BatchPlan = namedtuple("BatchPlan", [
    "global_batch",   # samples per optimizer step = world_size * local_batch * accum_steps
    "local_batch",    # samples per rank per micro-batch (<= max_local_batch)
    "accum_steps",    # micro-batches accumulated per optimizer step
    "lr_factor",      # multiply the schedule's learning rate by this
    "changed",        # True when this plan differs from the previous one
    "reason",         # why this plan (logged when it changes)
])

LR_SCALINGS = ("linear", "sqrt", "none")
LR_AT_CHANGE = ("linear", "keep")
ADAPTIVE_LRS = ("scaling", "gain")   # adaptive lr at B, default first: lr_scaling's rule at B,
                                     # or B0's rate x the goodput gain (docs/adaptive-batch.md)
MIN_SAMPLES = 5                      # noise-scale samples before any decision on them (fewer
                                     # leave the EMA's own error estimate meaningless); the first
                                     # decision waits longer while that pays (goodput.waiting)
MAX_RSE = 0.5                        # largest relative standard error of phi a decision may use
                                     # (the hysteresis prices phi's error exactly at any rse)


def momentum_scale(before, after):
    """Factor for the momentum buffer when the plan changes from ``before`` to ``after``
    (BatchPlans; ``before`` None at the start): the ratio of their learning-rate factors.

    nnabla's Momentum and LARS keep the rate inside the buffer (v <- m v + lr g, w <- w - v),
    so after a rate jump of k the buffer still holds steps of the old rate and needs about
    1 / (1 - m) steps to catch up: a run switched from 64 to 256 after warm-up holds a quarter
    of the buffer a fixed 256 run holds and loses about m / (1 - m) x 3/4 = 6.75 of its steps
    (m = 0.9). Scaling the buffer by k is Goyal et al.'s momentum correction (arXiv:1706.02677,
    section 2.2); after it the buffer is the fixed run's (for a constant gradient, exactly).

    >>> a = BatchPlan(64, 16, 1, 1.0, True, ""); b = a._replace(global_batch=256, lr_factor=4.0)
    >>> momentum_scale(None, a), momentum_scale(a, b), momentum_scale(b, a)
    (1.0, 4.0, 0.25)
    """
    if before is None or before.lr_factor <= 0:
        return 1.0
    return float(after.lr_factor / before.lr_factor)


def resplit(saved, size, max_local_batch, lr_factor):
    """(BatchPlan, message): ``saved`` (a BatchPlan or its list, a checkpoint's) split over
    ``size`` ranks of at most ``max_local_batch`` a micro-batch.

    The global batch stays; when ``size`` ranks cannot realise it exactly, the nearest global
    batch is used (learning-rate factor ``lr_factor(batch)``) and the message says so.
    """
    plan = BatchPlan(*saved)
    local, accum = split_batch(plan.global_batch, size, max_local_batch)
    batch = size * local * accum
    message = (f"resize: global batch {plan.global_batch} as {size} ranks x {local} x {accum} "
               f"accumulation (was {plan.local_batch} x {plan.accum_steps} per rank)")
    if batch != plan.global_batch:
        message += (f"; {plan.global_batch} does not split over {size} ranks: falling back to "
                    f"global batch {batch}, the nearest split")
    return plan._replace(global_batch=batch, local_batch=local, accum_steps=accum,
                         lr_factor=lr_factor(batch), changed=False, reason=message), message


class BatchSizeController(GoodputChoice):
    """Choose the global batch and LR factor per step or epoch; see module doc."""

    def __init__(self, world_size, max_local_batch, schedule=None, noise_scale=None,
                 base_batch=256, lr_scaling="linear", min_batch=None, max_batch=None,
                 lr_at_change="linear", throughput=None, model_error=goodput.MIN_GAIN,
                 min_samples=MIN_SAMPLES, max_rse=MAX_RSE, refit=None,
                 adaptive_lr=ADAPTIVE_LRS[0], prior=None, epochs=None, epoch_images=None,
                 efficiency=None, shrink=False):
        if (schedule is None) == (noise_scale is None):
            raise ValueError("give exactly one of schedule= (a BatchSchedule) or noise_scale= "
                             "(a NoiseScaleEstimator)")
        if lr_scaling not in LR_SCALINGS:
            raise ValueError(f"unknown lr_scaling {lr_scaling!r}; choose one of {LR_SCALINGS}")
        if lr_at_change not in LR_AT_CHANGE:
            raise ValueError(f"unknown lr_at_change {lr_at_change!r}; choose one of {LR_AT_CHANGE}")
        if adaptive_lr not in ADAPTIVE_LRS:
            raise ValueError(f"unknown adaptive_lr {adaptive_lr!r}; choose one of {ADAPTIVE_LRS}")
        self.lr_at_change, self.adaptive_lr = lr_at_change, adaptive_lr
        if world_size < 1 or max_local_batch < 1 or base_batch < 1:
            raise ValueError(f"world_size={world_size}, max_local_batch={max_local_batch} and "
                             f"base_batch={base_batch} must all be >= 1")
        self.world_size, self.max_local_batch = int(world_size), int(max_local_batch)
        self.schedule, self.noise_scale = schedule, noise_scale
        self.base_batch, self.lr_scaling = int(base_batch), lr_scaling
        self.min_batch = int(min_batch or world_size)
        self.max_batch = int(max_batch or world_size * max_local_batch * MAX_ACCUM)
        if self.min_batch > self.max_batch:
            raise ValueError(f"min_batch={self.min_batch} > max_batch={self.max_batch}")
        self.model_error, self.min_samples, self.max_rse = float(model_error), min_samples, max_rse
        self.current = None
        self.decisions = 0          # adaptive: decisions taken (0: still waiting for confidence)
        self.own_decisions = 0      # adaptive: those on the run's own noise scale (not a prior)
        self.shrink = shrink        # adaptive: may a decision after the first own one lower B?
        self._held = set()          # adaptive: epochs whose held-back batch was logged
        self.notes = []             # adaptive: decisions that kept the batch, for the caller's log
        self.refit = refit          # adaptive: step_refit.StepTimeRefit of this run, or None
        self.measured = False       # adaptive: True once a decision used the refit
        self.prior = prior          # adaptive: priors.Prior to decide on before measuring, or None
        self.efficiency = efficiency    # adaptive: efficiency_fit.Scale on phi, or None (B_simple)
        self.prior_overridden = False   # adaptive: True once the run's own phi replaced it
        self.epochs = epochs        # adaptive: the run's length in epochs (prior, pricing)
        self.run_images = (epochs * epoch_images if epochs and epoch_images else None)
        fitted_up_to = efficiency.largest_batch if efficiency is not None else None
        if noise_scale is not None and fitted_up_to and fitted_up_to < self.max_batch:
            capped = max(self.min_batch, fitted_up_to)
            self.notes.append(f"goodput: max_batch {self.max_batch} -> {capped}: the efficiency "
                              f"fit's runs went up to batch {fitted_up_to}, and its factor is "
                              f"not taken past them")
            self.max_batch = capped
        if noise_scale is not None:
            self.candidates = candidate_table(self.world_size, self.max_local_batch,
                                              self.min_batch, self.max_batch, throughput)
            self._realise_bounds(min_batch)

    def _realise_bounds(self, asked_min):
        """Move ``min_batch`` (B0) and ``max_batch`` onto the realisable batches between them,
        saying so in ``notes``; ValueError when none is realisable (at start, not mid-run)."""
        batches = self.candidates["global_batch"]
        if not len(batches):
            local, accum = split_batch(self.min_batch, self.world_size, self.max_local_batch)
            raise ValueError(
                f"no global batch in [{self.min_batch}, {self.max_batch}] is realisable on "
                f"{self.world_size} ranks (ranks x per-rank batch <= {self.max_local_batch} x "
                f"accumulation steps); the nearest is "
                f"{self.world_size * local * accum}: widen --min-batch / --max-batch")
        low, high = int(batches[0]), int(batches[-1])
        if low != self.min_batch:
            self.notes.append(f"goodput: min_batch {asked_min or self.min_batch} is not "
                              f"realisable on {self.world_size} ranks: B0 = {low}, the smallest "
                              f"realisable batch >= it (its learning rate, its efficiency)")
        if high != self.max_batch:
            self.notes.append(f"goodput: the largest realisable batch <= max_batch "
                              f"{self.max_batch} on {self.world_size} ranks is {high}")
        self.min_batch, self.max_batch = low, high

    def lr_factor(self, global_batch):
        """LR multiplier for ``global_batch`` under the scaling rule."""
        ratio = global_batch / self.base_batch
        return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.lr_scaling]

    def plan(self, epoch):
        """BatchPlan for fractional ``epoch``; logs the reason when the plan changes."""
        if self.schedule is None:
            return self._plan_adaptive(epoch)
        start, target = self.schedule.phase(epoch)
        return self._set(epoch, target, f"schedule phase from epoch {start:g}: global batch "
                                        f"{target}")

    def _split(self, target):
        """(local_batch, accum_steps) of ``target``: in adaptive mode a candidate's first split
        (``split_batch``'s, where the candidate rounded it)."""
        if self.schedule is None:
            batches = self.candidates["global_batch"]
            i = int(np.searchsorted(batches, target))
            if i < len(batches) and batches[i] == target:
                return (int(self.candidates["local_batch"][i]),
                        int(self.candidates["accum_steps"][i]))
        return split_batch(target, self.world_size, self.max_local_batch)

    def _set(self, epoch, target, why, factor=None, split=None):
        """Realise ``target`` (as ``split``, else ``_split``'s); a new plan (logged) when its
        global batch differs from now."""
        local, accum = split or self._split(target)
        global_batch = self.world_size * local * accum
        if self.current is not None and global_batch == self.current.global_batch:
            self.current = self.current._replace(changed=False)
            return self.current
        keep = self.lr_at_change == "keep"
        start = self.schedule.batch(0) if self.schedule is not None else self.min_batch
        if factor is None:
            factor = self.lr_factor(start if keep else global_batch)
            rule = f"{self.lr_scaling} scaling from {self.base_batch}" + (
                f" at the starting batch {start}, kept at batch changes" if keep else "")
        else:
            rule = (f"{self.lr_scaling} scaling from {self.base_batch}" +
                    (f" at B0 = {start}, kept at batch changes" if keep else
                     "" if self.adaptive_lr == "scaling" else
                     f" at B0 = {start} x the goodput gain"))
        reason = (f"epoch {epoch:.2f}: {why}; realised as {self.world_size} ranks x "
                  f"{local} x {accum} accumulation = {global_batch}, "
                  f"lr x {factor:.4g} ({rule})")
        self.current = BatchPlan(global_batch, local, accum, factor, True, reason)
        LOG.info(reason)
        return self.current

    def _note(self, epoch, text):
        self.notes.append(f"epoch {epoch:.2f}: {text}")
        LOG.info(self.notes[-1])

    def state(self):
        """The adaptive decisions so far, for a checkpoint (JSON-able): a resumed run continues
        them instead of starting the first-decision rules (confidence, price, prior) again."""
        return {"decisions": self.decisions, "own_decisions": self.own_decisions,
                "measured": self.measured, "prior_overridden": self.prior_overridden}

    def load_state(self, state):
        """Continue from :meth:`state`; returns one line for the log."""
        self.decisions, self.measured, self.prior_overridden = (
            int(state["decisions"]), bool(state["measured"]), bool(state["prior_overridden"]))
        self.own_decisions = int(state.get("own_decisions", self.decisions))   # older
        #                                                  checkpoints: every decision counted
        return (f"the batch-size controller continues after {self.decisions} decision(s)"
                + (", on measured step times" if self.measured else "")
                + (", on the run's own noise scale (not the prior)" if self.prior_overridden
                   else ""))

    def pop_notes(self):
        """The decisions since the last call that kept the batch (a change is in plan.reason)."""
        notes, self.notes = self.notes, []
        return notes
