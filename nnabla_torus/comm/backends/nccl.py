"""NCCL backend: the torus primitives mapped onto nnabla-ext-cuda's own communicator.

A thin mapping, not an NCCL binding: each primitive (reduce_scatter, all_gather, all_reduce,
bcast on a group) is one call of nnabla's ``MultiProcessDataParallelCommunicator`` on a group
made with its ``new_group``, padded where NCCL's equal chunks need it, with a watchdog around
each phase (nnabla's own times only the host-side enqueue). The mapping table, the device and
dtype rules, group creation, hangs and costs, with the nnabla sources they come from:
docs/gpu.md ("The NCCL mapping"). Buffers: nccl_device.py; the padding: nccl_padding.py;
loading the extension: nccl_setup.py.

Example (under ``mpirun -np 4``, one rank per GPU; the communicator normally drives this)::

    be = NCCLBackend(get_extension_context("cudnn"), timeout=300)
    row = be.group([0, 1] if be.rank < 2 else [2, 3])
    buf = be.buffer_of(grad_ndarray)
    shard = be.reduce_scatter(row, buf)      # our half of the row's sum, a view of buf
    be.all_gather(row, buf)                  # buf: the row's sum everywhere
"""
import contextlib
import socket

import numpy as np
from mpi4py import MPI

from ..collectives import mpi_sum_dtype
from ..errors import CollectiveTimeout, RankLost
from ..rendezvous import check_same_call
from ..waits import lost_ranks, wait_requests
from ..watchdog import Watchdog, gil_held_deadline
from ..settings import DEFAULTS
from .nccl_device import WIRE_TYPES, DeviceBuffers, nnabla_device, short_host, type_contexts
from .nccl_padding import PaddedChunks
from .nccl_setup import agree, load_extension, nnabla_watchdog


def mpi_error_in(error):
    """Whether ``error`` is nnabla's NBLA_MPI_CHECK failure ("`MPI_...` failed by `...`")."""
    text = str(error)
    return isinstance(error, RuntimeError) and "`MPI_" in text and "failed by" in text


class NCCLGroup:
    """A group of world ``ranks``: nnabla group ``name``, our ``rank`` (position) in it, and an
    mpi4py communicator ``control`` over it for the cross-rank argument check."""

    def __init__(self, name, ranks, rank, control):
        self.name, self.ranks, self.rank, self.control = name, list(ranks), rank, control
        self.size = len(self.ranks)


