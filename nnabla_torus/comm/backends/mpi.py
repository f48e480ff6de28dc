"""MPI backend: ring reduce-scatter, all-gather and all-reduce on numpy buffers with mpi4py.

Buffers are 1-D contiguous numpy arrays (zero-copy views of CPU NdArrays); a group of m ranks
splits one into m chunks (``chunk_bounds``), so any length works without padding. Each ring
primitive is also a generator of waits (``*_steps``) that ``run_steps`` runs alone, and
``run_lanes`` (:mod:`.lanes`) advances several at once: that is how ``collectives.torus2d``
overlaps the row phases of one piece with the column phase of another. Inside one host a group
may share memory instead
(:class:`.mpi_shared.SharedMemoryPath`); the buffer methods: :class:`.mpi_buffers.HostBuffers`.
The ring's steps, the float16 error bound and the shared path's byte counts:
docs/communicator.md#the-mpi-backend.
"""
import numpy as np
from mpi4py import MPI

from ..collectives import mpi_sum_dtype
from ..waits import wait_requests
from ..watchdog import Watchdog
from ..settings import DEFAULTS, mpi_settings
from .lanes import PolledLanes, run_lanes
from .mpi_buffers import HostBuffers
from .mpi_shared import SharedMemoryPath, chunk_bounds


def raw(buf):
    """The mpi4py message that moves ``buf``'s bytes (MPI.BYTE): data that is only moved needs
    no MPI datatype of its own, and Open MPI 4.1 has none for float16 (mpi4py: "cannot map 'e'
    to MPI datatype"). Reductions keep typed buffers."""
    return [buf.reshape(-1).view(np.uint8), MPI.BYTE]


class Group:
    """A sub-communicator over ``ranks`` (world ranks, ring order) that this rank belongs to."""

    def __init__(self, comm, ranks):
        self.comm = comm
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.rank = comm.Get_rank()  # position in the ring
        self.control = comm.Dup()    # small control messages, apart from the data traffic
        self.gather_comm = comm.Dup()  # all-gathers, apart from reduce-scatters
        self.sync = None      # HostSync when the members share memory (MPIBackend.share)
        self.segments = None  # SharedSegments, made by the first shared_all_reduce
        self.node = None      # the members' Split_type(COMM_TYPE_SHARED) communicator
        self.half = 0         # which half of the segments the next piece uses
        self.check_value = 0  # hash of the checked call whose first arrival is still to come
        self.share_tried = False

    def world_rank(self, position):
        return self.ranks[position % self.size]


