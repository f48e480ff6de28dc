"""NCCL backend: the torus primitives mapped onto nnabla-ext-cuda's own communicator.

A thin mapping, not an NCCL binding: every primitive is one call of
``nnabla.communicators.MultiProcessDataParallelCommunicator`` (nnabla-ext-cuda's
``MultiProcessDataParallelCommunicatorNccl``) on a group made with its ``new_group``:

==========================  ==================================================================
torus primitive             nnabla call (group = the row, the column or the world)
==========================  ==================================================================
reduce_scatter(g, buf)      ``reduce_scatter([chunk 0 .. chunk m-1], chunk q, group=g)``
all_gather(g, buf)          ``all_gather(chunk q, [chunk 0 .. chunk m-1], group=g)``
all_reduce(g, buf)          ``all_reduce(buf, inplace=True, group=g)`` (NCCL's own all-reduce,
                            so on this backend ``ring`` and ``native`` are the same call)
bcast(g, buf, root)         ``bcast(buf, root, inplace=True, group=g)``; ``root`` is the
                            position in the group, as in nnabla (NCCL's root is a group rank)
==========================  ==================================================================

NCCL splits a buffer into m equal chunks (chunk i = ``[i*c, (i+1)*c)``, c = n/m), so fused
buffers are padded to a multiple of the world size (``padded_length``); a primitive called on
a buffer that its group size does not divide (``inplace=True`` all-reduce of a 17-element
array) goes through a zero-padded workspace, and its chunks are ``[i*c, (i+1)*c)`` cut at n
with c = ceil(n/m).

Buffers are ``DeviceSlice`` objects: a range of a 1-D device NdArray, narrowed only while an
operation runs, because nnabla forbids two live narrowed views of one array that overlap and
forbids casting a narrowed view to another dtype or device. Two nnabla communicators are
created, one per wire dtype (float32 and float16), since each reduces one dtype only.

Groups are created by ``new_group`` on their members only, and nnabla's ``new_group`` is
collective over the members (MPI_Comm_create_group, then ncclCommInitRank); every rank creates
its groups in the order the caller asks for them (the communicator asks for row, then column,
on every rank), which keeps overlapping creations from deadlocking.

Costs of going through nnabla's API (not measured): its reduce_scatter and all_gather take a
list of arrays and copy them into a fresh buffer of the whole size on every call (one extra
device copy of n elements and an allocation per phase), and every all_reduce first runs a
1-element MPI_Allreduce (nnabla's check for arrays still zeroed on every rank).

Timeouts: the control messages (argument check, barrier) time out after ``timeout`` seconds;
inside an NCCL call only nnabla's watchdog can end a hang, so it is enabled with the same
timeout (NNABLA_MPI_WATCH_DOG_ENABLE=1, NNABLA_MPI_WATCH_DOG_TIMEOUT, unless already set);
it aborts the process, which ends the job.

Not measured on GPUs: this mapping is tested against ``fake_nccl`` (numpy on CPU) only.

Example (under ``mpirun -np 4``, one rank per GPU; the communicator normally drives this)::

    be = NCCLBackend(get_extension_context("cudnn"), timeout=300)
    row = be.group([0, 1] if be.rank < 2 else [2, 3])
    buf = be.flat(grad_ndarray)
    shard = be.reduce_scatter(row, buf)      # our half of the row's sum, a view of buf
    be.all_gather(row, buf)                  # buf: the row's sum everywhere
"""
import math
import os

import numpy as np
from mpi4py import MPI

from ..collectives import scale_numpy
from ..rendezvous import wait_requests

WIRE_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "half"}


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


class NCCLGroup:
    """A group of world ``ranks``: nnabla group ``name``, our ``rank`` (position) in it, and an
    mpi4py communicator ``control`` over it for the cross-rank argument check."""

    def __init__(self, name, ranks, rank, control):
        self.name, self.ranks, self.rank, self.control = name, list(ranks), rank, control
        self.size = len(self.ranks)


def _type_contexts(ctx, fake, device_id):
    """nnabla contexts for float32 and float16 work on the device of ``ctx``."""
    from nnabla.ext_utils import get_extension_context
    ext = "cpu" if fake or ctx is None else ctx.backend[0].split(":")[0]
    return {dtype: get_extension_context(ext, device_id=str(device_id), type_config=config)
            for dtype, config in WIRE_TYPES.items()}


