"""Rendezvous: every rank of a group arrives at the same collective with matching arguments.

Members compare a 64-bit hash of each call (two small messages, or one arrival in a shared
window, :class:`.host_sync.HostSync`); differing arguments raise ``ValueError`` on every member,
a rank that never arrives ``CollectiveTimeout``, a dead rank ``RankLost``, one that left its
script ``RankGone`` (:mod:`.errors`; the waits that raise them: :mod:`.waits`, the blocking
calls' :mod:`.watchdog`; the tags: :mod:`.mpi_tags`). Why: docs/communicator.md#errors-and-failures.
"""
import hashlib
import time
from collections import namedtuple

import numpy as np
from mpi4py import MPI

from .errors import CollectiveTimeout
from .settings import differences
from .mpi_tags import CHECK_TAG, GROUP_TAG, VERDICT_TAG
from .waits import POLL_SLEEP_S, SPIN_S, Pacer, wait_requests

# Groups larger than this check calls with one non-blocking all-reduce of (hash, -hash) under
# MPI_MAX: O(log p) messages at every rank instead of p - 1 receives and p - 1 sends at the
# first member (at 2,176 ranks and ~10 calls per step, milliseconds per step in Python). A
# rank that never arrives is then not named (the timeout names the group).
GATHER_MAX = 64


# What a collective call must agree on across ranks, field by field: a mismatch names the
# fields that differ (arrays: (dtype, shape) of each array in the list).
AllReduceCall = namedtuple("AllReduceCall", "op arrays division inplace sqnorms algorithm grid "
                                            "wire_fp16 pieces")
BcastCall = namedtuple("BcastCall", "op arrays root inplace")
ReduceCall = namedtuple("ReduceCall", "op arrays destination division inplace algorithm grid")
AllGatherCall = namedtuple("AllGatherCall", "op arrays output_shapes")
ReduceScatterCall = namedtuple("ReduceScatterCall", "op arrays output_shape division")


def call_hash(signature):
    """A 63-bit hash of a call signature (any repr-able value)."""
    digest = hashlib.blake2b(repr(signature).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


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
    if all(hasattr(call, "_fields") for call in calls):   # a named tuple: its fields, labelled
        lines = "\n".join(differences([call._asdict().items() for call in calls], ranks))
    else:
        lines = "\n".join(f"  rank {ranks[i]}: {call}" for i, call in enumerate(calls))
    raise ValueError(f"{what}: ranks called it with different arguments "
                     f"(shapes, dtypes or flags must match on every rank):\n{lines}")


def check_group_lists(comm, name, ranks, timeout, spin=SPIN_S, poll_sleep=POLL_SLEEP_S):
    """Raise ValueError unless every member of ``ranks`` creates group ``name`` with the same
    list, in the same order, as this rank (call it on the members only, before creating).

    ``comm`` is a world communicator used for nothing else. Each member sends its
    ``(name, ranks)`` to the others and waits for theirs (non-blocking, under ``timeout``).
    A member that sees another list forwards its own list to every rank named in any list it
    has seen, so that those ranks, which may wait
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