class MPIBackend(SharedMemoryPath, HostBuffers):
    """The three torus primitives (and the library's own all-reduce) over mpi4py.

    ``timeout`` (s) bounds every wait; ``segment_bytes`` is the pipelining unit of one ring
    step; ``pipeline_bytes`` is the size of the pieces whose torus phases overlap (0: none);
    ``poll_sleep`` (s) is how long a waiting rank sleeps between polls once a wait has lasted
    ``spin`` seconds, which frees the CPU for the other ranks of an oversubscribed node.
    """
    name = "mpi"
    host_views = True   # fused.pack/unpack copy through cached numpy views (array_layout.Part)

    def __init__(self, comm=None, timeout=DEFAULTS["timeout"], segment_bytes=None,
                 pipeline_bytes=None, spin=None, poll_sleep=None, shm=None, shm_bytes=None):
        self.world = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.timeout = float(timeout)
        knobs = mpi_settings(segment_bytes, pipeline_bytes, spin, poll_sleep, shm, shm_bytes)
        self.segment_bytes, self.pipeline_bytes = knobs["segment_bytes"], knobs["pipeline_bytes"]
        self.shm, self.shm_bytes = knobs["shm"], knobs["shm_bytes"]
        self.spin, self.poll_sleep = knobs["spin"], knobs["poll_sleep"]
        self._groups = {}
        self._scratch = {}
        self._cpu = None
        self.watchdog = Watchdog(self.rank, self.timeout, lambda: self.abort(70))
        self.world_group = self.group(range(self.size))

    # -- groups -----------------------------------------------------------------------------
    def group(self, ranks):
        """The Group over ``ranks`` (created once, collectively over its members)."""
        key = tuple(ranks)
        if key not in self._groups:
            if self.rank not in key:
                raise ValueError(f"rank {self.rank} is not a member of group {list(key)}")
            sub = self.world.Create_group(self.world.Get_group().Incl(list(key)))
            self._groups[key] = Group(sub, key)
        return self._groups[key]

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, requests, what, peers):
        """Complete ``requests`` or raise CollectiveTimeout naming ``what`` and ``peers``."""
        wait_requests(requests, self.timeout, what, peers, self.rank, self.spin, self.poll_sleep)

    def scratch(self, dtype, count, owner=None):
        """A reusable buffer of ``count`` elements for ``owner`` (grows, never shrinks).

        Operations that may run at once (the reduce-scatters of two groups) use two owners.
        """
        key = (np.dtype(dtype), owner)
        buf = self._scratch.get(key)
        if buf is None or buf.size < count:
            buf = np.empty(max(count, 1), dtype=dtype)
            self._scratch[key] = buf
        return buf[:count]

    def run_steps(self, steps):
        """Run one generator of waits (see the module docstring) to its end; returns its value."""
        while True:
            try:
                ready, what, peers = next(steps)
            except StopIteration as stop:
                return stop.value
            self.wait(ready, what, peers)

    def run_lanes(self, lanes):
        """Advance generators of waits together until all have finished (:mod:`.lanes`);
        between polls it waits as ``wait`` does (waits.Pacer)."""
        run_lanes(lanes, PolledLanes(self.rank, self.spin, self.poll_sleep), self.rank,
                  self.timeout)

    def pieces(self, buf):
        """``buf`` cut into contiguous views of about ``pipeline_bytes`` (one piece if 0)."""
        if self.pipeline_bytes <= 0 or buf.nbytes <= self.pipeline_bytes:
            return [buf]
        count = min(buf.size, -(-buf.nbytes // self.pipeline_bytes))
        bounds = chunk_bounds(buf.size, count)
        return [buf[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    # -- primitives -------------------------------------------------------------------------
    def _segments(self, start, stop, itemsize):
        step = max(1, self.segment_bytes // itemsize)
        return [(a, min(a + step, stop)) for a in range(start, stop, step)] or [(start, start)]

    def reduce_scatter(self, group, buf, what="reduce_scatter"):
        """Sum ``buf`` over ``group`` so that our chunk (``chunk_bounds``) holds the result.

        Returns that chunk (a view of ``buf``). Other chunks are left partially summed.
        """
        return self.run_steps(self.reduce_scatter_steps(group, buf, what))

    def all_gather(self, group, buf, what="all_gather"):
        """Fill every chunk of ``buf`` with its owner's chunk (owner of chunk i: position i)."""
        self.run_steps(self.all_gather_steps(group, buf, what))

    def all_reduce(self, group, buf, what="all_reduce"):
        """Ring all-reduce: reduce-scatter then all-gather (bandwidth-optimal)."""
        self.run_steps(self.all_reduce_steps(group, buf, what))

    def reduce_scatter_steps(self, group, buf, what="reduce_scatter"):
        """``reduce_scatter`` as a generator of waits; its value is our chunk."""
        m, q = group.size, group.rank
        bounds = chunk_bounds(buf.size, m)
        if m == 1:
            return buf
        comm, right, left = group.comm, (q + 1) % m, (q - 1) % m
        tmp = self.scratch(buf.dtype, bounds[1] - bounds[0], owner=group)
        for s in range(m - 1):
            send_i, recv_i = (q - s - 1) % m, (q - s - 2) % m
            r0 = bounds[recv_i]
            sends = [comm.Isend(raw(buf[a:b]), right, tag=s)
                     for a, b in self._segments(bounds[send_i], bounds[send_i + 1], buf.itemsize)]
            recv_segments = self._segments(r0, bounds[recv_i + 1], buf.itemsize)
            recvs = [comm.Irecv(raw(tmp[a - r0:b - r0]), left, tag=s) for a, b in recv_segments]
            for (a, b), req in zip(recv_segments, recvs):
                yield [req], f"{what} step {s + 1}/{m - 1}", [group.world_rank(left)]
                np.add(buf[a:b], tmp[a - r0:b - r0], out=buf[a:b])
            yield sends, f"{what} step {s + 1}/{m - 1}", [group.world_rank(right)]
        return buf[bounds[q]:bounds[q + 1]]

    def all_gather_steps(self, group, buf, what="all_gather"):
        """``all_gather`` as a generator of waits."""
        m, q = group.size, group.rank
        if m == 1:
            return
        bounds = chunk_bounds(buf.size, m)
        comm, right, left = group.gather_comm, (q + 1) % m, (q - 1) % m
        for s in range(m - 1):
            send_i, recv_i = (q - s) % m, (q - s - 1) % m
            reqs = [comm.Irecv(raw(buf[bounds[recv_i]:bounds[recv_i + 1]]), left, tag=s),
                    comm.Isend(raw(buf[bounds[send_i]:bounds[send_i + 1]]), right, tag=s)]
            yield reqs, f"{what} step {s + 1}/{m - 1}", [group.world_rank(left),
                                                         group.world_rank(right)]

    def all_reduce_steps(self, group, buf, what="all_reduce"):
        """``all_reduce`` as a generator of waits."""
        yield from self.reduce_scatter_steps(group, buf, what + " (reduce-scatter)")
        yield from self.all_gather_steps(group, buf, what + " (all-gather)")

    def library_all_reduce(self, group, buf, what="native all_reduce"):
        """The MPI library's own ``MPI_Allreduce``."""
        if group.size == 1 or buf.size == 0:
            return
        wide_dtype = np.dtype(np.float32) if buf.dtype == np.float16 else mpi_sum_dtype(buf.dtype)
        if wide_dtype != buf.dtype:
            # MPI has no float16 sum (reduced in float32 scratch, rounded once at the end), and
            # Open MPI saturates 8- and 16-bit integer sums (mpi_sum_dtype): a wider scratch.
            wide = self.scratch(wide_dtype, buf.size)
            wide[:] = buf
            self.library_all_reduce(group, wide, what)
            buf[:] = wide
            return
        # Blocking MPI_Allreduce: Open MPI's non-blocking one is a slower algorithm (half
        # duplex on TCP), so the watchdog, not polling, enforces the timeout here.
        with self.watchdog.guard(what, group.ranks):
            group.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def bcast(self, group, buf, root, what="bcast"):
        """Copy ``buf`` of group position ``root`` to every member."""
        if group.size > 1 and buf.size:
            self.wait([group.comm.Ibcast(raw(buf), root=root)], what, [group.world_rank(root)])

    def all_gather_into(self, group, shard, out, what="all_gather"):
        """``out`` (m * shard.size elements) receives every member's ``shard`` in group order."""
        req = group.comm.Iallgather(raw(shard), raw(out))
        self.wait([req], what, group.ranks)

    # -- control ----------------------------------------------------------------------------
    def barrier(self, what="barrier"):
        self.wait([self.world.Ibarrier()], what, range(self.size))

    def abort(self, code=1):
        self.world.Abort(code)
