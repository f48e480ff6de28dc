"""The divergence stop (--max-nonfinite-steps): the steps whose all-reduced gradients are not
finite, counted in a row, and the stop on every rank alike with what to do.

Example (run_step.take_step and train.main do this)::

    count_nonfinite(run.progress, gradients_finite(run, global_sqnorm, updated))
    if diverged(run):
        status = EXIT_DIVERGED
"""
import math

import nnabla as nn
import nnabla.functions as F
import numpy as np

import report
from step import host_read

EXIT_DIVERGED = 3     # the loss was not finite for --max-nonfinite-steps steps (every rank)


def gradients_finite(run, global_sqnorm, updated):
    """Whether this step's all-reduced gradients are finite: the same answer on every rank
    without a collective of its own (an inf or NaN in one rank's gradients reaches every
    rank's sum, and a non-finite loss gives non-finite gradients). From the noise scale's
    squared norm when it has one, else from ``run.net.grad_abs_sum`` read once. FP16: not
    finite only when the update was skipped at a loss scale of 1 or less (an overflow at a
    larger scale is the scaler's to handle, not a divergence)."""
    scaler = run.parallel.scaler
    if scaler is not None:
        return updated or scaler.scale * scaler.scaling_factor > 1.0
    if global_sqnorm is not None:
        return math.isfinite(global_sqnorm)
    return math.isfinite(float(host_read(run.net.grad_abs_sum(), run.parallel.comm)[0]))


class GradientAbsSum:
    """``abs_sum()``: one device array of shape (1,), the sum over ``grads`` of sum |g|, enqueued
    (no host wait). Not finite exactly when a gradient holds an inf or a NaN, or when the sum
    passes float32's range (3.4e38: a divergence too). Zeroing gradients are left out, as
    nnabla's solvers leave them. Read once, it replaces ``check_inf_or_nan_grad``, which waits on
    the host for one reduction per parameter (nnabla ``src/nbla/solver.cpp`` ~310-323, ext
    ``include/nbla/cuda/solver/mixed_precision_training.cuh`` ~70-80: 161 for ResNet-50).

    The sum is a static graph over Variables that share the gradient arrays, built again only
    when the set of zeroing gradients changes; a call is one ``forward``. Built imperatively
    (three functions per gradient, each call from Python) it cost 13 ms a step on 4 ranks of a
    2-core machine, 15 % of a shapes-cpu step at batch 64. Example::

        abs_sum = GradientAbsSum([p.grad for p in params.values()])
        finite = math.isfinite(float(abs_sum().data[0]))
    """

    def __init__(self, grads):
        self.grads = grads
        self._key = None            # ids of the non-zeroing gradients the graph sums (the
        self._total = None          # graph holds them, so no id is reused while it lives)

    def __call__(self):
        live = [g for g in self.grads if not g.zeroing]
        key = [id(g) for g in live]
        if key != self._key:
            self._key, self._total = key, _abs_sum_graph(live)
        if self._total is None:
            return nn.NdArray.from_numpy_array(np.zeros(1, np.float32))
        self._total.forward(clear_buffer=True)
        return self._total.data


def _abs_sum_graph(arrays):
    """A Variable of shape (1,) whose forward sums |a| over ``arrays`` (None if empty)."""
    terms = []
    for array in arrays:
        v = nn.Variable(array.shape)
        v.data = array              # shared: the graph reads the gradient in place
        terms.append(F.reshape(F.sum(F.abs(v)), (1,)))
    if len(terms) < 2:              # nnabla's Concatenate needs two inputs
        return terms[0] if terms else None
    return F.sum(F.concatenate(*terms, axis=0), keepdims=True)


def count_nonfinite(progress, finite):
    """Count the non-finite steps in a row (``diverged`` stops the run after
    --max-nonfinite-steps of them)."""
    if finite:
        progress.nonfinite_steps, progress.first_nonfinite = 0, None
        return
    progress.nonfinite_steps += 1
    if progress.first_nonfinite is None:
        progress.first_nonfinite = progress.step


def diverged(run):
    """True (every rank alike) once --max-nonfinite-steps steps in a row were not finite;
    rank 0 says which and what to do."""
    cfg, progress = run.settings.cfg, run.progress
    if not cfg.max_nonfinite_steps or progress.nonfinite_steps < cfg.max_nonfinite_steps:
        return False
    kept = (f"the last checkpoint, {progress.checkpoint}, is from before it"
            if progress.checkpoint else "no checkpoint was written")
    run.settings.log(
        f"{report.clock()} step {progress.step}: the run diverged: the all-reduced gradients "
        f"have not been finite for {progress.nonfinite_steps} steps (since step "
        f"{progress.first_nonfinite}; --max-nonfinite-steps {cfg.max_nonfinite_steps}); "
        f"stopped on every rank, {kept}. Lower --base-lr (now {cfg.base_lr:g}) or lengthen "
        f"--warmup-epochs (now {cfg.warmup_epochs:g})")
    return True