class NCCLBackend(PaddedChunks, DeviceBuffers):
    """Torus primitives on nnabla-ext-cuda's NCCL communicator (``fake_device``: on that stand-in
    for ``nnabla_ext.cuda``, e.g. :mod:`nnabla_torus.testing.fake_nccl`)."""

    # Every call this backend makes enqueues NCCL in order with the stream nnabla's kernels
    # run on, CUDA's legacy default stream: reduce_scatter and all_gather pass stream 0 (ext
    # src/nbla/cuda/communicator/multi_process_data_parallel_communicator.cu ~822-824,
    # ~914-916); the in-place all_reduce and bcast of one NdArray reach the list form (nnabla
    # python/src/nnabla/communicator.pyx ~241-250, ~361-370), which enqueues on the
    # communicator's own streams, made by plain cudaStreamCreate (ext .cu ~432-435, ~739-748):
    # blocking streams, which wait for stream 0's work and it for theirs. NCCL's kernels queue
    # behind backward's, so all-reducing buckets during backward cannot overlap on the device;
    # only nnabla's all_reduce_callback uses non-blocking streams (~998-1000, 1049-1050,
    # 1119-1135).
    overlaps_backward = False

    def __init__(self, ctx, timeout=DEFAULTS["timeout"], fake_device=None):
        fake = fake_device is not None
        self.name = "fake-nccl" if fake else "nccl"
        self.timeout = float(timeout)
        self.on_host = fake
        self.world = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.host = socket.gethostname()
        self.device_id, self.local_ranks = nnabla_device(self.world)   # ranks on this host
        self._ext = self._event_class = self._event = None

        def load():
            self._ext = load_extension(ctx, fake_device)
            if fake:
                self._ext.set_device(self.device_id)
                self._event_class = self._ext.Event
            else:
                from nnabla_ext.cuda.init import Event
                from . import cuda_env
                cuda_env.check_registered(type_contexts(ctx, fake, self.device_id)[
                    np.dtype(np.float32)])
                cuda_env.check_device(self.device_id, self.local_ranks)
                self._event_class = Event
        agree(self.world, load, f"loading the {self.name} backend")
        self._ctx = type_contexts(ctx, fake, self.device_id)
        self.ctx = self._ctx[np.dtype(np.float32)]
        self._dog = Watchdog(self.rank, self.timeout, self._abort_hung)
        self._comms = {}
        self._made = set()     # (dtype, group name) made on nnabla's communicator of dtype
        self.nccl_made = []    # (dtype name, ranks) of every NCCL communicator made, in order
        self._groups = {}
        self._pad = {}
        self._communicator(np.dtype(np.float32))
        self.world_group = NCCLGroup("world", range(self.size), self.rank, self.world.Dup())

    # -- nnabla communicators and groups -----------------------------------------------------
    # Every NCCL communicator holds device memory of its own (NCCL's buffers per channel and
    # peer: ~0.5-0.7 GB per group on 4 A100s, NVIDIA/nccl#964; ~1.6 GB for one and ~6 GB for
    # three or more, #864; 512 MiB even for a 1-rank one, #2363), and nnabla makes one per
    # init() and per new_group of a member (ncclCommInitRank, ext .cu 426, 510). So only the
    # float32 world one is made at start-up; the float16 one, and each group's NCCL
    # communicator per dtype, at the first call that needs it; a 1-rank group never (every
    # primitive returns before calling NCCL on it).
    def _communicator(self, dtype):
        """nnabla's communicator for ``dtype``, created on first use (collective over the world)."""
        comm = self._comms.get(dtype)
        if comm is not None:
            return comm
        what = f"creating the {dtype.name} NCCL communicator on rank {self.rank} ({self.host})"
        late = bool(self._comms)
        # nnabla's init() holds the GIL (nnabla python/src/nnabla/communicator.pyx ~113-121):
        # our watchdog cannot run inside it, so every rank is first checked to be here, with
        # our timeout, naming a missing rank (at start-up too: a rank that died before init()
        # would otherwise leave the others in nnabla's MPI_Allgather, ext .cu 397).
        check_same_call(self.world, list(range(self.size)), ("communicator", dtype.name),
                        self.timeout, what + (" (collective over all ranks: the first "
                                              f"{dtype.name} call must involve every rank, "
                                              "e.g. a world all-reduce)" if late else ""))
        with self._phase(what, sync=False), gil_held_deadline(self.timeout):
            if self.on_host:
                comm = self._ext.FakeMultiProcessDataParallelCommunicator(self._ctx[dtype])
            else:
                from . import cuda_env
                nnabla_watchdog(self.timeout)
                comm = cuda_env.create_communicator(self._ctx[dtype])
            comm.init()
        if comm.local_rank != self.device_id:
            raise RuntimeError(f"rank {self.rank} ({self.host}): nnabla put its NCCL communicator "
                               f"on GPU {comm.local_rank}, nnabla_torus on GPU {self.device_id} "
                               f"(earlier ranks on host {short_host()!r}); buffers would cross "
                               f"devices. Fix: give every host one distinct name")
        self._comms[dtype] = comm
        self.nccl_made.append((dtype.name, tuple(range(self.size))))
        return comm

    def group(self, ranks):
        """The group over ``ranks`` (its MPI control communicator made now by its members, in
        the order asked for; its NCCL communicators at their first call, ``_comm``)."""
        key = tuple(int(r) for r in ranks)
        if key == tuple(range(self.size)):
            return self.world_group
        if key not in self._groups:
            if self.rank not in key:
                raise ValueError(f"rank {self.rank} is not a member of group {list(key)}")
            name = "nnabla_torus:" + ",".join(map(str, key))
            what = f"creating group {list(key)} on rank {self.rank} ({self.host})"
            with self._dog.guard(what):  # mpi4py releases the GIL while it waits
                control = self.world.Create_group(self.world.Get_group().Incl(list(key)))
            self._groups[key] = NCCLGroup(name, key, key.index(self.rank), control)
        return self._groups[key]

    def _nnabla_group(self, comm, dtype, group):
        """Make ``group`` on nnabla's ``dtype`` communicator ``comm`` if not yet (collective over
        its members, at their first call on it: the same order on every member, since every
        member makes the same calls in the same order)."""
        if group.name == "world" or (dtype, group.name) in self._made:
            return
        # nnabla's new_group holds the GIL while it waits for the members (no watchdog of
        # ours could run): first make sure, with a timeout, that every member is here.
        what = (f"creating group {list(group.ranks)} ({dtype.name}) on rank {self.rank} "
                f"({self.host})")
        check_same_call(group.control, list(group.ranks), ("new_group", group.name, dtype.name),
                        self.timeout, what)
        with self._phase(f"new_group {group.name} ({dtype.name})", sync=False), \
                gil_held_deadline(self.timeout):
            comm.new_group((group.name, list(group.ranks)))
        self._made.add((dtype, group.name))
        self.nccl_made.append((dtype.name, tuple(group.ranks)))

    def _comm(self, buf, group):
        """nnabla's communicator for ``buf``'s dtype, with ``group`` made on it."""
        dtype = buf.dtype      # float32 or float16: other dtypes go through _on_host first
        comm = self._communicator(dtype)
        self._nnabla_group(comm, dtype, group)
        return comm

    def resources(self):
        """One line: the NCCL communicators this rank holds now and when more are made."""
        made = ", ".join(f"{'world' if len(r) == self.size else list(r)} {d}"
                         for d, r in self.nccl_made)
        return (f"nccl: {len(self.nccl_made)} NCCL communicator(s) on rank {self.rank} ({made}); "
                f"a group's, and the float16 world's, are made at their first call, a 1-rank "
                f"group's never. Each holds its own GPU memory (NCCL buffers per channel and "
                f"peer; reported ~0.5-1.6 GB each: NVIDIA/nccl#964, #864)")

    def _on_host(self, group, buf, what, start, sums=False):
        """Whether ``buf`` holds a dtype NCCL does not move (nccl_device.py); then run the
        collective on the host now: ``start(control, numpy view of buf)`` posts it on the
        group's mpi4py communicator and returns its request, waited for under the timeout.
        ``sums``: an MPI_SUM, which gets 8- and 16-bit integers as int64 (mpi_sum_dtype) and
        writes them back with numpy's wrapping cast."""
        if buf.dtype in WIRE_TYPES:
            return False
        view = buf.narrow()
        data = view.data
        wide = data.astype(mpi_sum_dtype(data.dtype), copy=False) if sums else data
        wait_requests([start(group.control, wide)], self.timeout, self._what(what, group),
                      group.ranks, self.rank)
        if wide is not data:
            data[...] = wide
        return True

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

    def watch(self, what, sync=False):
        """Context manager: a call that may wait for peers inside nnabla (e.g. backward with
        nnabla's all_reduce_callback), under our watchdog (ends the job past the timeout);
        ``sync``: then wait for its device work, GIL-free (``synchronize``)."""
        return self._phase(what, sync)

    def _abort_hung(self):
        lost = lost_ranks()
        if lost:    # the line tests/mpirun.py's LOST reads, as guarded_calls prints it
            print(f"nnabla_torus: rank {self.rank}: lost rank(s) {lost} during "
                  f"{self._dog.watching} ({self.host}); NCCL cannot tell, its kernels wait "
                  f"for them", flush=True)
        self.world.Abort(70)

    # -- primitives -------------------------------------------------------------------------
    def _what(self, op, group):
        return f"NCCL {op} on group {group.ranks} (rank {self.rank} on {self.host})"

    def _reduce_scatter_even(self, group, buf, chunk, what):
        # host dtypes: the whole sum (our chunk is what the caller reads)
        if self._on_host(group, buf, what, lambda c, a: c.Iallreduce(MPI.IN_PLACE, a), sums=True):
            return
        comm = self._comm(buf, group)
        chunks = [buf.narrow(i * chunk, chunk) for i in range(group.size)]
        with self._phase(self._what(what, group)):
            comm.reduce_scatter(chunks, chunks[group.rank], division=False, group=group.name)

    def _all_gather_even(self, group, buf, chunk, what):
        if self._on_host(group, buf, what, lambda c, a: c.Iallgather(MPI.IN_PLACE, a)):
            return
        comm = self._comm(buf, group)
        chunks = [buf.narrow(i * chunk, chunk) for i in range(group.size)]
        with self._phase(self._what(what, group)):
            comm.all_gather(chunks[group.rank], chunks, group=group.name)

    def all_reduce(self, group, buf, what="all_reduce"):
        """NCCL's all-reduce (ring or tree, NCCL's choice) of ``buf`` over ``group``."""
        if group.size > 1 and buf.size and not self._on_host(
                group, buf, what, lambda c, a: c.Iallreduce(MPI.IN_PLACE, a), sums=True):
            comm = self._comm(buf, group)
            with self._phase(self._what(what, group)):
                comm.all_reduce(buf.narrow(), division=False, inplace=True, group=group.name)

    library_all_reduce = all_reduce

    def bcast(self, group, buf, root, what="bcast"):
        """Copy ``buf`` of group position ``root`` to every member."""
        if group.size > 1 and buf.size and not self._on_host(
                group, buf, what, lambda c, a: c.Ibcast(a, root=root)):
            comm = self._comm(buf, group)
            with self._phase(self._what(what, group)):
                comm.bcast(buf.narrow(), root, inplace=True, group=group.name)

    def all_gather_into(self, group, shard, out, what="all_gather"):
        """``out`` (m * shard.size elements) receives every member's ``shard`` in group order."""
        size = shard.size
        if group.size == 1:
            self.copy(out, shard)
        elif size and not self._on_host(group, out, what, lambda c, a: c.Iallgather(
                shard.narrow().data.copy(), a)):
            comm = self._comm(out, group)
            chunks = [out.narrow(i * size, size) for i in range(group.size)]
            with self._phase(self._what(what, group)):
                comm.all_gather(shard.narrow(), chunks, group=group.name)

    def all_reduce_callback(self, arrays, pack_size, division, group, scale_grad, keep_dtype,
                            half=False):
        """nnabla's own backward callback (a C++ ``CommunicatorBackwardCallback`` that nnabla's
        ``backward(communicator_callbacks=...)`` accepts) from the communicator of the user's
        type (``half``: float16), on ``group``'s nnabla group (ext .cu:953-979)."""
        comm = self.nnabla_communicator(half, group)
        return comm.all_reduce_callback(arrays, pack_size, division, group.name, scale_grad,
                                        keep_dtype)

    def nnabla_communicator(self, half=False, group=None):
        """The nnabla communicator of the user's type (``half``: float16), e.g. for nnabla's own
        sync_batch_normalization kernel, with ``group`` (if given) made on it; group names are
        ``group(ranks).name``."""
        dtype = np.dtype(np.float16 if half else np.float32)
        comm = self._communicator(dtype)
        if group is not None:
            self._nnabla_group(comm, dtype, group)
        return comm

    # -- control ----------------------------------------------------------------------------
    def barrier(self, what="barrier"):
        wait_requests([self.world.Ibarrier()], self.timeout, what, range(self.size), self.rank)

    def abort(self, code=1):
        self.world.Abort(code)
