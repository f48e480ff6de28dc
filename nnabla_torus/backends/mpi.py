"""MPI backend: ring reduce-scatter, all-gather and all-reduce on numpy buffers with mpi4py.

Buffers are 1-D contiguous numpy arrays (zero-copy views of CPU NdArrays). A group of m ranks
splits a buffer of n elements into m chunks of ``n // m`` or ``n // m + 1`` elements
(``numpy.array_split`` order), so any n works, including 0 and n < m, without padding.

Ring reduce-scatter, for a rank at position q of m (m - 1 steps)::

    step s: send chunk (q - s - 1) % m to the right neighbour,
            receive chunk (q - s - 2) % m from the left one and add it into our copy.
    after the last step chunk q holds the sum over the group.

Ring all-gather is the same walk with copies instead of sums. Each step moves a chunk in
segments of ``segment_bytes`` so adding one segment overlaps receiving the next. Sums of
float16 are rounded to float16 at every hop (numpy's float16 add), so an element's error is at
most about (p + 1) * 2**-11 * sum_r |x_r|.
"""
import numpy as np
from mpi4py import MPI

from ..knobs import env_value
from ..rendezvous import Watchdog, wait_requests


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

    def world_rank(self, position):
        return self.ranks[position % self.size]


class MPIBackend:
    """The three torus primitives (and the library's own all-reduce) over mpi4py.

    ``timeout`` (s) bounds every wait; ``segment_bytes`` is the pipelining unit of one ring
    step; ``poll_sleep`` (s) is how long a waiting rank sleeps between polls once a wait has
    lasted ``spin`` seconds, which frees the CPU for the other ranks of an oversubscribed node.
    """
    name = "mpi"

    def __init__(self, comm=None, timeout=300.0, segment_bytes=None, spin=None, poll_sleep=None):
        self.world = (comm if comm is not None else MPI.COMM_WORLD).Dup()
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.timeout = float(timeout)
        self.segment_bytes = int(segment_bytes or env_value(
            "NNABLA_TORUS_SEGMENT_BYTES", 4 << 20, int))
        self.spin = float(spin if spin is not None else env_value("NNABLA_TORUS_SPIN_S", 2e-4, float))
        self.poll_sleep = float(poll_sleep if poll_sleep is not None else env_value(
            "NNABLA_TORUS_POLL_SLEEP_S", 5e-5, float))
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

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, requests, what, peers):
        """Complete ``requests`` or raise CollectiveTimeout naming ``what`` and ``peers``."""
        wait_requests(requests, self.timeout, what, peers, self.rank, self.spin, self.poll_sleep)

    def scratch(self, dtype, count):
        """A reusable receive buffer of at least ``count`` elements (grows, never shrinks)."""
        buf = self._scratch.get(np.dtype(dtype))
        if buf is None or buf.size < count:
            buf = np.empty(max(count, 1), dtype=dtype)
            self._scratch[np.dtype(dtype)] = buf
        return buf[:count]

    # -- primitives -------------------------------------------------------------------------
    def _segments(self, start, stop, itemsize):
        step = max(1, self.segment_bytes // itemsize)
        return [(a, min(a + step, stop)) for a in range(start, stop, step)] or [(start, start)]

    def reduce_scatter(self, group, buf, what="reduce_scatter"):
        """Sum ``buf`` over ``group`` so that our chunk (``chunk_bounds``) holds the result.

        Returns that chunk (a view of ``buf``). Other chunks are left partially summed.
        """
        m, q = group.size, group.rank
        bounds = chunk_bounds(buf.size, m)
        if m == 1:
            return buf
        comm, right, left = group.comm, (q + 1) % m, (q - 1) % m
        tmp = self.scratch(buf.dtype, bounds[1] - bounds[0])
        for s in range(m - 1):
            send_i, recv_i = (q - s - 1) % m, (q - s - 2) % m
            r0 = bounds[recv_i]
            sends = [comm.Isend(buf[a:b], right, tag=s)
                     for a, b in self._segments(bounds[send_i], bounds[send_i + 1], buf.itemsize)]
            recv_segments = self._segments(r0, bounds[recv_i + 1], buf.itemsize)
            recvs = [comm.Irecv(tmp[a - r0:b - r0], left, tag=s) for a, b in recv_segments]
            for (a, b), req in zip(recv_segments, recvs):
                self.wait([req], f"{what} step {s + 1}/{m - 1}", [group.world_rank(left)])
                np.add(buf[a:b], tmp[a - r0:b - r0], out=buf[a:b])
            self.wait(sends, f"{what} step {s + 1}/{m - 1}", [group.world_rank(right)])
        return buf[bounds[q]:bounds[q + 1]]

    def all_gather(self, group, buf, what="all_gather"):
        """Fill every chunk of ``buf`` with its owner's chunk (owner of chunk i: position i)."""
        m, q = group.size, group.rank
        if m == 1:
            return
        bounds = chunk_bounds(buf.size, m)
        comm, right, left = group.comm, (q + 1) % m, (q - 1) % m
        for s in range(m - 1):
            send_i, recv_i = (q - s) % m, (q - s - 1) % m
            reqs = [comm.Irecv(buf[bounds[recv_i]:bounds[recv_i + 1]], left, tag=s),
                    comm.Isend(buf[bounds[send_i]:bounds[send_i + 1]], right, tag=s)]
            self.wait(reqs, f"{what} step {s + 1}/{m - 1}",
                      [group.world_rank(left), group.world_rank(right)])

    def all_reduce(self, group, buf, what="all_reduce"):
        """Ring all-reduce: reduce-scatter then all-gather (bandwidth-optimal)."""
        self.reduce_scatter(group, buf, what + " (reduce-scatter)")
        self.all_gather(group, buf, what + " (all-gather)")

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
        with self.watchdog.guard(what):
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
    def padded_length(count):
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
        np.multiply(buf, buf.dtype.type(factor), out=buf)

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
