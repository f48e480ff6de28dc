"""Gradient noise scale B_simple = tr(S) / |G|^2, estimated online (McCandlish et al. 2018, App. A).

Two gradient norms at two batch sizes (one rank's batch b before the all-reduce, the global
batch B after it: the communicator's ``pop_sqnorms()``) give unbiased estimates of |G|^2 and
tr(S); numerator and denominator are smoothed separately (bias-corrected EMA) and divided last,
and the EMA also gives the ratio's relative standard error (``rse``, a lower bound). The EMA's
memory is in samples, not steps (as AdaptDL's ``theta = smoothing ** scale``, petuum/adaptdl
``adaptdl/torch/gradient_noise_scale.py``): a step at k times the first global batch decays
the past as k steps would, but never by more than ``1 - 1 / min_memory_steps`` (the estimate
always rests on about ``min_memory_steps`` steps: each step's tr(S) comes from the same number
of ranks whatever the batch, and at 16x B0 the samples alone, 0.95 ** 16 = 0.44, left about
two steps, over which clusters' estimate swung 10x). Formulas and the error's derivation:
docs/adaptive-batch.md (#the-objective, #acting-on-an-estimate-confidence-smoothing-hysteresis).
Example::

    est = NoiseScaleEstimator(smoothing=0.95)
    comm.track_sqnorms = True
    ...  # every step, after the gradient all-reduce:
    local_sqnorm, global_sqnorm = comm.pop_sqnorms()
    est.update(local_sqnorm, local_batch, global_sqnorm, local_batch * comm.size)
    est.b_simple   # None until both estimates are positive

With one rank: :meth:`update_successive` (two successive steps act as two ranks) or
:meth:`update` with accumulation micro-batches.
"""
import logging

import numpy as np

LOG = logging.getLogger("nnabla_torus.planning.controller")   # rank 0's, as the controller's


class NoiseScaleEstimator:
    """Online B_simple from pairs of (small-batch, large-batch) squared gradient norms."""

    def __init__(self, smoothing=0.95, reference_batch=None, min_memory_steps=5):
        """``smoothing``: EMA factor per ``reference_batch`` samples (None: the first
        observation's global batch); a step at global batch B decays by smoothing ** (B / ref),
        or by ``1 - 1 / min_memory_steps`` if that is larger (and at most ``smoothing``; 1: no
        floor, the memory is in samples only)."""
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing={smoothing} must be in [0, 1) (0: no smoothing)")
        if reference_batch is not None and not reference_batch > 0:
            raise ValueError(f"reference_batch={reference_batch} must be > 0 (or None)")
        if not min_memory_steps >= 1:
            raise ValueError(f"min_memory_steps={min_memory_steps} must be >= 1 (1: no floor)")
        self.smoothing, self.reference_batch = smoothing, reference_batch
        self.decay_floor = min(smoothing, 1.0 - 1.0 / min_memory_steps)
        self._sums = np.zeros(5)   # EMA of |G|^2, tr(S), their squares and their product
        self._weight = 0.0         # EMA of 1, for bias correction
        self._weight_sq = 0.0      # sum of the squared EMA weights, for n_eff
        self._previous = None      # last gradient in update_successive
        self.updates = 0
        self.skipped = 0           # observations dropped for an inf/NaN norm (fp16 overflow)

    def update(self, local_sqnorm, local_batch, global_sqnorm, global_batch):
        """Add one observation: |G_b|^2 at batch ``local_batch``, |G_B|^2 at ``global_batch``.

        An inf or NaN norm (an overflowed step, a diverged run) is skipped, counted in
        ``skipped`` and logged (the 1st, 2nd, 4th, 8th, ... time): one would poison the
        running averages for good. Returns False for a skipped observation.
        """
        b, big_b = float(local_batch), float(global_batch)
        if not 0 < b < big_b:
            raise ValueError(f"need 0 < local_batch ({local_batch}) < global_batch "
                             f"({global_batch}); with one rank use update_successive or "
                             f"accumulation micro-batches")
        if not (np.isfinite(local_sqnorm) and np.isfinite(global_sqnorm)):
            self.skipped += 1
            if self.skipped & (self.skipped - 1) == 0:
                LOG.warning(f"noise scale: observation skipped, a squared gradient norm is not "
                            f"finite (local {local_sqnorm:.3g}, global {global_sqnorm:.3g}); "
                            f"{self.skipped} skipped and {self.updates} used so far, the "
                            f"estimate keeps its last value")
            return False
        grad_sq = (big_b * global_sqnorm - b * local_sqnorm) / (big_b - b)
        trace = (local_sqnorm - global_sqnorm) / (1.0 / b - 1.0 / big_b)
        if self.reference_batch is None:
            self.reference_batch = big_b
        m = max(self.smoothing ** (big_b / self.reference_batch), self.decay_floor)
        obs = np.array([grad_sq, trace, grad_sq ** 2, trace ** 2, grad_sq * trace])
        self._sums = m * self._sums + (1.0 - m) * obs
        self._weight = m * self._weight + (1.0 - m)
        self._weight_sq = m * m * self._weight_sq + (1.0 - m) ** 2
        self.updates += 1
        return True

    def update_successive(self, grad, batch):
        """One-rank mode: pair this step's flattened gradient with the previous step's.

        The two gradients (``batch`` samples each) act as two ranks: b = batch, B = 2*batch.
        Keeps one copy of the gradient.
        """
        grad = np.asarray(grad, dtype=np.float64).ravel()
        if self._previous is not None:
            local = 0.5 * (grad @ grad + self._previous @ self._previous)
            mean = 0.5 * (grad + self._previous)
            self.update(local, batch, mean @ mean, 2 * batch)
        self._previous = grad.copy()

    def _estimate(self, i):
        return None if self._weight == 0.0 else float(self._sums[i] / self._weight)

    @property
    def grad_sqnorm(self):
        """Smoothed |G|^2 estimate (None before the first update)."""
        return self._estimate(0)

    @property
    def trace_cov(self):
        """Smoothed tr(S) estimate: per-sample gradient variance summed over parameters."""
        return self._estimate(1)

    @property
    def rse(self):
        """Relative standard error of :attr:`b_simple` (see module doc); inf before 2 updates
        or without a positive estimate."""
        if self.updates < 2 or self.b_simple is None:
            return float("inf")
        g, t, gg, tt, gt = self._sums / self._weight
        n_eff = self._weight ** 2 / self._weight_sq
        if n_eff < 2.0:                     # smoothing 0: one observation, error unknown
            return float("inf")
        var = ((tt - t * t) / (t * t) + (gg - g * g) / (g * g) - 2.0 * (gt - g * t) / (g * t))
        return float(np.sqrt(max(var, 0.0) / n_eff))

    @property
    def b_simple(self):
        """tr(S)/|G|^2 in samples, or None unless it is finite and positive."""
        g2, tr = self.grad_sqnorm, self.trace_cov
        if g2 is None or not (g2 > 0 and tr > 0):     # also False for NaN
            return None
        ratio = tr / g2
        return ratio if np.isfinite(ratio) else None
