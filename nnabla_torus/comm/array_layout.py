"""What a call's list of NdArrays looks like, worked out once per list and reused: the
signature the cross-rank check compares, the fused buffers (wire dtype, arrays, offsets) and,
on a host backend, a flat numpy view of every array and the slices of the buffer it fills.

Python per array per call is what a list of 10,000 gradients pays for (about 2.3 us each in
one process is what is left, half of it nnabla's ``data_ptr``;
docs/measurements/allreduce-one-host.md#many-arrays-in-one-call). A call looks its list up by the
arrays' hashes (nnabla hashes an NdArray by the address of its C++ object, ``__hash__`` in
``python/src/nnabla/_nd_array.pyx`` v1.39.0) and rebuilds the entry when a dtype or a shape
changed (a cast, a reshape); an entry holds its NdArrays, so no other array can take one of
their addresses while it lives. Only the last ``KEPT_LISTS`` lists are kept.

What the entry cannot see from Python (``zero()``, ``fill()``, ``clear()`` or a cast to
another context replace or move an array's storage, and ``modification_count`` does not
change) the host pack checks on every call: it asks nnabla for each array's pointer with
``data_ptr(dtype, cpu context)`` (~1.1 us, the floor), which also gives the write access of
``get_data("rw")`` (the CPU copy becomes the head, other copies are dropped, ``zeroing``
ends), and reuses a view only when the pointer is the view's. A view holds its buffer alive,
so a freed buffer's address cannot come back under a stale view. Nor can the entry see an
array given new storage of the same shape (``Variable.reset_shape`` to another size and back,
with ``force=True``): host views are caught by the pointer check, and a device backend makes
its NdArray views again on every call (``nccl_device.DeviceBuffers._concatenate``, issue 33).
"""
from itertools import accumulate, repeat

import numpy as np

KEPT_LISTS = 8   # lists whose layout is kept: a training step's buckets and a few others
_HALF, _SINGLE = np.dtype(np.float16), np.dtype(np.float32)
_DTYPE_NAMES = {}   # np.dtype.name is computed in Python (~1 us): once per dtype


def dtype_of(ndarray):
    """The NdArray's dtype; float32 (what nnabla allocates on the first write) when it has no
    storage yet: ``nn.NdArray(shape)``, or the gradient of a parameter backward never reached."""
    try:
        return ndarray.dtype
    except RuntimeError:  # nnabla: "Array is not initialized"
        return _SINGLE


def dtypes_of(arrays):
    """``[dtype_of(a) for a in arrays]`` in one pass of C calls while every array has storage."""
    try:
        return [a.dtype for a in arrays]
    except RuntimeError:
        return [dtype_of(a) for a in arrays]


class Signature(tuple):
    """((dtype name, shape), ...) of a list, its repr computed once: the argument check hashes
    the repr of each call's arguments (``rendezvous.call_hash``), ~1 us per array."""

    def __repr__(self):
        text = self.__dict__.get("repr")
        if text is None:
            text = self.__dict__["repr"] = tuple.__repr__(self)
        return text


class Part:
    """Arrays that travel in one fused buffer of dtype ``wire``, one after another."""

    def __init__(self, wire, arrays, dtypes):
        self.wire, self.arrays, self.dtypes = np.dtype(wire), arrays, dtypes
        sizes = [a.size for a in arrays]
        self.offsets = [0] + list(accumulate(sizes))   # array i: buf[offsets[i]:offsets[i + 1]]
        self.n = self.offsets[-1]
        self.flats, self.pointers = [None] * len(arrays), [None] * len(arrays)  # host views
        self._sliced, self._slices = None, []   # the buffer _slices cut, and its pieces
        self.device = None   # a device backend's own state for this part (nccl_device.py)

    def host_views(self, cpu):
        """A flat numpy view of each array, with nnabla's write access to it (module docstring)."""
        pointers = list(map(type(self.arrays[0]).data_ptr, self.arrays, self.dtypes, repeat(cpu))) \
            if self.arrays else []
        if pointers != self.pointers:
            for i, (old, new) in enumerate(zip(self.pointers, pointers)):
                if old != new:
                    self.flats[i] = self.arrays[i].get_data("rw").reshape(-1)
            self.pointers = pointers
        return self.flats

    def slices(self, buf):
        """``buf``'s piece for each array (cut once per buffer; the pieces hold it alive, so
        its address identifies it)."""
        if self._sliced is None or self._sliced.ctypes.data != buf.ctypes.data \
                or self._sliced.dtype != buf.dtype:
            o = self.offsets
            self._sliced, self._slices = buf, [buf[o[i]:o[i + 1]] for i in range(len(o) - 1)]
        return self._slices


