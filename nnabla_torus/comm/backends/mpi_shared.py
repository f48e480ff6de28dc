"""The MPI backend's shared-memory path: the ranks of a group on one host sum through an
MPI-3 shared window (``MPI.Win.Allocate_shared`` on ``Split_type(COMM_TYPE_SHARED)``)
instead of messages, each byte moved the fewest times; small buffers take one arrival.
A checked call's first arrival carries the hash of its arguments (``Group.check_value``), so
on one host the cross-rank argument check costs no synchronisation of its own.
How the bytes move and why these sizes:
docs/communicator.md#shared-memory-inside-a-host-mpi-backend.
"""
import numpy as np
from mpi4py import MPI

from ..job_log import WARNING, note
from ..host_sync import HostSync, allocate_shared
from ..rendezvous import CallMismatch

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



class SharedMemoryPath:
    """The shared-memory methods of ``MPIBackend`` (a base class: they use its ``timeout``,
    ``shm``, ``shm_bytes``, ``spin``, ``poll_sleep`` and ``watchdog``)."""

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
        text = (f"shared-memory path off for ranks {group.ranks} (rank {bad[0][0]}: "
                f"{bad[0][1]}); using point-to-point messages (NNABLA_TORUS_SHM=0 turns it off)")
        note(text, WARNING)
        if node is not None:
            node.Free()
        return False

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
