"""Polling waits that turn a hang into an error naming the peers.

A wait polls its MPI requests instead of blocking: after ``NNABLA_TORUS_SPIN_S`` it sleeps
between polls (leaving the CPU to ranks that still compute), every ``LOST_CHECK_S`` it asks the
library for dead ranks (``RankLost``) and :mod:`.failfast` for ranks that left their script
(``RankGone``), and after the timeout it raises ``CollectiveTimeout`` naming the peers.
"""
import time

from mpi4py import MPI

from . import failfast
from .errors import CollectiveTimeout, RankGone, RankLost
from .settings import DEFAULTS

SPIN_S, POLL_SLEEP_S = DEFAULTS["spin"], DEFAULTS["poll_sleep"]  # the knobs' defaults, seconds
LOST_CHECK_S = 0.01  # seconds between checks for dead ranks while a wait polls (< 1 us each)


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