class Layout:
    """One list's signature and its fused parts (per ``inplace`` and ``wire_fp16``)."""

    def __init__(self, arrays, dtypes, shapes):
        self.arrays, self.dtypes, self.shapes = arrays, dtypes, shapes
        names = _DTYPE_NAMES
        self.signature = Signature((names.get(d) or names.setdefault(d, d.name), s)
                                   for d, s in zip(dtypes, shapes))
        self._parts = {}

    def parts(self, inplace, wire_fp16=False):
        """[Part]: ``inplace``, one per dtype; else one per wire dtype (``wire_dtypes``)."""
        key = (bool(inplace), bool(wire_fp16) and not inplace)
        if key not in self._parts:
            wires = self.dtypes if inplace else wire_dtypes(self.dtypes, wire_fp16)
            groups = {}
            for a, d, w in zip(self.arrays, self.dtypes, wires):
                arrays, dtypes = groups.setdefault(w, ([], []))
                arrays.append(a)
                dtypes.append(d)
            self._parts[key] = [Part(w, arrays, dtypes) for w, (arrays, dtypes) in groups.items()]
        return self._parts[key]

    def whole(self, wire):
        """All arrays as one Part of a ``wire`` buffer, in list order."""
        key = ("whole", np.dtype(wire))
        if key not in self._parts:
            self._parts[key] = [Part(wire, self.arrays, self.dtypes)]
        return self._parts[key][0]


def wire_dtypes(dtypes, wire_fp16):
    """The dtype each array travels as in a fused call: its own, except float32 as float16
    when the list also holds float16 arrays or ``wire_fp16`` asks for it.

    A list of float16 and float32 arrays goes in ONE float16 buffer (one collective), as
    nnabla's half communicator casts every array to half (``ndarray->cast(dtype, ctx_)`` in
    ext ``src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu``
    ~780-783): in FP16 training cuDNN leaves the batch-norm gradients float32 (``DRV_BN_T``
    in ext ``src/nbla/cuda/cudnn/function/generic/batch_normalization.cu`` ~411-421), and
    a bucket would otherwise need a tiny float32 collective beside its float16 one."""
    kinds = set(dtypes)
    if _SINGLE in kinds and (wire_fp16 or _HALF in kinds):
        return [_HALF if d == _SINGLE else d for d in dtypes]
    return dtypes


class Layouts:
    """The layouts of the last ``KEPT_LISTS`` lists, most recently used last."""

    def __init__(self):
        self._entries = {}   # tuple of the arrays' hashes -> Layout

    def of(self, arrays):
        """The Layout of ``arrays`` (a list of NdArrays) as they are now."""
        key = tuple(map(hash, arrays))
        dtypes = dtypes_of(arrays)
        shapes = [a.shape for a in arrays]
        entry = self._entries.pop(key, None)
        if entry is None or entry.dtypes != dtypes or entry.shapes != shapes:
            entry = Layout(list(arrays), dtypes, shapes)
            if len(self._entries) >= KEPT_LISTS:
                del self._entries[next(iter(self._entries))]
        self._entries[key] = entry
        return entry
