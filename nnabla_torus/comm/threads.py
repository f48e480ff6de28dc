"""One thread at a time in a communicator's collectives: overlapping calls are refused.

Ranks match collectives by order: the k-th call on one rank exchanges data with the k-th call
on every other rank. Two threads of one rank that call collectives at the same time make that
order depend on the thread scheduler, which differs per rank, so no rank can know which
thread's call pairs with which call elsewhere (the reports: sums of two different threads'
arrays, then a hang). A lock that serialised the calls would not help: it fixes the order on
each rank, not the same order on every rank. So a call made while another thread of the same
rank is inside a collective of the same communicator is refused at once (ConcurrentCall,
naming both threads and both calls), the call already running raises the same error when
it ends (its peers may have paired it with another thread's call, so its result is not
returned) and so does every later call (the ranks' call counts no longer agree). An unhandled
error in any thread ends the job (:mod:`nnabla_torus.comm.failfast`).

Calls from several threads one after another are allowed (e.g. evaluation in a worker thread
after the training thread has joined); their order must then be the same on every rank, which
the script guarantees, not the communicator. Example::

    guard = OneCaller()
    with guard.enter("all_reduce", rank=0):
        ...                       # a second thread entering now raises ConcurrentCall
"""
import contextlib
import threading


class ConcurrentCall(RuntimeError):
    """Two threads of one rank were inside collectives of one communicator at the same time."""


class OneCaller:
    """Admit one thread at a time into a communicator's collectives (re-entrant per thread)."""

    def __init__(self):
        self._state = threading.Lock()      # guards the fields below; held for microseconds
        self._owner, self._what, self._depth = None, "", 0
        self.error = None                   # the ConcurrentCall, once one happened

    @contextlib.contextmanager
    def enter(self, what, rank):
        """Run the body as collective ``what`` of this thread (on ``rank``); ConcurrentCall if
        another thread is inside one, and in that thread too when its call ends."""
        me = threading.current_thread()
        with self._state:
            if self._owner is me:
                self._depth += 1
            elif self._owner is None:
                if self.error is not None:      # the communicator's call order is lost
                    raise self.error
                self._owner, self._what, self._depth = me, what, 1
            else:
                self.error = ConcurrentCall(
                    f"rank {rank}: {what} called from thread {me.name!r} while thread "
                    f"{self._owner.name!r} is inside {self._what} on the same communicator; "
                    f"ranks pair collectives by call order, which concurrent threads make "
                    f"differ per rank. Call the collectives of one communicator from one "
                    f"thread at a time, in the same order on every rank")
                raise self.error
        try:
            yield
            if self.error is not None:      # another thread overlapped this call
                raise self.error
        finally:
            with self._state:
                self._depth -= 1
                if self._depth == 0:
                    self._owner, self._what = None, ""
