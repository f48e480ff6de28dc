"""The squared gradient norms the noise scale needs (``comm.pop_sqnorms()``), summed over the
all-reduces since the last pop: on the host (the communicator's own all-reduce returns them
from its fused buffer, ``array_reduce.py``, and the communicator adds them here), or on the
device while nnabla's ``all_reduce_callback`` reduces the gradients during backward
(``DeviceSquaredNorms``).

x_i is rank i's input: ``local_mean`` = (1/p) sum_i |x_i|^2, ``global_`` = |(1/p) sum_i x_i|^2.
"""
import numpy as np


def call_norms(local_sum, result_sqnorm, p, averaged):
    """``(local_mean, global_)`` of one all-reduce over ``p`` ranks: ``local_sum`` = sum_i
    |x_i|^2, ``result_sqnorm`` = |y|^2 of its result y, the average when ``averaged``, else the
    sum (whose square is p^2 times the average's)."""
    return local_sum / p, result_sqnorm / (1 if averaged else p ** 2)


class SquaredNorms:
    """Host sums of ``local_mean`` and ``global_`` since the last ``pop``, plus those of the
    device accumulator ``device`` (set by ``on_device``)."""

    def __init__(self):
        self.local_mean, self.global_ = 0.0, 0.0
        self.device = None

    def on_device(self, backend):
        """The device accumulator on ``backend`` (created once)."""
        if self.device is None:
            self.device = DeviceSquaredNorms(backend)
        return self.device

    def add(self, local_mean, global_):
        """Add one call's norms (``call_norms``)."""
        self.local_mean += local_mean
        self.global_ += global_

    def pop(self):
        values = (self.local_mean, self.global_)
        self.local_mean, self.global_ = 0.0, 0.0
        if self.device is not None:
            local_mean, global_ = self.device.pop()
            values = (values[0] + local_mean, values[1] + global_)
        return values


class DeviceSquaredNorms:
    """Squared norms summed into two float32 device scalars, read once per ``pop``.

    ``add_local(grads)`` enqueues sum(g^2) of this rank's gradients on the compute stream (in a
    ``function_post_hook``, before nnabla's callback packs them: nnabla v1.39.0
    ``src/nbla/computation_graph/variable.cpp`` 649 runs the post hook, 917 the callbacks'
    ``on_finish_function_backward``, whose pack waits for an event recorded on stream 0 at
    that moment, ext ``multi_process_data_parallel_communicator.cu`` 1049-1050, and whose
    unpack rewrites the gradients later, ~1130-1135). ``add_global(grads, factor)`` enqueues
    factor * sum(g^2) of the reduced gradients after backward (stream 0 waits for the unpack,
    ~1101-1113). Neither waits for the device; ``pop`` sums the local scalar over the world
    (one 4-byte all-reduce) and reads both: 3 host waits per pop (the all-reduce's phase,
    two 4-byte reads), after everything else of the step. Computed in float32 (a float16 square
    overflows above 255.9); zeroing
    gradients are skipped (reading one would materialise it, and nnabla's solvers skip only
    zeroing gradients).
    """

    def __init__(self, backend):
        self.backend = backend
        self.local = self.global_ = None   # 1-element float32 NdArrays on the device

    def _scalar(self):
        buf = self.backend.empty(np.float32, 1)
        buf.fill(0.0)
        return buf.base

    def _add(self, acc, grads, factor):
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self.backend.ctx):   # float32 kernels on our device
            for grad in grads:
                if grad.zeroing:
                    continue
                term = F.reshape(F.sum(F.pow_scalar(grad, 2.0)), (1,))
                if factor != 1.0:
                    term = F.mul_scalar(term, factor)
                F.add2(acc, term, outputs=[acc])

    def add_local(self, grads):
        """Enqueue sum |g|^2 of ``grads`` (this rank's, before the all-reduce)."""
        if self.local is None:
            self.local = self._scalar()
        self._add(self.local, grads, 1.0)

    def add_global(self, grads, factor=1.0):
        """Enqueue ``factor`` * sum |g|^2 of ``grads`` (reduced: 1 for averages, 1/p^2 for sums)."""
        if self.global_ is None:
            self.global_ = self._scalar()
        self._add(self.global_, grads, float(factor))

    def pop(self):
        """(local_mean, global_) since the last pop; (0, 0) without a collective if nothing was
        added (the same on every rank: every rank runs the same backward)."""
        if self.local is None and self.global_ is None:
            return 0.0, 0.0
        be = self.backend
        local = be.buffer_of(self.local if self.local is not None else self._scalar())
        be.all_reduce(be.world_group, local, what="all_reduce (noise-scale norms)")
        values = (be.read(local, 0) / be.size,
                  0.0 if self.global_ is None else be.read(be.buffer_of(self.global_), 0))
        self.local = self.global_ = None
        return values
