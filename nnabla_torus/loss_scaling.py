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

Given ``grads`` (and ``comm``), the overflow check is one fused count read once a step
(``NonfiniteCount``) instead of nnabla's ``check_inf_or_nan_grad``, which waits once per
parameter (161 for ResNet-50).
"""
import nnabla as nn
import nnabla.functions as F

from .comm.backends import synchronize


class DynamicLossScaling:
    """Loss scale for FP16 gradients: halved on overflow, doubled after N good steps."""

    def __init__(self, scale=8.0, scaling_factor=2.0, N=2000, grads=None, comm=None):
        """scale: initial loss scale (> 0); scaling_factor: > 1; N: good steps per growth (>= 0);
        ``grads`` (NdArrays, e.g. every parameter's ``.grad``): check them with one fused count
        (``NonfiniteCount``, its wait under ``comm``'s watchdog), else with the solver's
        ``check_inf_or_nan_grad``."""
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
        self.nonfinite = None if grads is None else NonfiniteCount(grads, comm)

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
        overflow = (self.nonfinite.found() if self.nonfinite is not None
                    else solver.check_inf_or_nan_grad())
        if overflow:
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


class NonfiniteCount:
    """Whether any of ``grads`` holds an inf or a NaN, as ``check_inf_or_nan_grad`` says, with
    one host read a step instead of one blocking reduction per parameter (nnabla
    ``src/nbla/solver.cpp`` ~310-323, ext ``include/nbla/cuda/solver/
    mixed_precision_training.cuh`` ~69-80). The count of non-finite elements is a sum of 0/1
    flags: 0 exactly when all are finite, and no overflow can make it wrong (in float16, past
    65504 it is inf, still > 0). Zeroing gradients are left out, as nnabla's solvers leave
    them. The graph shares the gradient arrays and is built again only when the set of
    zeroing gradients changes. Example::

        nonfinite = NonfiniteCount([p.grad for p in params.values()], comm)
        if nonfinite.found():
            ...   # skip the update
    """

    def __init__(self, grads, comm=None):
        self.grads, self.comm = list(grads), comm
        self._key = None            # ids of the non-zeroing gradients the graph counts (the
        self._total = None          # graph holds them, so no id is reused while it lives)

    def found(self):
        """Count on the device, wait (under ``comm``'s watchdog), read once: True if any."""
        live = [g for g in self.grads if not g.zeroing]
        if not live:
            return False
        key = [id(g) for g in live]
        if key != self._key:
            self._key, self._total = key, _count_graph(live)
        self._total.forward(clear_buffer=True)
        synchronize(self.comm, "reading the gradients' inf/NaN count")
        return bool(self._total.d[0] > 0)


def _count_graph(arrays):
    """A Variable of shape (1,) whose forward counts the inf and NaN elements of ``arrays``."""
    terms = []
    for array in arrays:
        v = nn.Variable(array.shape)
        v.data = array              # shared: the graph reads the gradient in place
        terms.append(F.reshape(F.sum(F.isnan(v) + F.isinf(v)), (1,)))
    if len(terms) < 2:              # nnabla's Concatenate needs two inputs
        return terms[0]
    return F.sum(F.concatenate(*terms, axis=0), keepdims=True)
