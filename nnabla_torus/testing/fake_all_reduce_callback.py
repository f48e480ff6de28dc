"""The fake NCCL communicator's ``all_reduce_callback``: nnabla-ext-cuda's C++ AllReduceCallback
(gradients packed during backward and summed per pack) in Python, on the fake device.
"""
import numpy as np

from .fake_cuda import complete


class FakeAllReduceCallback:
    """nnabla-ext-cuda's AllReduceCallback on the fake: after each function's backward, every
    input gradient in the set that is not zeroing on every rank of the world is cast to T,
    multiplied by ``scale_grad`` into the pack and, when the pack holds ``pack_size`` elements
    or backward ends, summed (``division``: ncclAvg) and unpacked (keep_dtype is moot: arrays
    are T). As in nnabla, a gradient is packed at each use. A Python object: nnabla's backward
    runs it only through ``nnabla_torus.comm.backward_callback.install()``.

    A pack is summed and unpacked as soon as it is enqueued: the earliest schedule nnabla's
    streams allow (its pack waits only for stream 0's work so far, ext .cu 1049-1050, and its
    unpack may rewrite the gradients before any later kernel of stream 0 runs, ~1130-1135),
    so a kernel that reads a gradient after its function's callback sees the reduced value
    here, as it may on a GPU. Not a host sync (none is logged)."""

    # nnabla's pack memory: one fixed 40 MiB split into buffers of pack_size elements of T
    # (ext .hpp 190-191, .cu 962-972; its test compares bytes with elements); 0 buffers is
    # undefined there (allocate_workspace pops an empty queue, .cu 1153-1158): refused here.
    MAX_GPU_MEMORY_SIZE = 40 * 1024 * 1024
    buffers_made = []   # the buffer count of every callback made in this process, in order
    # nnabla's blocking 1-byte MPI_Allreduce (mpi_check_all over the world) per gradient of the
    # set found after a function's backward (ext .cu 1025-1030): counted in this process
    host_checks = 0

    def __init__(self, parent, comm, arrays, pack_size, division, scale_grad):
        itemsize = parent.dtype.itemsize
        n = (1 if self.MAX_GPU_MEMORY_SIZE < pack_size
             else self.MAX_GPU_MEMORY_SIZE // itemsize // pack_size)
        if n == 0:
            raise ValueError(f"all_reduce_callback: pack_size {pack_size} elements of "
                             f"{parent.dtype} leaves nnabla's 40 MiB of pack memory with no "
                             f"buffer (undefined behaviour in nnabla-ext-cuda v1.39.0)")
        self.buffers = n
        FakeAllReduceCallback.buffers_made.append(n)
        self.parent, self.comm, self.arrays = parent, comm, arrays
        self.pack_size, self.division, self.scale_grad = pack_size, division, scale_grad
        self._flats, self._parts = [], []

    def on_finish_function_backward(self, func):
        for var in func.inputs:
            grad = var.grad
            if not any(grad == a for a in self.arrays):
                continue
            FakeAllReduceCallback.host_checks += 1
            if self.parent._all_zeroing([grad], self.parent._world)[0]:
                continue
            flat = self.parent._typed(grad)
            self._flats.append(flat)
            self._parts.append(flat * self.parent.dtype.type(self.scale_grad))
            if sum(f.size for f in self._flats) >= self.pack_size:
                self._all_reduce()

    def on_finish_backward(self):
        # Not a host sync: stream 0 waits for the unpack stream's event (ext .cu 1101-1113).
        self._all_reduce()

    def _all_reduce(self):
        if self._flats:
            flats = self._flats
            reads = [f.__array_interface__["data"][0] for f in flats]
            self.parent._gather_sum(self.comm, np.concatenate(self._parts), self.division,
                                    lambda total: self.parent._unpack(total, flats),
                                    "non-blocking", "all_reduce_callback", reads)
            complete()   # the earliest schedule (class doc)
        self._flats, self._parts = [], []
