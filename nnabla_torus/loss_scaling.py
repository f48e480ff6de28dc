"""Dynamic loss scaling for FP16 training that keeps the all-reduce overlapped with backward.

nnabla's ``DynamicLossScalingUpdater`` (``nnabla.experimental.mixed_precision_training``) runs
forward, backward and ``comm.all_reduce`` itself, after backward, so gradient buckets cannot be
all-reduced while backward runs. This splits its step in two around ``BucketedAllReduce``:
``backward(loss, reducer)`` (seeded with the loss scale) and ``unscale(solver)`` (on the
all-reduced gradients: False on inf/NaN, skip the update; else unscale and return True), with
the updater's rules and defaults (scale 8, factor 2, N = 2000). Ranks agree without another
collective (the gradients checked are all-reduced). How it counts, and how it is checked
against the updater: docs/communicator.md#fp16-dynamic-loss-scaling-around-the-overlap. Example::

    scaler = DynamicLossScaling(scale=8.0)
    solver.zero_grad()
    loss.forward(clear_no_need_grad=True)
    scaler.backward(loss, reducer, clear_buffer=True)   # reducer: a BucketedAllReduce
    if scaler.unscale(solver):
        solver.weight_decay(1e-4)
        solver.update()
"""


class DynamicLossScaling:
    """Loss scale for FP16 gradients: halved on overflow, doubled after N good steps."""

    def __init__(self, scale=8.0, scaling_factor=2.0, N=2000):
        """scale: initial loss scale (> 0); scaling_factor: > 1; N: good steps per growth (>= 0)."""
        if not scale > 0:
            raise ValueError(f"loss scale = {scale} must be > 0 (nnabla's default: 8)")
        if not scaling_factor > 1:
            raise ValueError(f"scaling_factor = {scaling_factor} must be > 1 (default: 2)")
        if N < 0:
            raise ValueError(f"N = {N} good steps per growth must be >= 0 (default: 2000)")
        self.scale = float(scale)
        self.scaling_factor = scaling_factor
        self.N = N
        self.good_steps = 0        # since the last change of the scale (the updater's _counter)
        self.skipped = 0           # overflowed steps so far

    def backward(self, loss, reducer=None, **backward_kwargs):
        """Backward with the gradient seeded to ``scale``; through ``reducer`` when given.

        Without a reducer the gradients are only accumulated locally (earlier micro-batches,
        or overlap off: all-reduce them before ``unscale``).
        """
        if reducer is None:
            loss.backward(self.scale, **backward_kwargs)
        else:
            reducer.backward(loss, grad=self.scale, **backward_kwargs)

    def unscale(self, solver):
        """After the all-reduce: unscale and return True, or on inf/NaN shrink and return False."""
        if solver.check_inf_or_nan_grad():
            self.scale /= self.scaling_factor
            self.good_steps = 0
            self.skipped += 1
            return False
        solver.scale_grad(1.0 / self.scale)
        # Grown after this step's unscale, as the updater grows it after its update: the next
        # step is the first one at the new scale either way.
        if self.good_steps > self.N:
            self.scale *= self.scaling_factor
            self.good_steps = 0
        self.good_steps += 1
        return True
