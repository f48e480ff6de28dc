"""Arrivals of the ranks of one host in a shared-memory window: a barrier that compares a value.
"""
import os
import time

import numpy as np
from mpi4py import MPI

from .errors import CollectiveTimeout
from .waits import POLL_SLEEP_S, SPIN_S, Pacer


def allocate_shared(nbytes, comm):
    """``MPI.Win.Allocate_shared`` of ``nbytes`` on this rank over ``comm`` (one host), byte
    displacements. A module function so that a test can make the library refuse it."""
    return MPI.Win.Allocate_shared(nbytes, 1, comm=comm)


class HostSync:
    """Arrival flags of a group whose members share one host, in an MPI-3 shared window.

    Member i owns slot i (one 64-byte cache line): its arrival count, and per parity of the
    count the 63-bit hash of the call it arrived at. ``arrive(value)`` is a barrier that also
    compares the members' values: a member can run at most one arrival ahead of the slowest
    (it cannot pass the next one alone), so the parity slot it writes is never the one a peer
    still reads. Every member reads every slot, so a mismatch is seen by all of them. An
    arrival sends no message (a few numpy calls), but it is a synchronisation: its time is
    the wait for the slowest member, as for the two-message check. ``comm`` is a communicator
    over exactly the group's members in group order (``Split_type(COMM_TYPE_SHARED)``).
    """
    SLOT = 8  # int64 per member: a cache line, so members do not write the same line

    def __init__(self, comm, spin=SPIN_S, poll_sleep=POLL_SLEEP_S):
        size, self.me = comm.Get_size(), comm.Get_rank()
        self.win = allocate_shared(size * self.SLOT * 8 if self.me == 0 else 0, comm)
        memory, _ = self.win.Shared_query(0)
        self.slots = np.frombuffer(memory, dtype=np.int64, count=size * self.SLOT)
        self.slots = self.slots.reshape(size, self.SLOT)
        self.slots[self.me] = 0
        # A passive epoch for the whole life of the window: Sync() is then the memory barrier
        # that orders our stores and loads against the peers' (a no-op on x86, needed on ARM).
        self.win.Lock_all(MPI.MODE_NOCHECK)
        comm.Barrier()  # every slot is zero before anyone arrives
        self.spin, self.poll_sleep = spin, poll_sleep
        self.count = 0

    def arrive(self, value, timeout, what, ranks):
        """Wait until every member arrived here; True when some member's ``value`` differs
        from ours (0: no comparison). CollectiveTimeout names the members that did not arrive
        within ``timeout`` s (``ranks``: their world ranks in group order)."""
        self.count += 1
        count, slots, win = self.count, self.slots, self.win
        mine = slots[self.me]
        mine[1 + (count & 1)] = value
        win.Sync()   # the value is visible before the count that announces it
        mine[0] = count
        win.Sync()
        arrived = slots[:, 0]
        if arrived.min() < count:
            pacer = Pacer(ranks[self.me], self.spin, self.poll_sleep)
            while arrived.min() < count:
                if time.monotonic() - pacer.start > timeout:
                    late = [ranks[i] for i in np.flatnonzero(arrived < count)]
                    raise CollectiveTimeout(
                        f"rank {ranks[self.me]}: rank(s) {late} did not arrive at {what} within "
                        f"{timeout:g} s; still waiting for rank(s) {late} (NNABLA_TORUS_TIMEOUT "
                        f"sets the limit)")
                # Oversubscribed cores: give the core to a peer that has not arrived yet.
                os.sched_yield()
                pacer.idle(what, [ranks[i] for i in np.flatnonzero(arrived < count)])
                win.Sync()
        return bool(value) and bool((slots[:, 1 + (count & 1)] != value).any())

    def free(self):
        self.win.Unlock_all()
        self.win.Free()
