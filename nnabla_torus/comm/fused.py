"""The fused buffer: NdArrays packed into one backend buffer per wire dtype and back (the layout
of a list, cached per list: :mod:`.array_layout`). One collective over a fused buffer is faster
than one per array.
"""
import numpy as np


def as_list(data):
    """``data`` (an NdArray or a list/tuple of them) as a list; TypeError for anything else."""
    arrays = list(data) if isinstance(data, (list, tuple)) else [data]
    for kind in set(map(type, arrays)):   # one check per type, not per array
        if not hasattr(kind, "get_data"):
            raise TypeError(f"expected nnabla NdArray(s), got {kind.__name__}")
    return arrays


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


def pack(backend, part, buf):
    """Copy the arrays of ``part`` (an :class:`.array_layout.Part`) one after another into
    ``buf``: a host backend's cached views in one numpy call, else the backend's own pack."""
    if part.n == 0:
        return
    if getattr(backend, "host_views", False):
        flats = part.host_views(backend.cpu_context())
        np.concatenate(flats, out=buf[:part.n], casting="unsafe")
        return
    backend.pack(part, buf)


def unpack(backend, buf, part, packed=True):
    """Copy ``buf`` back into the arrays of ``part`` (as ``pack`` laid them out); ``packed``:
    this call packed them first (a host backend then reuses the views pack checked: nothing
    between the two touches the user's arrays)."""
    if part.n == 0:
        return
    if getattr(backend, "host_views", False):
        flats = part.flats if packed else part.host_views(backend.cpu_context())
        for f, piece in zip(flats, part.slices(buf)):
            f[...] = piece
        return
    backend.unpack(buf, part)


def put(backend, dst, values):
    """Write numpy ``values`` into backend buffer ``dst`` (same dtype)."""
    if getattr(backend, "host_views", False):   # a numpy buffer
        dst[...] = values
        return
    import nnabla as nn
    backend.copy(dst, backend.buffer_of(nn.NdArray.from_numpy_array(values), write=False))


def get(backend, src):
    """A numpy copy of backend buffer ``src``."""
    if getattr(backend, "host_views", False):
        return src.copy()
    import nnabla as nn
    out = nn.NdArray((src.size,))
    out.cast(np.dtype(src.dtype))
    backend.copy(backend.buffer_of(out), src)
    return out.get_data("r").copy()
