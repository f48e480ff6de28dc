"""A watchdog thread for blocking library calls, which cannot be polled."""
import contextlib
import faulthandler
import sys
import threading
import time

from . import failfast
from .errors import RankGone

GONE_CHECK_S = 0.1   # seconds between the watchdog's checks for ranks that left their script
# A blocking library all-reduce can return on one rank (which may then exit normally) while
# another still waits for a third: the watchdog trusts an exit notice only after this long.
BLOCKING_EXIT_GRACE_S = 10.0


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

    @property
    def watching(self):
        """What the guarded call is (its ``what``), None between guards."""
        return self._what

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


GIL_HELD_GRACE_S = 5.0   # gil_held_deadline fires this long after the call's own timeout


@contextlib.contextmanager
def gil_held_deadline(timeout):
    """End this process (exit 1, Python's traceback of every thread on stderr) if the block
    outlives ``timeout`` + GIL_HELD_GRACE_S seconds (a ``Watchdog`` guarding the same call
    fires first and names it, whenever the GIL lets it run). For library calls that hold the GIL
    while they wait (nnabla's
    ``init()`` and ``new_group``: nnabla ``python/src/nnabla/communicator.pyx`` ~113-140 call
    C++ without ``nogil``), where no Python thread, ``Watchdog``'s included, can run:
    faulthandler's timer is a C thread that needs no GIL. mpirun then ends the job and names
    the rank that exited. Callers first check that every peer has arrived (that failure names
    the missing rank), so what is left to catch is a hang inside the library itself."""
    faulthandler.dump_traceback_later(timeout + GIL_HELD_GRACE_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
