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
buffers are padded to a multiple of the world size times 16 bytes (``padded_length``: equal,
16-byte aligned chunks); a primitive called on
a buffer that its group size does not divide (``inplace=True`` all-reduce of a 17-element
array) goes through a zero-padded workspace, and its chunks are ``[i*c, (i+1)*c)`` cut at n
with c = ceil(n/m).

Buffers are ``DeviceSlice`` objects: a range of a 1-D device NdArray, narrowed only while an
operation runs, because nnabla forbids two live narrowed views of one array that overlap and
forbids casting a narrowed view to another dtype or device ("cast of child-arrays is not
permitted", nnabla ``src/nbla/synced_array.cpp``). So every nnabla function call here runs in
an explicit ``nn.context_scope`` of the buffer's device and dtype, and same-dtype copies use
``copy_from(src, use_current_context=False)``: nnabla's default (``True``) runs ``F.identity``
in the caller's default context, and ``IdentityCuda<T>`` casts its output to that context's T.

Device: nnabla's NCCL communicator uses GPU ``local_rank`` = the number of earlier ranks with
the same short host name. The backend computes that number itself (``device_id``), checks that
nnabla agrees and that the host has that many GPUs, and keeps every buffer there.

Communicators: one nnabla communicator per wire dtype (each reduces one dtype). The float32 one
is created at start-up; the float16 one on the first float16 call, after every rank of the
world agreed to create it (creation is collective over the world, so the first float16 call
must involve every rank, e.g. a world all-reduce; otherwise it times out naming the missing
ranks). Groups made before are replayed on it in creation order. ``close()`` frees both.

Groups are created by ``new_group`` on their members only, and nnabla's ``new_group`` is
collective over the members (MPI_Comm_create_group, then ncclCommInitRank); every rank creates
its groups in the order the caller asks for them (the communicator asks for row, then column,
on every rank), which keeps overlapping creations from deadlocking.

Completion and hangs: nnabla enqueues NCCL work and returns (reduce_scatter and all_gather on
the default stream); its own watchdog (NNABLA_MPI_WATCH_DOG_*) is armed only in ``init()`` and
``all_reduce`` and times that host-side enqueue only, so it catches no hung NCCL kernel. Here
each NCCL phase ends with a device synchronisation inside our watchdog (``timeout`` seconds;
a CUDA event wait, which releases the GIL, unlike nnabla_ext.cuda's ``synchronize``):
a phase that hangs (a peer never joins; a dead peer leaves NCCL kernels spinning) aborts the
job naming the phase, group, rank and host. Cost: one host round trip per phase. nnabla's
``init()`` and ``new_group`` hold the GIL while they wait, so our watchdog cannot end a hang
inside them: ``init()`` is covered by nnabla's watchdog (enabled with our timeout, unless
NNABLA_MPI_WATCH_DOG_ENABLE is set), and every member of a group is checked to be present,
with our timeout, before nnabla's ``new_group`` runs. An MPI error
inside nnabla (RuntimeError "`MPI_...` failed by ...") becomes ``RankLost`` naming the dead
rank(s) when the MPI library knows them (Open MPI with ``--mca mpi_ft_enable 1``).

Costs of going through nnabla's API (not measured): its reduce_scatter and all_gather take a
list of arrays and copy them into a fresh buffer of the whole size on every call (an
allocation and 2n element moves per reduce_scatter, 4n per all_gather, on top of NCCL's own;
docs/gpu.md), and every all_reduce first runs a 1-element MPI_Allreduce
(nnabla's check for arrays still zeroed on every rank).

Checked against the real nnabla-ext-cuda 1.39 only as far as it loads without a GPU (import,
communicator registration, construction: ``tools/gpu_stack_check.py``); the data path is
tested against ``fake_nccl`` (numpy on CPU, with the device rules above enforced).

Example (under ``mpirun -np 4``, one rank per GPU; the communicator normally drives this)::

    be = NCCLBackend(get_extension_context("cudnn"), timeout=300)
    row = be.group([0, 1] if be.rank < 2 else [2, 3])
    buf = be.flat(grad_ndarray)
    shard = be.reduce_scatter(row, buf)      # our half of the row's sum, a view of buf
    be.all_gather(row, buf)                  # buf: the row's sum everywhere
"""
import contextlib
import math
import os
import socket

import numpy as np
from mpi4py import MPI

from ..collectives import scale_numpy
from ..rendezvous import (CollectiveTimeout, RankLost, Watchdog, check_same_call, lost_ranks,
                          wait_requests)

WIRE_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "half"}
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


def agree(world, step, what):
    """Run ``step()`` on every rank; if it raised anywhere, raise on every rank naming the
    first failing rank and its message (set-up errors must not leave the others waiting)."""
    try:
        step()
        mine = None
    except Exception as e:  # noqa: BLE001  (re-raised below, on every rank)
        mine = f"{type(e).__name__}: {e}"
    errors = world.allgather(mine)
    bad = [(r, m) for r, m in enumerate(errors) if m]
    if bad:
        r, message = bad[0]
        raise RuntimeError(f"{what} failed on rank {r} ({len(bad)} rank(s) failed): {message}")


def mpi_error_in(error):
    """Whether ``error`` is nnabla's NBLA_MPI_CHECK failure ("`MPI_...` failed by `...`")."""
    text = str(error)
    return isinstance(error, RuntimeError) and "`MPI_" in text and "failed by" in text


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
    """nnabla contexts for float32 and float16 work on GPU ``device_id`` (fake: CPU; no
    ``ctx``: cudnn)."""
    from nnabla.ext_utils import get_extension_context
    ext = "cpu" if fake else "cudnn" if ctx is None else ctx.backend[0].split(":")[0]
    return {dtype: get_extension_context(ext, device_id=str(device_id), type_config=config)
            for dtype, config in WIRE_TYPES.items()}


def _load_extension(ctx, fake):
    """The module that makes and synchronises the device: fake_nccl, or nnabla_ext.cuda."""
    if fake:
        from ...testing import fake_nccl
        return fake_nccl
    if ctx is not None and not ctx.backend[0].startswith(("cuda", "cudnn")):  # None: cudnn
        raise ValueError(f"the nccl backend needs a CUDA context, e.g. get_extension_context("
                         f"'cudnn'), got backends {list(ctx.backend)}; or use "
                         f"NNABLA_TORUS_BACKEND=mpi (CPU) or fake-nccl (test)")
    from . import cuda_env
    return cuda_env.import_cuda_extension()


class NCCLBackend:
    """Torus primitives on nnabla-ext-cuda's NCCL communicator (``fake``: on ``fake_nccl``)."""

    # Every call this backend makes enqueues NCCL on CUDA's legacy default stream, the stream
    # nnabla's kernels run on: reduce_scatter and all_gather pass stream 0, a single-NdArray
    # all_reduce and bcast pass nullptr (ext src/nbla/cuda/communicator/
    # multi_process_data_parallel_communicator.cu ~773, ~822-824, ~874, ~914-916). NCCL's
    # kernels queue behind backward's, so all-reducing buckets during backward cannot overlap
    # on the device; only nnabla's all_reduce_callback uses non-blocking streams (~998-1000,
    # 1049-1050, 1119-1135).
    overlaps_backward = False

    def __init__(self, ctx, timeout=300.0, fake=False):
        self.name = "fake-nccl" if fake else "nccl"
        self.timeout = float(timeout)
        self.on_host = fake
        self.world = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.host = socket.gethostname()
        self.device_id, local_ranks = nnabla_device(self.world)
        self._ext = self._event_class = self._event = None

        def load():
            self._ext = _load_extension(ctx, fake)
            if fake:
                self._ext.set_device(self.device_id)
                self._event_class = self._ext.Event
            else:
                from nnabla_ext.cuda.init import Event
                from . import cuda_env
                cuda_env.check_registered(_type_contexts(ctx, fake, self.device_id)[
                    np.dtype(np.float32)])
                cuda_env.check_device(self.device_id, local_ranks)
                self._event_class = Event
        agree(self.world, load, f"loading the {self.name} backend")
        self._ctx = _type_contexts(ctx, fake, self.device_id)
        self.ctx = self._ctx[np.dtype(np.float32)]
        self._dog = Watchdog(self.rank, self.timeout, self._abort_hung)
        self._comms = {}
        self._group_names = []  # (name, ranks) in creation order, replayed on a late communicator
        self._groups = {}
        self._pad = {}
        self._communicator(np.dtype(np.float32))
        self.world_group = NCCLGroup("world", range(self.size), self.rank, self.world.Dup())

    # -- nnabla communicators and groups -----------------------------------------------------
    def _communicator(self, dtype):
        """nnabla's communicator for ``dtype``, created on first use (collective over the world)."""
        comm = self._comms.get(dtype)
        if comm is not None:
            return comm
        what = f"creating the {dtype.name} NCCL communicator on rank {self.rank} ({self.host})"
        if self._comms:  # a late one: every rank must be here, or we would hang in nnabla
            check_same_call(self.world, list(range(self.size)), ("communicator", dtype.name),
                            self.timeout, what + " (collective over all ranks: the first "
                            f"{dtype.name} call must involve every rank, e.g. a world all-reduce)")
        with self._phase(what, sync=False):
            if self.on_host:
                comm = self._ext.FakeMultiProcessDataParallelCommunicator(self._ctx[dtype])
            else:
                import nnabla.communicators as C
                # init() holds the GIL (our watchdog cannot run); nnabla's own watchdog, read
                # at construction, covers it: enabled with our timeout unless set already.
                os.environ.setdefault("NNABLA_MPI_WATCH_DOG_ENABLE", "1")
                os.environ.setdefault("NNABLA_MPI_WATCH_DOG_TIMEOUT", str(math.ceil(self.timeout)))
                comm = C.MultiProcessDataParallelCommunicator(self._ctx[dtype])
            comm.init()
        if comm.local_rank != self.device_id:
            raise RuntimeError(f"rank {self.rank} ({self.host}): nnabla put its NCCL communicator "
                               f"on GPU {comm.local_rank}, nnabla_torus on GPU {self.device_id} "
                               f"(earlier ranks on host {short_host()!r}); buffers would cross "
                               f"devices. Fix: give every host one distinct name")
        for name, ranks in self._group_names:
            with self._phase(f"new_group {name} ({dtype.name})", sync=False):
                comm.new_group((name, list(ranks)))
        self._comms[dtype] = comm
        return comm

    def group(self, ranks):
        """The group over ``ranks`` (created once by its members, in the order asked for)."""
        key = tuple(int(r) for r in ranks)
        if key == tuple(range(self.size)):
            return self.world_group
        if key not in self._groups:
            if self.rank not in key:
                raise ValueError(f"rank {self.rank} is not a member of group {list(key)}")
            name = "nnabla_torus:" + ",".join(map(str, key))
            # nnabla's new_group holds the GIL while it waits for the members (no watchdog of
            # ours could run): first make sure, with a timeout, that every member is here.
            what = f"creating group {list(key)} on rank {self.rank} ({self.host})"
            with self._dog.guard(what):  # mpi4py releases the GIL while it waits
                control = self.world.Create_group(self.world.Get_group().Incl(list(key)))
            check_same_call(control, list(key), ("new_group", name), self.timeout, what)
            for dtype, comm in self._comms.items():
                with self._phase(f"new_group {name} ({dtype.name})", sync=False):
                    comm.new_group((name, list(key)))
            self._group_names.append((name, key))
            self._groups[key] = NCCLGroup(name, key, key.index(self.rank), control)
        return self._groups[key]

    def _comm(self, buf):
        dtype = buf.dtype
        if dtype not in WIRE_TYPES:
            raise ValueError(f"the nccl backend moves float32 or float16, not {dtype}; "
                             f"cast the arrays or use NNABLA_TORUS_BACKEND=mpi")
        return self._communicator(dtype)

    def close(self):
        """Free the nnabla communicators (NCCL communicators, streams), groups and workspaces."""
        self._comms.clear()
        self._pad.clear()
        self._event = None
        for grp in list(self._groups.values()) + [self.world_group]:
            grp.control.Free()
        self._groups.clear()
        self.world.Free()

    # -- completion, hangs, dead peers ---------------------------------------------------------
    def synchronize(self):
        """Wait until the device has finished the work enqueued so far: a CUDA event recorded on
        the default stream (which also waits for nnabla's blocking NCCL streams). Its wait
        releases the GIL, so our watchdog thread can end a hang; nnabla_ext.cuda.synchronize
        (cudaDeviceSynchronize) holds the GIL while it waits, and the watchdog would never run."""
        if self._event is None:
            self._event = self._event_class(self.device_id)
        self._event.record()
        self._event.synchronize()

    @contextlib.contextmanager
    def _phase(self, what, sync=True):
        """Run one nnabla call (and, ``sync``, wait for its device work) under our watchdog;
        nnabla's MPI errors become RankLost when the MPI library knows of dead ranks."""
        try:
            with self._dog.guard(what):
                yield
                if sync:
                    self.synchronize()
        except (RankLost, CollectiveTimeout):
            raise
        except RuntimeError as e:
            if not mpi_error_in(e):
                raise
            lost = lost_ranks()
            if lost:
                raise RankLost(self.rank, lost, what) from e
            raise RuntimeError(f"rank {self.rank} ({self.host}): {what}: an MPI call inside "
                               f"nnabla failed: {str(e).strip().splitlines()[-1]}") from e

    def _abort_hung(self):
        lost = lost_ranks()
        if lost:
            print(f"nnabla_torus: rank {self.rank} ({self.host}): lost rank(s) {lost}; NCCL "
                  f"cannot tell, its kernels wait for them", flush=True)
        self.world.Abort(70)

    def _workspace(self, dtype, count):
        """A reusable zero-padding workspace of at least ``count`` elements."""
        buf = self._pad.get(dtype)
        if buf is None or buf.size < count:
            buf = self._pad[dtype] = self.empty(dtype, count)
        return self.sub(buf, 0, count)

    # -- primitives -------------------------------------------------------------------------
    def _what(self, op, group):
        return f"NCCL {op} on group {group.ranks} (rank {self.rank} on {self.host})"

    def reduce_scatter(self, group, buf, what="reduce_scatter"):
        """Sum ``buf`` over ``group``; return our chunk (a view of ``buf``) holding the sum."""
        m, n = group.size, buf.size
        if m == 1 or n == 0:
            return buf
        chunk = -(-n // m)
        lo, hi = min(group.rank * chunk, n), min((group.rank + 1) * chunk, n)
        if n % m == 0:
            self._reduce_scatter_even(group, buf, chunk, what)
            return self.sub(buf, lo, hi)
        work = self._workspace(buf.dtype, chunk * m)
        self.copy(self.sub(work, 0, n), buf)
        self.sub(work, n, chunk * m).fill(0)
        self._reduce_scatter_even(group, work, chunk, what)
        if hi > lo:
            self.copy(self.sub(buf, lo, hi), self.sub(work, lo, hi))
        return self.sub(buf, lo, hi)

    def _reduce_scatter_even(self, group, buf, chunk, what):
        comm = self._comm(buf)
        chunks = [buf.narrow(i * chunk, chunk) for i in range(group.size)]
        with self._phase(self._what(what, group)):
            comm.reduce_scatter(chunks, chunks[group.rank], division=False, group=group.name)

    def all_gather(self, group, buf, what="all_gather"):
        """Fill every chunk of ``buf`` with its owner's chunk (owner of chunk i: position i)."""
        m, n = group.size, buf.size
        if m == 1 or n == 0:
            return
        if n % m == 0:
            self._all_gather_even(group, buf, n // m, what)
            return
        chunk = -(-n // m)
        lo, hi = min(group.rank * chunk, n), min((group.rank + 1) * chunk, n)
        work = self._workspace(buf.dtype, chunk * m)
        if hi > lo:
            self.copy(self.sub(work, lo, hi), self.sub(buf, lo, hi))
        self._all_gather_even(group, work, chunk, what)
        self.copy(buf, self.sub(work, 0, n))

    def _all_gather_even(self, group, buf, chunk, what):
        comm = self._comm(buf)
        chunks = [buf.narrow(i * chunk, chunk) for i in range(group.size)]
        with self._phase(self._what(what, group)):
            comm.all_gather(chunks[group.rank], chunks, group=group.name)

    def all_reduce(self, group, buf, what="all_reduce"):
        """NCCL's all-reduce (ring or tree, NCCL's choice) of ``buf`` over ``group``."""
        if group.size > 1 and buf.size:
            comm = self._comm(buf)
            with self._phase(self._what(what, group)):
                comm.all_reduce(buf.narrow(), division=False, inplace=True, group=group.name)

    library_all_reduce = all_reduce

    def bcast(self, group, buf, root, what="bcast"):
        """Copy ``buf`` of group position ``root`` to every member."""
        if group.size > 1 and buf.size:
            comm = self._comm(buf)
            with self._phase(self._what(what, group)):
                comm.bcast(buf.narrow(), root, inplace=True, group=group.name)

    def all_gather_into(self, group, shard, out, what="all_gather"):
        """``out`` (m * shard.size elements) receives every member's ``shard`` in group order."""
        size = shard.size
        if group.size == 1:
            self.copy(out, shard)
        elif size:
            comm = self._comm(out)
            chunks = [out.narrow(i * size, size) for i in range(group.size)]
            with self._phase(self._what(what, group)):
                comm.all_gather(shard.narrow(), chunks, group=group.name)

    def all_reduce_callback(self, arrays, pack_size, division, group, scale_grad, keep_dtype,
                            half=False):
        """nnabla's own backward callback (a C++ ``CommunicatorBackwardCallback`` that nnabla's
        ``backward(communicator_callbacks=...)`` accepts) from the communicator of the user's
        type (``half``: float16), on ``group``'s nnabla group (ext .cu:953-979)."""
        comm = self.nnabla_communicator(half)
        return comm.all_reduce_callback(arrays, pack_size, division, group.name, scale_grad,
                                        keep_dtype)

    def nnabla_communicator(self, half=False):
        """The nnabla communicator of the user's type (``half``: float16), e.g. for nnabla's own
        sync_batch_normalization kernel; group names are ``group(ranks).name``."""
        return self._communicator(np.dtype(np.float16 if half else np.float32))

    # -- buffers: DeviceSlice ranges of device NdArrays ---------------------------------------
    def flat(self, ndarray, write=True):
        """A DeviceSlice over all of ``ndarray``, moved to our device in its dtype (no copy)."""
        try:
            dtype = ndarray.dtype
        except RuntimeError:  # new or zero()ed: no array yet; float32 is nnabla's default
            dtype = np.float32
        dtype = np.dtype(dtype)
        ctx = self._ctx.get(dtype, self.ctx)
        ndarray.cast(dtype, ctx)
        if self.on_host:
            self._ext.place(ndarray, self.device_id)
        base = ndarray if ndarray.ndim == 1 else ndarray.view((ndarray.size,))
        return DeviceSlice(base, 0, ndarray.size, ctx)

    def empty(self, dtype, count):
        import nnabla as nn
        dtype = np.dtype(dtype)
        ctx = self._ctx.get(dtype, self.ctx)
        base = nn.NdArray((count,))
        base.cast(dtype, ctx)
        if self.on_host:
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

    @staticmethod
    def sub(buf, start, stop):
        return DeviceSlice(buf.base, buf.start + start, stop - start, buf.ctx)

    def _native(self, dtype):
        """Whether nnabla functions can write ``dtype`` here (CPU functions are float32 only)."""
        return not self.on_host or dtype == np.float32

    def read(self, buf, index):
        import nnabla as nn
        import nnabla.functions as F
        with nn.context_scope(self.ctx):  # reads the element on our device, into a new array
            return float(F.identity(buf.narrow(index, 1)).data[0])

    def copy(self, dst, src):
        if not dst.size:
            return
        import nnabla as nn
        d, s = dst.narrow(), src.narrow()
        with nn.context_scope(self._ctx[dst.dtype]):
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
