"""The fused buffer: NdArrays packed into one backend buffer per dtype and back, and the dtype
each array travels as. One collective over a fused buffer is faster than one per array.
"""
import numpy as np


def as_list(data):
    """``data`` (an NdArray or a list/tuple of them) as a list; TypeError for anything else."""
    arrays = list(data) if isinstance(data, (list, tuple)) else [data]
    for a in arrays:
        if not hasattr(a, "get_data"):
            raise TypeError(f"expected nnabla NdArray(s), got {type(a).__name__}")
    return arrays


def dtype_of(ndarray):
    """The NdArray's dtype; float32 (what nnabla allocates on the first write) when it has no
    storage yet: ``nn.NdArray(shape)``, or the gradient of a parameter backward never reached."""
    try:
        return np.dtype(ndarray.dtype)
    except RuntimeError:  # nnabla: "Array is not initialized"
        return np.dtype(np.float32)


def signature(arrays):
    """((dtype name, shape), ...): what the cross-rank argument check compares."""
    names = _DTYPE_NAMES   # np.dtype.name is computed in Python (~1 us): once per dtype
    return tuple((names.get(d) or names.setdefault(d, d.name), a.shape)
                 for a, d in zip(arrays, map(dtype_of, arrays)))


_DTYPE_NAMES = {}


def wire_groups(arrays, wire_fp16):
    """[(wire dtype, arrays)]: one fused buffer per wire dtype, in first-seen order.

    A list of float16 and float32 arrays goes in ONE float16 buffer (one collective), as
    nnabla's half communicator casts every array to half (``ndarray->cast(dtype, ctx_)`` in
    ext ``src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu``
    ~780-783): in FP16 training cuDNN leaves the batch-norm gradients float32 (``DRV_BN_T``
    in ext ``src/nbla/cuda/cudnn/function/generic/batch_normalization.cu`` ~411-421), and
    a bucket would otherwise need a tiny float32 collective beside its float16 one.
    ``wire_fp16`` sends float32-only lists as float16 too."""
    dtypes = [dtype_of(a) for a in arrays]
    half, single = np.dtype(np.float16), np.dtype(np.float32)
    mixed = half in dtypes and single in dtypes
    groups = {}
    for a, dtype in zip(arrays, dtypes):
        wire = half if dtype == single and (wire_fp16 or mixed) else dtype
        groups.setdefault(wire, []).append(a)
    return list(groups.items())


def prescaled(dtype):
    """Whether an average (``division=True``) of ``dtype`` scales each rank's input by 1/p
    before the sum (float16, as NCCL's ``ncclAvg`` that nnabla's ``division=True`` uses: a
    pre-multiplied sum for floating types, ext ``multi_process_data_parallel_communicator.cu``
    ~790-792): a sum of p float16 inputs overflows 65504 p times sooner than their mean. Other
    dtypes divide the finished sum (exact for integers; one rounding for float32)."""
    return np.dtype(dtype) == np.float16


class Workspace:
    """One communicator's fused buffers (one per dtype, allocated once, grown when a call
    needs more) and the copies of NdArrays into them and out."""

    def __init__(self):
        self.buffers = {}

    def buffer(self, backend, dtype, count):
        """The first ``count`` elements of the ``dtype`` buffer."""
        dtype = np.dtype(dtype)
        buf = self.buffers.get(dtype)
        if buf is None or len(buf) < count:
            buf = backend.empty(dtype, max(count, 1))
            self.buffers[dtype] = buf
        return backend.sub(buf, 0, count)


def pack(backend, arrays, buf):
    """Copy ``arrays`` one after another into ``buf``; returns what ``unpack`` may reuse
    (a host backend's views of them, from its ``views`` cache: one numpy call packs them)."""
    views = getattr(backend, "views", None)
    if views is not None:
        flats = views.of(arrays)
        if flats:
            np.concatenate(flats, out=buf[:sum(f.size for f in flats)], casting="unsafe")
        return flats
    offset = 0
    for a in arrays:
        backend.copy(backend.sub(buf, offset, offset + a.size), backend.flat(a, write=False))
        offset += a.size
    return None


def unpack(backend, buf, arrays, flats=None):
    """Copy ``buf`` back into ``arrays`` (as ``pack`` laid them out; ``flats``: its result)."""
    views = getattr(backend, "views", None)
    if views is not None:
        start = 0
        for f in flats if flats is not None else views.of(arrays):
            stop = start + f.size
            np.copyto(f, buf[start:stop], casting="unsafe")
            start = stop
        return
    offset = 0
    for a in arrays:
        backend.copy(backend.flat(a, write=True), backend.sub(buf, offset, offset + a.size))
        offset += a.size


def put(backend, dst, values):
    """Write numpy ``values`` into backend buffer ``dst`` (same dtype)."""
    import nnabla as nn
    backend.copy(dst, backend.flat(nn.NdArray.from_numpy_array(values), write=False))


def get(backend, src):
    """A numpy copy of backend buffer ``src``."""
    import nnabla as nn
    out = nn.NdArray((src.size,))
    out.cast(np.dtype(src.dtype))
    backend.copy(backend.flat(out), src)
    return out.get_data("r").copy()
