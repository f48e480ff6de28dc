"""The MPI backend's buffers: 1-D numpy arrays, zero-copy views of CPU NdArrays, and what the
communicator does with them (copy, scale, squared norm).
"""
import math

import numpy as np

from ..collectives import scale_numpy


class HostBuffers:
    """The buffer methods of :class:`.mpi.MPIBackend` (its ``_cpu``: nnabla's CPU context, made
    at the first ``cpu_context()``)."""

    def cpu_context(self):
        """nnabla's CPU context (the one ``data_ptr`` checks the cached views in)."""
        if self._cpu is None:
            from nnabla_ext.cpu import context
            self._cpu = context()
        return self._cpu

    @staticmethod
    def buffer_of(ndarray, write=True):
        """A flat numpy view of an NdArray's CPU storage (no copy)."""
        return ndarray.get_data("rw" if write else "r").reshape(-1)

    @staticmethod
    def empty(dtype, count):
        return np.empty(count, dtype=dtype)

    @staticmethod
    def padded_length(count, dtype=None):
        """Length of a fused buffer for ``count`` elements (uneven chunks need no padding)."""
        return count

    @staticmethod
    def sub(buf, start, stop):
        return buf[start:stop]

    @staticmethod
    def read(buf, index):
        return float(buf[index])

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")

    @staticmethod
    def scale(buf, factor):
        """``buf *= factor`` in place (integers and factor 1/p: floor division by p)."""
        scale_numpy(buf, factor)

    @staticmethod
    def sqnorm(buf):
        """Squared L2 norm (BLAS dot; float16 is widened 1 Mi elements at a time). A float32
        sum that overflows (|g| above ~1.8e19) is summed again in float64: finite gradients
        give a finite norm, only an inf or NaN element gives a non-finite one."""
        if buf.dtype != np.float16:
            total = float(np.dot(buf, buf))
            if math.isfinite(total) or buf.dtype == np.float64:
                return total
            wide = np.float64
        else:
            wide = np.float32     # 65504^2 x 1 Mi elements fits float32
        step = 1 << 20
        return sum(float(np.dot(part, part)) for part in
                   (buf[a:a + step].astype(wide) for a in range(0, buf.size, step)))
