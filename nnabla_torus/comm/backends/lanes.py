"""The lane scheduler: generators of waits advanced together, the one loop of the MPI backend
and of the simulator's virtual ranks (``nnabla_torus.sim.virtual``), which differ only in how
they test a wait and what they do between rounds (their ``transport``).

A lane yields ``(ready, what, peers)``: ``ready`` is a list of requests, or a callable that
returns True once another lane has got far enough; ``what`` names the wait ('' for a wait on
another lane) and ``peers`` the world ranks it waits for. ``collectives.torus2d_lanes`` is
the lanes of the pipelined torus.
"""
import time

from mpi4py import MPI

from ..waits import Pacer, overdue


def run_lanes(lanes, transport, rank, timeout):
    """Advance ``lanes`` together until all have finished.

    A lane goes on as soon as its requests complete (``transport.done``) or its callable
    returns True; a wait on requests that lasts ``timeout`` seconds raises CollectiveTimeout
    naming its peers. After a round that moved no lane, ``transport.idle(items)`` waits (or
    raises), given each waiting lane's ``(ready, what, peers)``; after one that moved,
    ``transport.progressed()``.
    """
    start = time.monotonic()
    waiting = []  # [lane, (ready, what, peers), since]
    for lane in lanes:
        item = next(lane, None)
        if item is not None:
            waiting.append([lane, item, start])
    while waiting:
        moved = False
        for entry in list(waiting):
            lane, item, since = entry
            while item is not None and (item[0]() if callable(item[0])
                                        else transport.done(item[0])):
                item, since, moved = next(lane, None), time.monotonic(), True
            if item is None:
                waiting.remove(entry)
                continue
            entry[1], entry[2] = item, since
            if not callable(item[0]) and time.monotonic() - since > timeout:
                raise overdue(rank, item[1], timeout, item[2])
        if moved:
            transport.progressed()
        elif waiting:
            transport.idle([entry[1] for entry in waiting])


def waiting_in(items):
    """(what, peers) of the waiting lanes ``items``: the first named wait (a wait on another
    lane names none) and every peer."""
    what = next((item[1] for item in items if item[1]), "pipelined all-reduce")
    return what, [peer for item in items for peer in item[2]]


class PolledLanes:
    """The MPI backend's transport: ``MPI.Request.Testall``, and between rounds the Pacer's
    spin, sleep and checks for lost and departed ranks (:class:`..waits.Pacer`)."""

    def __init__(self, rank, spin, poll_sleep):
        self.pacer = Pacer(rank, spin, poll_sleep)

    def done(self, requests):
        return MPI.Request.Testall(requests)

    def progressed(self):
        self.pacer.progressed()

    def idle(self, items):
        self.pacer.idle(*waiting_in(items))
