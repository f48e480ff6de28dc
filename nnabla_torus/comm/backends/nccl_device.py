"""Where the NCCL backend's data lives: the rank's GPU (nnabla's rule), the wire dtypes and
their contexts, and ``DeviceSlice``, a range of a device NdArray narrowed only while used.

nnabla's NCCL communicator reduces only float32 and float16 (``get_nccl_dtype`` has those two,
ext ``include/nbla/cuda/communicator/nccl_utils.hpp`` ~47-51; the communicator is instantiated
for ``float`` and ``Half`` only, ext ``multi_process_data_parallel_communicator.cu`` ~1215-1216,
and casts every array to its type, ~782); every other dtype (int32, int64, uint8, float64, ...)
lives in host memory here (``HOST``) and travels through MPI (``NCCLBackend``), summed exactly.

nnabla forbids two live narrowed views of one array that overlap, and casting a narrowed view
to another dtype or device (nnabla ``src/nbla/synced_array.cpp``), hence slices that hold no
view open (docs/gpu.md, "The NCCL mapping").
"""
import math
import socket

import numpy as np

from ..collectives import scale_numpy

WIRE_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "half"}  # NCCL's dtypes
HOST = "host"   # the context key of every other dtype (host memory, moved by MPI)
ALIGN_BYTES = 16  # chunk alignment of fused buffers (padded_length)


def short_host():
    """The host name as nnabla-ext-cuda compares it (up to the first dot)."""
    return socket.gethostname().split(".")[0]


def nnabla_device(world):
    """nnabla's GPU for this rank: the number of earlier ranks with the same short host name,
    and the number of ranks on this host."""
    hosts = world.allgather(short_host())
    me = hosts[world.Get_rank()]
    return hosts[:world.Get_rank()].count(me), hosts.count(me)


def type_contexts(ctx, fake, device_id):
    """nnabla contexts for float32 and float16 work on GPU ``device_id`` (fake: CPU; no
    ``ctx``: cudnn), and under ``HOST`` the CPU context of the other dtypes."""
    from nnabla.ext_utils import get_extension_context
    ext = "cpu" if fake else "cudnn" if ctx is None else ctx.backend[0].split(":")[0]
    contexts = {dtype: get_extension_context(ext, device_id=str(device_id), type_config=config)
                for dtype, config in WIRE_TYPES.items()}
    contexts[HOST] = get_extension_context("cpu")
    return contexts


class DeviceSlice:
    """Elements ``[start, start + size)`` of the 1-D NdArray ``base`` (no view held open)."""
    __slots__ = ("base", "start", "size", "ctx")

    def __init__(self, base, start, size, ctx):
        self.base, self.start, self.size, self.ctx = base, start, size, ctx

    def __len__(self):
        return self.size

    @property
    def dtype(self):
        return np.dtype(self.base.dtype)

    def narrow(self, offset=0, length=None):
        """A short-lived NdArray over ``[offset, offset + length)`` of this slice (no copy)."""
        length = self.size - offset if length is None else length
        if self.start + offset == 0 and length == self.base.size:
            return self.base
        return self.base.narrow(0, self.start + offset, length)

    def fill(self, value):
        """Set every element to ``value`` now (a lazy fill would die with the narrowed view)."""
        if self.size:
            view = self.narrow()
            view.fill(value)
            view.cast(view.dtype, self.ctx)


def _output(buf, count):
    """A Variable over the first ``count`` elements of DeviceSlice ``buf`` (data and grad), for
    one function call: the narrowed view dies with it (nnabla refuses overlapping live ones)."""
    import nnabla as nn
    y = nn.Variable((count,))
    y.data = y.grad = buf.narrow(0, count)
    return y


