"""Rendezvous: every rank of a group arrives at the same collective with matching arguments.

Members compare a 64-bit hash of each call (two small messages, or one arrival in a shared
window, ``HostSync``); differing arguments raise ``ValueError`` on every member, a rank that
never arrives ``CollectiveTimeout``, a dead rank ``RankLost``, one that left its script
``RankGone`` (:mod:`nnabla_torus.comm.failfast`). Why: docs/communicator.md#errors-and-failures.
"""
import contextlib
import hashlib
import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from . import failfast
from .settings import DEFAULTS

SPIN_S, POLL_SLEEP_S = DEFAULTS["spin"], DEFAULTS["poll_sleep"]  # the knobs' defaults, seconds

# Groups larger than this check calls with one non-blocking all-reduce of (hash, -hash) under
# MPI_MAX: O(log p) messages at every rank instead of p - 1 receives and p - 1 sends at the
# first member (at 2,176 ranks and ~10 calls per step, milliseconds per step in Python). A
# rank that never arrives is then not named (the timeout names the group).
GATHER_MAX = 64
CHECK_TAG = 7301
VERDICT_TAG = 7302
LOST_CHECK_S = 0.01  # seconds between checks for dead ranks while a wait polls (< 1 us each)
GONE_CHECK_S = 0.1   # seconds between the watchdog's checks for ranks that left their script
# A blocking library all-reduce can return on one rank (which may then exit normally) while
# another still waits for a third: the watchdog trusts an exit notice only after this long.
BLOCKING_EXIT_GRACE_S = 10.0


class CollectiveTimeout(RuntimeError):
    """A peer did not take part in a collective within the timeout."""


class RankLost(RuntimeError):
    """A rank of the job died (the MPI library reported it failed) during ``what``."""

    def __init__(self, rank, lost, what):
        self.rank, self.lost, self.what = rank, list(lost), what
        super().__init__(f"rank {rank}: lost rank(s) {self.lost} during {what}")


class RankGone(RuntimeError):
    """A rank this one waits for has left its script (exited without dying) during ``what``."""

    def __init__(self, rank, gone, what):
        self.rank, self.gone, self.what = rank, list(gone), what
        super().__init__(f"rank {rank}: rank(s) {self.gone} left the script (sys.exit, an "
                         f"early return or an error handled there) while this rank waits for "
                         f"them in {what}; they will not arrive")


def lost_ranks():
    """World ranks the MPI library knows have died, ascending; ``[]`` when it does not track
    failures (Open MPI without ``--mca mpi_ft_enable 1``, or an MPI without ``Comm_get_failed``).
    """
    try:
        failed = MPI.COMM_WORLD.Get_failed()
    except (NotImplementedError, MPI.Exception):
        return []
    try:
        count = failed.Get_size()
        if count == 0:
            return []
        world = MPI.COMM_WORLD.Get_group()
        try:
            return sorted(MPI.Group.Translate_ranks(failed, list(range(count)), world))
        finally:
            world.Free()
    finally:
        failed.Free()


def rank_lost(error, rank, what):
    """``RankLost`` for an ``MPI.Exception`` raised because a process died, else None."""
    if not isinstance(error, MPI.Exception):
        return None
    lost = lost_ranks()
    return RankLost(rank, lost, what) if lost else None


def wait_requests(requests, timeout, what, peers, rank, spin=SPIN_S, poll_sleep=POLL_SLEEP_S):
    """Complete mpi4py ``requests`` or raise CollectiveTimeout naming ``what`` and ``peers``.

    Polls instead of blocking in ``MPI_Waitall`` so that (1) a hang becomes an error that names
    the peers and (2) after ``spin`` seconds a waiting rank sleeps ``poll_sleep`` seconds
    between polls, leaving the CPU to the ranks that still compute (oversubscribed nodes).
    A rank that dies (as far as the MPI library can tell) raises RankLost naming it, within
    ``LOST_CHECK_S`` of the library noticing, even when this wait is not for the dead rank; a
    rank of ``peers`` that left its script raises RankGone.
    """
    try:
        if MPI.Request.Testall(requests):
            return
        pacer = Pacer(rank, spin, poll_sleep)
        while not MPI.Request.Testall(requests):
            if time.monotonic() - pacer.start > timeout:
                raise overdue(rank, what, timeout, peers)
            pacer.idle(what, peers)
    except MPI.Exception as e:  # with fault tolerance on, a dead peer fails its requests
        lost = rank_lost(e, rank, what)
        if lost is None:
            raise
        raise lost from e


