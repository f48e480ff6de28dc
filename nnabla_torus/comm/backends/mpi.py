"""MPI backend: ring reduce-scatter, all-gather and all-reduce on numpy buffers with mpi4py.

Buffers are 1-D contiguous numpy arrays (zero-copy views of CPU NdArrays). A group of m ranks
splits a buffer of n elements into m chunks of ``n // m`` or ``n // m + 1`` elements
(``numpy.array_split`` order), so any n works, including 0 and n < m, without padding.

Ring reduce-scatter, for a rank at position q of m (m - 1 steps)::

    step s: send chunk (q - s - 1) % m to the right neighbour,
            receive chunk (q - s - 2) % m from the left one and add it into our copy.
    after the last step chunk q holds the sum over the group.

Ring all-gather is the same walk with copies instead of sums. Each step moves a chunk in
segments of ``segment_bytes`` so adding one segment overlaps receiving the next.

Each primitive is also a generator of waits (``reduce_scatter_steps``, ``all_gather_steps``,
``all_reduce_steps``): it posts its messages, yields ``(ready, what, peers)`` where ``ready``
is a list of requests (or a callable that says whether a dependency is met), and goes on once
they completed. ``run_lanes`` advances several such generators at once, which is how
``collectives.torus2d`` overlaps the row phases of one piece of a buffer with the column
phase of another. The all-gathers run on their own communicator (``Group.gather_comm``), so a
reduce-scatter and an all-gather of the same group may be in flight together. Sums of
float16 are rounded to float16 at every hop (numpy's float16 add), so an element's error is at
most about (p + 1) * 2**-11 * sum_r |x_r|.

Inside one host a group can instead share memory (``share``: MPI-3 windows from
``MPI.Win.Allocate_shared`` on ``Split_type(COMM_TYPE_SHARED)``) and ``shared_all_reduce``
moves each byte the fewest times: each member copies the chunks others own into its segment,
sums its own chunk straight from the others' segments (in cache-sized blocks, so the partial
sum stays in cache across the p - 1 adds), publishes it, and copies the others' sums out::

    per member, n bytes, m members: copy in (m-1)/m n, read n and write 2n/m to sum its chunk,
    copy out (m-1)/m n; two arrivals (shared flags, no message) per piece of ``shm_bytes``.

Small buffers (m x n up to ``SHM_ONE_ARRIVAL_BYTES``, no column phase) take one arrival instead:
each member copies its whole buffer in and, after the arrival, sums all m segments itself, in
member order (so every member gets the same bits). A checked call's first arrival also carries
the hash of its arguments (``Group.check_value``), so on one host the cross-rank argument check
costs no synchronisation of its own.

A ring over messages moves every byte through the library's own shared-memory copies twice
more (sender's buffer into the transport's, transport's into the receiver's).
"""
import logging
import time

import numpy as np
from mpi4py import MPI

from ..collectives import PIPELINE_BYTES, scale_numpy
from ...knobs import knob_value, number, parse_bool
from ..rendezvous import CallMismatch, HostSync, Pacer, Watchdog, allocate_shared, overdue, wait_requests

logger = logging.getLogger("nnabla_torus")
_notes_said = set()  # notes are logged once per process
SHM_BLOCK_BYTES = 256 << 10  # the shared path sums in blocks of this size (fits in L2 cache)
# Up to this many bytes summed per member (m members x the piece's bytes) every member sums
# all segments itself after one arrival: m x the reads of the two-arrival path, but one
# synchronisation less. Measured here: better up to 1 MiB on 4 ranks, 512 KiB on 8
# (docs/communicator.md).
SHM_ONE_ARRIVAL_BYTES = 4 << 20


def chunk_bounds(n, m):
    """Offsets of the m chunks of an n-element buffer: chunk i is ``[b[i], b[i+1])``."""
    base, extra = divmod(n, m)
    sizes = np.full(m, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).tolist()


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


class SharedSegments:
    """One segment per member in an MPI-3 shared window, in two halves of ``nbytes``.

    Pieces alternate halves: a member writes a half only after everyone passed the arrivals
    of the piece in between, so nobody still reads what it overwrites.
    """

    def __init__(self, node, nbytes):
        self.nbytes = nbytes
        self.win = allocate_shared(2 * nbytes, node)
        self.memory = [np.frombuffer(self.win.Shared_query(j)[0], dtype=np.uint8, count=2 * nbytes)
                       for j in range(node.Get_size())]

    def views(self, half, dtype, count):
        """Every member's segment ``half`` as ``count`` elements of ``dtype``."""
        start = half * self.nbytes
        size = count * np.dtype(dtype).itemsize
        return [m[start:start + size].view(dtype) for m in self.memory]

    def free(self):
        self.win.Free()