def _make_communicator(ctx, fake, timeout):
    if fake:
        from .fake_nccl import FakeMultiProcessDataParallelCommunicator
        return FakeMultiProcessDataParallelCommunicator(ctx, timeout=timeout)
    if not ctx.backend[0].startswith(("cuda", "cudnn")):
        raise ValueError(f"the nccl backend needs a CUDA context, e.g. get_extension_context("
                         f"'cudnn'), got backends {list(ctx.backend)}; or use "
                         f"NNABLA_TORUS_BACKEND=mpi (CPU) or fake-nccl (test)")
    try:
        import nnabla_ext.cuda  # noqa: F401  (registers the NCCL communicator)
    except ImportError as e:
        raise RuntimeError(f"the nccl backend needs nnabla-ext-cuda ({e}); install the [gpu] "
                           f"extra or use NNABLA_TORUS_BACKEND=mpi") from None
    import nnabla.communicators as C
    return C.MultiProcessDataParallelCommunicator(ctx)


class NCCLBackend:
    """Torus primitives on nnabla-ext-cuda's NCCL communicator (``fake``: on ``fake_nccl``)."""

    def __init__(self, ctx, timeout=300.0, fake=False):
        self.name = "fake-nccl" if fake else "nccl"
        self.timeout = float(timeout)
        self.on_host = fake
        self.world = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        if not fake:
            os.environ.setdefault("NNABLA_MPI_WATCH_DOG_ENABLE", "1")
            os.environ.setdefault("NNABLA_MPI_WATCH_DOG_TIMEOUT", str(math.ceil(self.timeout)))
        self._comms = {}
        for dtype, type_ctx in _type_contexts(ctx, fake, 0).items():
            self._comms[dtype] = _make_communicator(type_ctx, fake, self.timeout)
            self._comms[dtype].init()
        # nnabla picks device local_rank for its NCCL communicator; buffers must live there.
        self._ctx = _type_contexts(ctx, fake, self._comms[np.dtype(np.float32)].local_rank)
        self.ctx = self._ctx[np.dtype(np.float32)]
        self._groups = {}
        self._pad = {}
        self.world_group = NCCLGroup("world", range(self.size), self.rank, self.world.Dup())

    # -- groups -----------------------------------------------------------------------------
    def group(self, ranks):
        """The group over ``ranks`` (created once by its members, in the order asked for)."""
        key = tuple(int(r) for r in ranks)
        if key == tuple(range(self.size)):
            return self.world_group
        if key not in self._groups:
            if self.rank not in key:
                raise ValueError(f"rank {self.rank} is not a member of group {list(key)}")
            name = "nnabla_torus:" + ",".join(map(str, key))
            for comm in self._comms.values():
                comm.new_group((name, list(key)))
            control = self.world.Create_group(self.world.Get_group().Incl(list(key)))
            self._groups[key] = NCCLGroup(name, key, key.index(self.rank), control)
        return self._groups[key]

    def _comm(self, buf):
        try:
            return self._comms[buf.dtype]
        except KeyError:
            raise ValueError(f"the nccl backend moves float32 or float16, not {buf.dtype}; "
                             f"cast the arrays or use NNABLA_TORUS_BACKEND=mpi") from None

    def _workspace(self, dtype, count):
        """A reusable zero-padding workspace of at least ``count`` elements."""
        buf = self._pad.get(dtype)
        if buf is None or buf.size < count:
            buf = self._pad[dtype] = self.empty(dtype, count)
        return self.sub(buf, 0, count)

    # -- primitives -------------------------------------------------------------------------
    def reduce_scatter(self, group, buf, what="reduce_scatter"):
        """Sum ``buf`` over ``group``; return our chunk (a view of ``buf``) holding the sum."""
        m, n = group.size, buf.size
        if m == 1 or n == 0:
            return buf
        chunk = -(-n // m)
        lo, hi = min(group.rank * chunk, n), min((group.rank + 1) * chunk, n)
        if n % m == 0:
            self._reduce_scatter_even(group, buf, chunk)
            return self.sub(buf, lo, hi)
        work = self._workspace(buf.dtype, chunk * m)
        self.copy(self.sub(work, 0, n), buf)
        self.sub(work, n, chunk * m).fill(0)
        self._reduce_scatter_even(group, work, chunk)
        if hi > lo:
            self.copy(self.sub(buf, lo, hi), self.sub(work, lo, hi))
        return self.sub(buf, lo, hi)

    def _reduce_scatter_even(self, group, buf, chunk):
        chunks = [buf.narrow(i * chunk, chunk) for i in range(group.size)]
        self._comm(buf).reduce_scatter(chunks, chunks[group.rank], division=False,
                                       group=group.name)

    def all_gather(self, group, buf, what="all_gather"):
        """Fill every chunk of ``buf`` with its owner's chunk (owner of chunk i: position i)."""
        m, n = group.size, buf.size
        if m == 1 or n == 0:
            return
        if n % m == 0:
            self._all_gather_even(group, buf, n // m)
            return
        chunk = -(-n // m)
        lo, hi = min(group.rank * chunk, n), min((group.rank + 1) * chunk, n)
        work = self._workspace(buf.dtype, chunk * m)
        if hi > lo:
            self.copy(self.sub(work, lo, hi), self.sub(buf, lo, hi))
        self._all_gather_even(group, work, chunk)
        self.copy(buf, self.sub(work, 0, n))

    def _all_gather_even(self, group, buf, chunk):
        chunks = [buf.narrow(i * chunk, chunk) for i in range(group.size)]
        self._comm(buf).all_gather(chunks[group.rank], chunks, group=group.name)

    def all_reduce(self, group, buf, what="all_reduce"):
        """NCCL's all-reduce (ring or tree, NCCL's choice) of ``buf`` over ``group``."""
        if group.size > 1 and buf.size:
            self._comm(buf).all_reduce(buf.narrow(), division=False, inplace=True,
                                       group=group.name)

    library_all_reduce = all_reduce

    def bcast(self, group, buf, root, what="bcast"):
        """Copy ``buf`` of group position ``root`` to every member."""
        if group.size > 1 and buf.size:
            self._comm(buf).bcast(buf.narrow(), root, inplace=True, group=group.name)

    def all_gather_into(self, group, shard, out, what="all_gather"):
        """``out`` (m * shard.size elements) receives every member's ``shard`` in group order."""
        size = shard.size
        if group.size == 1:
            self.copy(out, shard)
        elif size:
            chunks = [out.narrow(i * size, size) for i in range(group.size)]
            self._comm(out).all_gather(shard.narrow(), chunks, group=group.name)

    # -- buffers: DeviceSlice ranges of device NdArrays ---------------------------------------
    def flat(self, ndarray, write=True):
        """A DeviceSlice over all of ``ndarray``, moved to our device in its dtype (no copy)."""
        try:
            dtype = ndarray.dtype
        except RuntimeError:  # new or zero()ed: no array yet; float32 is nnabla's default
            dtype = np.float32
        ndarray.cast(dtype, self.ctx)
        base = ndarray if ndarray.ndim == 1 else ndarray.view((ndarray.size,))
        return DeviceSlice(base, 0, ndarray.size, self.ctx)

    def empty(self, dtype, count):
        import nnabla as nn
        base = nn.NdArray((count,))
        base.cast(np.dtype(dtype), self.ctx)
        return DeviceSlice(base, 0, count, self.ctx)

    def padded_length(self, count):
        """``count`` rounded up to a multiple of the world size (NCCL's equal chunks)."""
        return -(-count // self.size) * self.size

    @staticmethod
    def sub(buf, start, stop):
        return DeviceSlice(buf.base, buf.start + start, stop - start, buf.ctx)

    def _native(self, dtype):
        """Whether nnabla functions can write ``dtype`` here (CPU functions are float32 only)."""
        return not self.on_host or dtype == np.float32

    def read(self, buf, index):
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self.ctx):
            return float(F.identity(buf.narrow(index, 1)).data[0])

    def copy(self, dst, src):
        if not dst.size:
            return
        d, s = dst.narrow(), src.narrow()
        if dst.dtype == src.dtype:
            d.copy_from(s)
        elif self._native(dst.dtype):
            import nnabla as nn
            import nnabla.functions as F
            # Identity would give its output the input's dtype; MulScalar writes the context's.
            with nn.context_scope(self._ctx[dst.dtype]):
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
            with nn.context_scope(self._ctx[buf.dtype]):
                F.mul_scalar(view, float(factor), outputs=[view])
        else:
            scale_numpy(view.data, factor)

    def sqnorm(self, buf):
        """Squared L2 norm, summed in float32 on the device."""
        if not buf.size:
            return 0.0
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self.ctx):
            return float(F.sum(F.pow_scalar(buf.narrow(), 2.0)).data)

    # -- control ----------------------------------------------------------------------------
    def barrier(self, what="barrier"):
        wait_requests([self.world.Ibarrier()], self.timeout, what, range(self.size), self.rank)

    def abort(self, code=1):
        self.world.Abort(code)
