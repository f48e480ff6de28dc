"""Batch-size controller: the training loop asks it "what batch now?" each step or epoch.

The target global batch comes from a :class:`~nnabla_torus.schedules.BatchSchedule` or from the
measured gradient noise scale (B_simple, McCandlish et al.: the critical batch). It is realised
as ``world_size x local_batch x accum_steps`` with ``local_batch <= max_local_batch`` (memory),
and the learning rate is scaled for it: ``linear`` (Goyal et al.: lr x B/base_batch), ``sqrt``
(lr x sqrt(B/base_batch)) or ``none``. At a later change of the batch, ``lr_at_change``
says what the rate does: ``linear`` follows the rule above, ``keep`` keeps the rate of the
starting batch (the schedule's first, or ``min_batch``) whatever the batch: batch-size
control as a replacement for decaying the rate (Smith et al., "Don't Decay the Learning Rate,
Increase the Batch Size", arXiv:1711.00489). Every change is logged with its ``reason``.

Example (the paper: 34K -> 68K at epoch 5 on a fixed world of 1,088 ranks takes 2 micro-batches
from epoch 5 on; the paper doubled the GPUs instead, see planner.plan_schedule)::

    >>> from nnabla_torus.schedules import BatchSchedule
    >>> ctrl = BatchSizeController(1088, 32, schedule=BatchSchedule.parse("0:34816,5:69632"))
    >>> p = ctrl.plan(5.0)
    >>> p.global_batch, p.local_batch, p.accum_steps, p.lr_factor, p.changed
    (69632, 32, 2, 272.0, True)
"""
import logging
import math
from collections import namedtuple

LOG = logging.getLogger("nnabla_torus.controller")

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


def split_batch(target, world_size, max_local_batch):
    """(local_batch, accum_steps) for a global batch near ``target`` on ``world_size`` ranks.

    ``accum_steps`` is the fewest that keeps ``local_batch <= max_local_batch``; with it,
    ``local_batch`` is the one whose ``world_size * local_batch * accum_steps`` is closest to
    ``target`` (equal when ``target`` splits exactly).

    >>> split_batch(69632, 1088, 32), split_batch(1000, 3, 64), split_batch(128, 3, 32)
    ((32, 2), (56, 6), (21, 2))
    """
    per_rank = max(1, round(target / world_size))
    accum = max(1, math.ceil(per_rank / max_local_batch))
    local = max(1, min(max_local_batch, round(target / (world_size * accum))))
    return local, accum


class BatchSizeController:
    """Choose the global batch and LR factor per step or epoch; see module doc."""

    def __init__(self, world_size, max_local_batch, schedule=None, noise_scale=None,
                 base_batch=256, lr_scaling="linear", min_batch=None, max_batch=None,
                 hysteresis=0.05, lr_at_change="linear"):
        if (schedule is None) == (noise_scale is None):
            raise ValueError("give exactly one of schedule= (a BatchSchedule) or noise_scale= "
                             "(a NoiseScaleEstimator)")
        if lr_scaling not in LR_SCALINGS:
            raise ValueError(f"unknown lr_scaling {lr_scaling!r}; choose one of {LR_SCALINGS}")
        if lr_at_change not in LR_AT_CHANGE:
            raise ValueError(f"unknown lr_at_change {lr_at_change!r}; choose one of {LR_AT_CHANGE}")
        self.lr_at_change = lr_at_change
        if world_size < 1 or max_local_batch < 1 or base_batch < 1:
            raise ValueError(f"world_size={world_size}, max_local_batch={max_local_batch} and "
                             f"base_batch={base_batch} must all be >= 1")
        self.world_size, self.max_local_batch = int(world_size), int(max_local_batch)
        self.schedule, self.noise_scale = schedule, noise_scale
        self.base_batch, self.lr_scaling = int(base_batch), lr_scaling
        self.min_batch = int(min_batch or world_size)
        self.max_batch = int(max_batch or world_size * max_local_batch * 64)
        if self.min_batch > self.max_batch:
            raise ValueError(f"min_batch={self.min_batch} > max_batch={self.max_batch}")
        self.hysteresis = float(hysteresis)
        self.current = None

    def lr_factor(self, global_batch):
        """LR multiplier for ``global_batch`` under the scaling rule."""
        ratio = global_batch / self.base_batch
        return {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.lr_scaling]

    def _target(self, epoch):
        """(target global batch, why) from the schedule or the noise scale."""
        if self.schedule is not None:
            start, batch = self.schedule.phase(epoch)
            return batch, f"schedule phase from epoch {start:g}: global batch {batch}"
        b_noise = self.noise_scale.b_simple
        if b_noise is None:
            start = self.current.global_batch if self.current else self.min_batch
            return start, "noise scale not yet measured: keep the starting batch"
        target = min(max(b_noise, self.min_batch), self.max_batch)
        return target, f"noise scale B_simple={b_noise:.0f} -> target batch {target:.0f}"

    def plan(self, epoch):
        """BatchPlan for fractional ``epoch``; logs the reason when the plan changes."""
        target, why = self._target(epoch)
        if (self.noise_scale is not None and self.current is not None
                and abs(target - self.current.global_batch)
                <= self.hysteresis * self.current.global_batch):
            self.current = self.current._replace(changed=False)
            return self.current
        local, accum = split_batch(target, self.world_size, self.max_local_batch)
        global_batch = self.world_size * local * accum
        changed = self.current is None or global_batch != self.current.global_batch
        if not changed:
            self.current = self.current._replace(changed=False)
            return self.current
        keep = self.lr_at_change == "keep"
        start = self.schedule.batch(0) if self.schedule is not None else self.min_batch
        factor = self.lr_factor(start if keep else global_batch)
        rule = f"{self.lr_scaling} scaling from {self.base_batch}" + (
            f" at the starting batch {start}, kept at batch changes" if keep else "")
        reason = (f"epoch {epoch:.2f}: {why}; realised as {self.world_size} ranks x "
                  f"{local} x {accum} accumulation = {global_batch}, "
                  f"lr x {factor:.4g} ({rule})")
        self.current = BatchPlan(global_batch, local, accum, factor, True, reason)
        LOG.info(reason)
        return self.current