# The longest sleep between two polls of a wait, seconds: every wait (each ring step of every
# collective) may sleep this long once more after its data arrived, so 10 ms already costs a
# 100-step ring up to a second (the reports: POLL_SLEEP_S=10 stalled > 90 s).
POLL_SLEEP_MAX_S = 0.01


def settings(segment_bytes=None, pipeline_bytes=None, spin=None, poll_sleep=None, shm=None,
             shm_bytes=None):
    """The backend's knobs (keyword argument, else environment, else default), validated."""
    return dict(
        shm=knob_value(shm, "shm", "NNABLA_TORUS_SHM", True, parse_bool),
        shm_bytes=knob_value(shm_bytes, "shm_bytes", "NNABLA_TORUS_SHM_BYTES", 32 << 20,
                             number(int, low=1, hint="bytes per member and shared piece, "
                                    "e.g. 33554432")),
        segment_bytes=knob_value(segment_bytes, "segment_bytes", "NNABLA_TORUS_SEGMENT_BYTES",
                                 4 << 20, number(int, low=1, hint="bytes per ring message, "
                                                 "e.g. 4194304")),
        pipeline_bytes=knob_value(pipeline_bytes, "pipeline_bytes", "NNABLA_TORUS_PIPELINE_BYTES",
                                  PIPELINE_BYTES, number(int, low=0, hint="bytes per torus "
                                                         "piece; 0: no pieces")),
        spin=knob_value(spin, "spin", "NNABLA_TORUS_SPIN_S", 2e-4,
                        number(float, low=0, hint="seconds, e.g. 0.0002")),
        poll_sleep=knob_value(poll_sleep, "poll_sleep", "NNABLA_TORUS_POLL_SLEEP_S", 5e-5,
                              number(float, low=0, high=POLL_SLEEP_MAX_S,
                                     hint="seconds a waiting rank sleeps per poll, e.g. "
                                          "0.00005; 0: yield only")))