class Pacer:
    """How a polling loop waits between polls that made no progress.

    It spins for ``spin`` seconds after the last progress, then sleeps ``poll_sleep`` seconds
    per poll; every ``LOST_CHECK_S`` it asks the MPI library for dead ranks and raises RankLost,
    and raises RankGone when a rank it waits for has left its script (``failfast.gone``).
    """

    def __init__(self, rank, spin, poll_sleep):
        self.rank, self.spin, self.poll_sleep = rank, spin, poll_sleep
        self.start = self.progress_at = time.monotonic()
        self.check_at = self.start + LOST_CHECK_S

    def progressed(self):
        self.progress_at = time.monotonic()

    def idle(self, what, peers=()):
        """One poll found nothing to do (while waiting in ``what`` for ``peers``)."""
        now = time.monotonic()
        if now > self.check_at:
            lost = lost_ranks()
            if lost:
                raise RankLost(self.rank, lost, what)
            left = failfast.gone(peers)
            if left:
                raise RankGone(self.rank, left, what)
            self.check_at = now + LOST_CHECK_S
        if now - self.progress_at > self.spin:
            time.sleep(self.poll_sleep)


def overdue(rank, what, timeout, peers):
    """The CollectiveTimeout of a wait for ``peers`` that outlived ``timeout`` seconds."""
    return CollectiveTimeout(
        f"rank {rank}: {what} did not finish within {timeout:g} s; still waiting for "
        f"rank(s) {sorted(set(peers))} (NNABLA_TORUS_TIMEOUT sets the limit)")


class Watchdog:
    """Abort the job when a blocking library call outlives its timeout.

    For calls that cannot be polled (the library's own blocking ``MPI_Allreduce``, which is
    faster than its non-blocking twin). One daemon thread sleeps until the deadline of the
    guarded call; entering and leaving a guard costs a lock and a notify. Given the call's
    ``peers``, it also wakes every ``GONE_CHECK_S`` and aborts when one of them has
    left its script ``BLOCKING_EXIT_GRACE_S`` ago (``failfast.gone``). Example::

        dog = Watchdog(rank=0, timeout=300, abort=lambda: MPI.COMM_WORLD.Abort(70))
        with dog.guard("native all_reduce", peers=[1, 2, 3]):
            comm.Allreduce(MPI.IN_PLACE, buf)
    """

    def __init__(self, rank, timeout, abort):
        self.rank, self.timeout, self.abort = rank, timeout, abort
        self._what, self._peers = None, []
        self._deadline = 0.0
        self._cond = threading.Condition()
        self._thread = None

    @contextlib.contextmanager
    def guard(self, what, peers=()):
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="nnabla-torus-watchdog",
                                                daemon=True)
                self._thread.start()
            self._what, self._peers = what, list(peers)
            self._deadline = time.monotonic() + self.timeout
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._what = None

    def _watch(self):
        with self._cond:
            while True:
                if self._what is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                # The guarded thread is blocked in its call (it holds no MPI request of ours),
                # and it cannot leave the guard while we hold the lock: gone() is ours alone.
                gone = (failfast.gone(self._peers, BLOCKING_EXIT_GRACE_S)
                        if self._peers else [])
                if left > 0 and not gone:
                    self._cond.wait(min(left, GONE_CHECK_S) if self._peers else left)
                    continue
                why = (f"{RankGone(self.rank, gone, self._what)}" if gone else
                       f"rank {self.rank}: {self._what} did not finish within {self.timeout:g} s "
                       f"(a blocking library call: it cannot tell which rank is missing); "
                       f"NNABLA_TORUS_TIMEOUT sets the limit")
                print(f"nnabla_torus: {why}; aborting the job", file=sys.stderr, flush=True)
                self.abort()
                return