class DeviceBuffers:
    """The buffer half of the backend contract (flat, empty, sub, read, copy, scale, sqnorm,
    pack, unpack) on DeviceSlices, in explicit contexts of the buffer's device and dtype.

    The class using it sets ``ctx`` (float32 context), ``_ctx`` ({dtype: context} and
    ``HOST``, ``type_contexts``), ``size`` (world size), ``on_host`` (the fake: numpy on CPU),
    ``_ext`` and ``device_id``.
    """

    def context(self, dtype):
        """The nnabla context ``dtype`` lives in: the GPU for NCCL's dtypes, else the host."""
        return self._ctx.get(np.dtype(dtype)) or self._ctx[HOST]

    def buffer_of(self, ndarray, write=True):
        """A DeviceSlice over all of ``ndarray``, moved to our device in its dtype (no copy)."""
        try:
            dtype = ndarray.dtype
        except RuntimeError:  # new or zero()ed: no array yet; float32 is nnabla's default
            dtype = np.float32
        dtype = np.dtype(dtype)
        ctx = self.context(dtype)
        ndarray.cast(dtype, ctx)
        if self.on_host and dtype in WIRE_TYPES:
            self._ext.place(ndarray, self.device_id)
        base = ndarray if ndarray.ndim == 1 else ndarray.view((ndarray.size,))
        return DeviceSlice(base, 0, ndarray.size, ctx)

    def empty(self, dtype, count):
        import nnabla as nn
        dtype = np.dtype(dtype)
        ctx = self.context(dtype)
        base = nn.NdArray((count,))
        base.cast(dtype, ctx)
        if self.on_host and dtype in WIRE_TYPES:
            self._ext.place(base, self.device_id)
        return DeviceSlice(base, 0, count, ctx)

    def padded_length(self, count, dtype=np.float32):
        """``count`` rounded up so that the world (and every row, whose size divides it)
        splits it into equal chunks (NCCL's reduce-scatter/all-gather) of a multiple of
        ALIGN_BYTES each: every chunk, shard and NCCL pointer then starts 16-byte aligned, which
        NCCL's vectorised copy path needs (unaligned offsets, e.g. 4 mod 16, take its slower
        path). Costs at most size * 16 bytes of padding."""
        unit = self.size * max(1, ALIGN_BYTES // np.dtype(dtype).itemsize)
        return -(-count // unit) * unit

    def pack(self, part, buf):
        """Copy the arrays of ``part`` (:class:`..array_layout.Part`) one after another into
        ``buf``: one nnabla ``Concatenate`` forward on our device when every array has the wire
        dtype and nnabla's functions can write it here, else one copy per array."""
        concat = self._concatenate(part)
        if concat is None:
            for a, start, stop in zip(part.arrays, part.offsets, part.offsets[1:]):
                self.copy(self.sub(buf, start, stop), self.buffer_of(a, write=False))
            return
        fn, xs, _, _ = concat
        fn.forward(xs, [_output(buf, part.n)])

    def unpack(self, buf, part):
        """Copy ``buf`` back into the arrays of ``part``: the same ``Concatenate``'s backward,
        which writes each array on our device as nnabla's functions do (write access: the
        device copy becomes the head, other copies are dropped), else one copy per array."""
        concat = self._concatenate(part)
        if concat is None:
            for a, start, stop in zip(part.arrays, part.offsets, part.offsets[1:]):
                self.copy(self.buffer_of(a, write=True), self.sub(buf, start, stop))
            return
        fn, xs, overwrite, _ = concat
        fn.backward(xs, [_output(buf, part.n)], overwrite)

    def _concatenate(self, part):
        """(Concatenate function, its inputs, accum flags) for ``part``, the function made once
        per part, its inputs bound to the arrays' storage of now; None for fewer than two
        arrays, or unless every array has the wire dtype and nnabla's functions run in it here.

        Each input Variable's data and grad are a flat view of the user's array (``view``
        shares its storage, nnabla ``src/nbla/nd_array.cpp`` ``NdArray::view``), so zero(),
        casts and writes of the array are what the function reads and writes. A view shares
        the storage the array had when it was made, and an array can get new storage under
        the same shape (``Variable.reset_shape(shape, force=True)`` to another size and back
        gives it a new ``SyncedArray``): so the views are made again on every call (~0.4 us
        per array), never kept from one call to the next (issue 33)."""
        concat = self._make_concatenate(part)
        if concat is not None:
            for a, x in zip(concat[3], concat[1]):
                x.data = x.grad = a.view((a.size,))
        return concat

    def _make_concatenate(self, part):
        """(function, input Variables, accum flags, arrays) of ``part`` (``_concatenate``)."""
        if part.device is None:
            # Empty arrays hold no element of the buffer; nnabla's Concatenate divides by
            # each input's size in setup (it crashes on one of size 0).
            inputs = [a for a in part.arrays if a.size]
            if (len(inputs) < 2 or not self._native(part.wire)   # Concatenate: 2 or more
                    or any(d != part.wire for d in part.dtypes)):
                part.device = False
            else:
                import nnabla as nn
                import nnabla.function as nnabla_function
                xs = [nn.Variable((a.size,), need_grad=True) for a in inputs]
                fn = nnabla_function.Concatenate(self.context(part.wire), 0)
                fn.setup(xs, [nn.Variable((part.n,))])
                part.device = (fn, xs, [False] * len(xs), inputs)
        return part.device or None

    @staticmethod
    def sub(buf, start, stop):
        return DeviceSlice(buf.base, buf.start + start, stop - start, buf.ctx)

    def _native(self, dtype):
        """Whether nnabla functions write ``dtype`` here: NCCL's dtypes, on the GPU and on the
        fake alike (nnabla's CPU registers half kernels of Concatenate and MulScalar, so
        float16 packs through the same function as on a GPU); host dtypes are written with
        numpy."""
        return dtype in WIRE_TYPES

    def read(self, buf, index):
        if buf.dtype not in WIRE_TYPES:   # host memory: numpy (a function would cast it)
            return float(buf.narrow(index, 1).data[0])
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self.ctx):  # reads the element on our device, into a new array
            return float(F.identity(buf.narrow(index, 1)).data[0])

    def copy(self, dst, src):
        if not dst.size:
            return
        import nnabla as nn
        d, s = dst.narrow(), src.narrow()
        with nn.context_scope(self.context(dst.dtype)):
            if dst.dtype == src.dtype:  # a device-to-device copy in the source's dtype and place
                d.copy_from(s, use_current_context=False)
            elif self._native(dst.dtype):
                import nnabla.functions as F
                # MulScalarCuda<T> writes T, the destination's dtype, into the narrowed view.
                F.mul_scalar(s, 1.0, outputs=[d])
            else:
                d.data[...] = s.data

    def scale(self, buf, factor):
        if not buf.size:
            return
        view = buf.narrow()
        if self._native(buf.dtype):
            import nnabla as nn
            import nnabla.functions as F
            with nn.context_scope(self.context(buf.dtype)):
                F.mul_scalar(view, float(factor), outputs=[view])
        else:
            scale_numpy(view.data, factor)

    def sqnorm(self, buf):
        """Squared L2 norm, summed in float32 on the device; a sum that overflows (|g| above
        ~1.8e19) is summed again scaled by the largest |g|, so finite gradients give a finite
        norm (as the MPI backend's float64 sum)."""
        if not buf.size:
            return 0.0
        if buf.dtype not in WIRE_TYPES:   # host memory: numpy
            return float(np.sum(np.square(buf.narrow().data, dtype=np.float64)))
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self.ctx):
            x = buf.narrow()
            total = float(F.sum(F.pow_scalar(x, 2.0)).data)
            if math.isfinite(total):
                return total
            top = float(F.max(F.abs(x)).data)
            if not math.isfinite(top) or top == 0.0:
                return total
            return float(F.sum(F.pow_scalar(F.mul_scalar(x, 1.0 / top), 2.0)).data) * top * top