class MPIBackend:
    """The three torus primitives (and the library's own all-reduce) over mpi4py.

    ``timeout`` (s) bounds every wait; ``segment_bytes`` is the pipelining unit of one ring
    step; ``pipeline_bytes`` is the size of the pieces whose torus phases overlap (0: none);
    ``poll_sleep`` (s) is how long a waiting rank sleeps between polls once a wait has lasted
    ``spin`` seconds, which frees the CPU for the other ranks of an oversubscribed node.
    """
    name = "mpi"

    def __init__(self, comm=None, timeout=300.0, segment_bytes=None, pipeline_bytes=None,
                 spin=None, poll_sleep=None, shm=None, shm_bytes=None):
        self.world = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.timeout = float(timeout)
        knobs = settings(segment_bytes, pipeline_bytes, spin, poll_sleep, shm, shm_bytes)
        self.segment_bytes, self.pipeline_bytes = knobs["segment_bytes"], knobs["pipeline_bytes"]
        self.shm, self.shm_bytes = knobs["shm"], knobs["shm_bytes"]
        self.spin, self.poll_sleep = knobs["spin"], knobs["poll_sleep"]
        self._groups = {}
        self._scratch = {}
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

    def share(self, group):
        """Map shared memory for ``group``, whose members the caller knows share a host;
        collective over its members. True when it worked; else every member falls back to
        messages and rank 0 says why once (the library refused, or the members are on more
        than one node as the library sees it)."""
        if group.sync is not None or group.size == 1 or not self.shm or group.share_tried:
            return group.sync is not None
        group.share_tried = True   # a refusal is said once and not retried
        node, sync, reason = None, None, ""
        try:
            node = group.comm.Split_type(MPI.COMM_TYPE_SHARED, key=group.rank)
            if node.Get_size() != group.size:
                reason = (f"the MPI library puts them on {group.size // node.Get_size()}+ "
                          f"nodes")
        except (MPI.Exception, NotImplementedError) as e:
            reason = f"Split_type(COMM_TYPE_SHARED) failed: {e}"
        if not self._all_can(group, reason, node):
            return False
        try:
            sync = HostSync(node, self.spin, self.poll_sleep)
        except (MPI.Exception, NotImplementedError) as e:
            reason = f"MPI.Win.Allocate_shared failed: {e}"
        if not self._all_can(group, reason, node):
            return False
        group.node, group.sync = node, sync
        return True

    def _all_can(self, group, reason, node):
        """True when no member of ``group`` gave a ``reason`` to fall back; else say it once."""
        reasons = group.control.allgather(reason)
        bad = [(group.ranks[i], r) for i, r in enumerate(reasons) if r]
        if not bad:
            return True
        note = (f"shared-memory path off for ranks {group.ranks} (rank {bad[0][0]}: "
                f"{bad[0][1]}); using point-to-point messages (NNABLA_TORUS_SHM=0 turns it off)")
        if note not in _notes_said:
            _notes_said.add(note)
            logger.warning(note)
        if node is not None:
            node.Free()
        return False

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

    def run(self, steps):
        """Run one generator of waits (see the module docstring) to its end; returns its value."""
        while True:
            try:
                ready, what, peers = next(steps)
            except StopIteration as stop:
                return stop.value
            self.wait(ready, what, peers)

    def run_lanes(self, lanes):
        """Advance generators of waits together until all have finished.

        A lane goes on as soon as its requests complete (or its callable returns True); a wait
        on requests that lasts ``timeout`` seconds raises CollectiveTimeout naming its peers.
        Between polls it waits as ``wait`` does (rendezvous.Pacer).
        """
        pacer = Pacer(self.rank, self.spin, self.poll_sleep)
        waiting = []  # [lane, (ready, what, peers), since]
        for lane in lanes:
            item = next(lane, None)
            if item is not None:
                waiting.append([lane, item, pacer.start])
        while waiting:
            moved = False
            for entry in list(waiting):
                lane, item, since = entry
                while item is not None and (item[0]() if callable(item[0])
                                            else MPI.Request.Testall(item[0])):
                    item, since, moved = next(lane, None), time.monotonic(), True
                if item is None:
                    waiting.remove(entry)
                    continue
                entry[1], entry[2] = item, since
                if not callable(item[0]) and time.monotonic() - since > self.timeout:
                    raise overdue(self.rank, item[1], self.timeout, item[2])
            if moved:
                pacer.progressed()
            elif waiting:   # name a wait on peers, not a lane's wait for another lane
                pacer.idle(next((e[1][1] for e in waiting if e[1][1]), "pipelined all-reduce"),
                           [r for e in waiting for r in e[1][2]])

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
        return self.run(self.reduce_scatter_steps(group, buf, what))

    def all_gather(self, group, buf, what="all_gather"):
        """Fill every chunk of ``buf`` with its owner's chunk (owner of chunk i: position i)."""
        self.run(self.all_gather_steps(group, buf, what))

    def all_reduce(self, group, buf, what="all_reduce"):
        """Ring all-reduce: reduce-scatter then all-gather (bandwidth-optimal)."""
        self.run(self.all_reduce_steps(group, buf, what))

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
            sends = [comm.Isend(buf[a:b], right, tag=s)
                     for a, b in self._segments(bounds[send_i], bounds[send_i + 1], buf.itemsize)]
            recv_segments = self._segments(r0, bounds[recv_i + 1], buf.itemsize)
            recvs = [comm.Irecv(tmp[a - r0:b - r0], left, tag=s) for a, b in recv_segments]
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
            reqs = [comm.Irecv(buf[bounds[recv_i]:bounds[recv_i + 1]], left, tag=s),
                    comm.Isend(buf[bounds[send_i]:bounds[send_i + 1]], right, tag=s)]
            yield reqs, f"{what} step {s + 1}/{m - 1}", [group.world_rank(left),
                                                         group.world_rank(right)]

    def all_reduce_steps(self, group, buf, what="all_reduce"):
        """``all_reduce`` as a generator of waits."""
        yield from self.reduce_scatter_steps(group, buf, what + " (reduce-scatter)")
        yield from self.all_gather_steps(group, buf, what + " (all-gather)")

    def shared_all_reduce(self, group, buf, what="shared all_reduce", column=None):
        """Sum ``buf`` over ``group`` through shared memory (``share`` must have worked).

        ``column(shard)``, if given, runs between the reduce-scatter and the all-gather on this
        member's summed chunk (torus2d's column phase, hierarchical's cross-host all-reduce).
        Buffers larger than ``shm_bytes`` go in pieces. A checked call's mismatch raises
        CallMismatch at the first arrival, before any member reads another's segment.
        """
        m, q = group.size, group.rank
        step = max(1, self.shm_bytes // buf.itemsize)
        for start in range(0, buf.size, step):
            piece = buf[start:start + step]
            segments = self._shared_segments(group, piece, what)
            mine = segments[q]
            # The next piece uses the other half; flipped after the first arrival, so a call
            # whose check failed there (CallMismatch) leaves every member's half alike.
            if column is None and piece.nbytes * m <= SHM_ONE_ARRIVAL_BYTES:
                mine[:] = piece
                self._arrive(group, f"{what} (shared sum)")
                group.half ^= 1
                np.add(segments[0], segments[1], out=piece)
                for j in range(2, m):
                    np.add(piece, segments[j], out=piece)
                continue
            bounds = chunk_bounds(piece.size, m)
            a, b = bounds[q], bounds[q + 1]
            mine[:a] = piece[:a]
            mine[b:] = piece[b:]
            self._arrive(group, f"{what} (shared reduce-scatter)")
            group.half ^= 1
            own = piece[a:b]
            block = max(1, SHM_BLOCK_BYTES // buf.itemsize)
            for s in range(0, b - a, block):
                part = own[s:s + block]
                for j in range(m):
                    if j != q:
                        np.add(part, segments[j][a + s:a + s + part.size], out=part)
                if column is None:   # publish the block while it is still in cache
                    mine[a + s:a + s + part.size] = part
            if column is not None:
                column(own)
                mine[a:b] = own
            self._arrive(group, f"{what} (shared all-gather)")
            for j in range(m):
                if j != q:
                    piece[bounds[j]:bounds[j + 1]] = segments[j][bounds[j]:bounds[j + 1]]

    def _arrive(self, group, what):
        """Wait at the group's HostSync. The first arrival of a checked call carries its hash
        (``group.check_value``) and raises CallMismatch when a member's differs."""
        value, group.check_value = group.check_value, 0
        if group.sync.arrive(value, self.timeout, what, group.ranks):
            raise CallMismatch(what)

    def check_arrival(self, group, what):
        """The argument check of a call still waiting for it (``group.check_value``): an
        arrival of its own, before an exchange whose first synchronisation is not this group's
        shared arrival (messages, the library's all-reduce) or at the end of a call that had
        none (empty buffers)."""
        if group.check_value:
            self._arrive(group, f"{what} (argument check)")

    def _shared_segments(self, group, piece, what):
        """The members' segments for ``piece`` (half ``group.half``), grown collectively when
        it does not fit: every member grows at the same piece, since pieces follow from the
        buffer size that the argument check agreed on."""
        seg = group.segments
        if seg is None or seg.nbytes < piece.nbytes:
            self._arrive(group, f"{what} (growing the shared window)")  # nobody reads the old
            with self.watchdog.guard(f"{what} (allocating the shared window)"):
                if seg is not None:
                    seg.free()
                nbytes = min(max(piece.nbytes, 1 << 16, 2 * (seg.nbytes if seg else 0)),
                             max(self.shm_bytes, piece.nbytes))
                seg = group.segments = SharedSegments(group.node, nbytes)
        return seg.views(group.half, piece.dtype, piece.size)

    def library_all_reduce(self, group, buf, what="native all_reduce"):
        """The MPI library's own ``MPI_Allreduce``."""
        if group.size == 1 or buf.size == 0:
            return
        if buf.dtype == np.float16:
            # MPI has no float16 sum: reduce in float32 scratch, round once at the end.
            wide = self.scratch(np.float32, buf.size)
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
            self.wait([group.comm.Ibcast(buf, root=root)], what, [group.world_rank(root)])

    def all_gather_into(self, group, shard, out, what="all_gather"):
        """``out`` (m * shard.size elements) receives every member's ``shard`` in group order."""
        req = group.comm.Iallgather(shard, out)
        self.wait([req], what, group.ranks)

    # -- buffers: 1-D numpy arrays, zero-copy views of CPU NdArrays ---------------------------
    @staticmethod
    def flat(ndarray, write=True):
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
        """Squared L2 norm (BLAS dot; float16 is widened 1 Mi elements at a time)."""
        if buf.dtype != np.float16:
            return float(np.dot(buf, buf))
        step = 1 << 20
        return sum(float(np.dot(part, part)) for part in
                   (buf[a:a + step].astype(np.float32) for a in range(0, buf.size, step)))

    # -- control ----------------------------------------------------------------------------
    def barrier(self, what="barrier"):
        self.wait([self.world.Ibarrier()], what, range(self.size))

    def abort(self, code=1):
        self.world.Abort(code)