def call_hash(signature):
    """A 63-bit hash of a call signature (any repr-able value)."""
    digest = hashlib.blake2b(repr(signature).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


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


class CallMismatch(Exception):
    """A HostSync arrival that carried a call's hash saw a member's hash differ (every member
    sees it at the same arrival); the caller turns it into ``raise_mismatch``'s ValueError."""


def check_same_call(control, ranks, signature, timeout, what, describe=None, sync=None):
    """Raise on every member of the group unless all members call with ``signature``.

    ``control`` is an mpi4py communicator over the group (position i is world rank
    ``ranks[i]``) used for nothing else; ``signature`` is any repr-able description.
    ``describe(signatures)`` (one per member) may word the ValueError's message. With ``sync``
    (the group's ``HostSync``: its members share a host) the hashes meet in shared memory
    instead of two messages through the first member; groups over ``GATHER_MAX`` members use
    one non-blocking all-reduce (a cost that does not grow with p at any one rank).
    """
    size, me = control.Get_size(), control.Get_rank()
    if size == 1:
        return
    if sync is not None:
        if sync.arrive(call_hash(signature) or 1, timeout, what, ranks):
            raise_mismatch(control, ranks, signature, what, describe)
        return
    if size > GATHER_MAX:
        digest = call_hash(signature)
        extremes = np.empty(2, dtype=np.int64)   # (max hash, -min hash) over the members
        wait_requests([control.Iallreduce(np.array([digest, -digest], dtype=np.int64),
                                          extremes, op=MPI.MAX)],
                      timeout, what + " (argument check)", ranks, ranks[me])
        if extremes[0] != -extremes[1]:
            raise_mismatch(control, ranks, signature, what, describe)
        return
    mine = np.array([call_hash(signature)], dtype=np.int64)
    if me == 0:
        hashes = np.zeros(size, dtype=np.int64)
        hashes[0] = mine[0]
        recvs = [control.Irecv(hashes[i:i + 1], source=i, tag=CHECK_TAG) for i in range(1, size)]
        try:
            wait_requests(recvs, timeout, what, ranks[1:], ranks[0])
        except CollectiveTimeout:
            missing = [ranks[i + 1] for i, r in enumerate(recvs) if not r.Test()]
            raise CollectiveTimeout(
                f"rank {ranks[0]}: rank(s) {missing} did not arrive at {what} within "
                f"{timeout:g} s (NNABLA_TORUS_TIMEOUT sets the limit)") from None
        verdict = np.array([int(np.all(hashes == hashes[0]))], dtype=np.int64)
        wait_requests([control.Isend(verdict, dest=i, tag=VERDICT_TAG) for i in range(1, size)],
                      timeout, what, ranks[1:], ranks[0])
    else:
        verdict = np.zeros(1, dtype=np.int64)
        wait_requests([control.Isend(mine, dest=0, tag=CHECK_TAG)], timeout, what, [ranks[0]],
                      ranks[me])
        # Wait longer than the first member, which may have arrived up to ``timeout`` later and
        # is the one that knows who is missing: it must time out (and abort) first.
        wait_requests([control.Irecv(verdict, source=0, tag=VERDICT_TAG)], 2 * timeout + 1,
                      what + " (waiting for the argument check)", [ranks[0]], ranks[me])
    if not verdict[0]:
        raise_mismatch(control, ranks, signature, what, describe)


def raise_mismatch(control, ranks, signature, what, describe=None):
    """Raise the ValueError of a call whose members disagree, with each member's signature
    (collective: every member must have seen the mismatch)."""
    calls = control.allgather(signature)  # everyone is here: safe to block
    if describe is not None:
        raise ValueError(describe(calls))
    lines = "\n".join(f"  rank {ranks[i]}: {call}" for i, call in enumerate(calls))
    raise ValueError(f"{what}: ranks called it with different arguments "
                     f"(shapes, dtypes or flags must match on every rank):\n{lines}")


GROUP_TAG = 7304


def check_group_lists(comm, name, ranks, timeout, spin=SPIN_S, poll_sleep=POLL_SLEEP_S):
    """Raise ValueError unless every member of ``ranks`` creates group ``name`` with the same
    list, in the same order, as this rank (call it on the members only, before creating).

    ``comm`` is a world communicator used for nothing else. Each member sends its
    ``(name, ranks)`` to the others and waits for theirs (non-blocking, under ``timeout``).
    A member that sees another list forwards its own list to every rank named in any list it has seen, so that those ranks, which may wait
    for a member that will never send to them, see a mismatch too, and raises at once naming
    every list it saw. Creating a group with lists that differ would otherwise block in the
    library until the timeout and then blame the next collective.
    """
    me = comm.Get_rank()
    mine = (name, [int(r) for r in ranks])
    peers = [r for r in mine[1] if r != me]
    told = set(peers)
    sends = [comm.isend(mine, dest=r, tag=GROUP_TAG) for r in peers]
    seen, what = {me: mine}, f"new_group {name!r}"
    pacer = Pacer(me, spin, poll_sleep)
    while not all(r in seen for r in peers):
        # Only from members not heard yet: a member that finished this check may already have
        # sent its next group's list, and a rank outside the list its own group's.
        arrived = next((r for r in peers if r not in seen
                        and comm.Iprobe(source=r, tag=GROUP_TAG)), None)
        if arrived is not None:
            seen[arrived] = comm.recv(source=arrived, tag=GROUP_TAG)
            pacer.progressed()
            if seen[arrived] != mine:
                break
            continue
        if time.monotonic() - pacer.start > timeout:
            late = [r for r in peers if r not in seen]
            raise CollectiveTimeout(f"rank {me}: rank(s) {late} did not arrive at {what} within "
                                    f"{timeout:g} s; still waiting for rank(s) {late} "
                                    f"(NNABLA_TORUS_TIMEOUT sets the limit)")
        pacer.idle(what, [r for r in peers if r not in seen])
    if all(call == mine for call in seen.values()):
        wait_requests(sends, timeout, what, peers, me, spin, poll_sleep)
        return
    named = {r for _, listed in seen.values() for r in listed} - told - {me}
    sends += [comm.isend(mine, dest=r, tag=GROUP_TAG) for r in sorted(named)]
    wait_requests(sends, timeout, what, sorted(told | named), me, spin, poll_sleep)
    lines = "\n".join(f"  rank {r}: group {n!r} with ranks {listed}"
                      for r, (n, listed) in sorted(seen.items()))
    raise ValueError(f"{what}: members passed different groups (every member must create the "
                     f"same group with the same rank list, in the same order; a member's "
                     f"position in the list is its rank in the group):\n{lines}")
