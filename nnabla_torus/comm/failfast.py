"""Fail fast: an error on one rank ends the whole MPI job in seconds, named once.

Without this, a rank that raises (or calls ``sys.exit``) goes on to ``MPI_Finalize``, which
waits for every other rank, while the others wait for it in their next collective: the job
hangs until the collective's timeout. ``install()`` (called when
``nnabla_torus.comm.communicator`` is imported) handles the three ways a rank leaves early: an
unhandled exception in any thread (one line naming rank and host, then ``MPI_Abort``); a rank
that exits while others still wait for it (it tells them it has gone; a rank waiting for it
aborts the job after ``EXIT_GRACE_S``, naming it); and expected errors, ``abort_job(message)``
(the message once, no traceback). With one process nothing is aborted: the process exits
non-zero. The messages and timings: docs/communicator.md#errors-and-failures. Example::

    from nnabla_torus.comm import failfast
    failfast.install()                  # importing the communicator does this
    if not os.path.isdir(path):
        failfast.abort_job(f"train.py: error: {path} is not a folder", 2)
"""
import atexit
import socket
import sys
import threading
import time

from .launcher_env import launcher_rank   # Open MPI's, hydra's, Slurm's, PMIx's rank variable
from .mpi_tags import EXIT_TAG

EXIT_GRACE_S = 1.0   # seconds a wait goes on after its peer announced its exit
# Seconds an exiting rank waits for the other ranks' exit notices: at the end of a job they
# come at once; a rank that leaves early waits this long at most for the others to abort the
# job (longer would delay the end of a job whose other ranks block in their own MPI calls).
EXIT_WAIT_S = 10.0
ABORT_CODE = 1
# Seconds between two MPI_Testsome polls in gone(). One poll tests the p - 1 exit-notice
# receives: 41-434 us at p = 2,176 here (quiet to loaded), 0.4-4 % of the waits' 10 ms poll
# interval, growing with p (docs/measurements/fail-fast.md, tools/research/failfast_bench.py).
# A notice counts only EXIT_GRACE_S after it was seen, so this delays a verdict by at most
# GONE_POLL_S.
GONE_POLL_S = 0.1
# Seconds between the last words of an aborting rank and MPI_Abort: hydra (MPICH, Intel MPI)
# drops what the rank wrote that its proxy had not yet read when the job is torn down (seen:
# a traceback cut after its first line, the "aborting the job" line lost).
ABORT_DRAIN_S = 0.2
# Seconds a rank other than 0 waits before printing an expected error (abort_job): the ranks
# of a job parse the same arguments, environment and files, so rank 0 usually meets the same
# error, and its exit (before MPI starts) or MPI_Abort ends the job first: the message is
# printed once. An error on that rank only is printed after the wait.
SAME_ERROR_WAIT_S = 2.0

_previous = {}       # the hooks install() replaced: "sys", "threading"
_watch = {}          # once watching: "peers", "requests" (a receive per peer), "seen", ...


def _mpi():
    """``mpi4py.MPI`` when this process has initialised MPI and not finalised it, else None.

    Never imports it: importing ``mpi4py.MPI`` starts MPI.
    """
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI


def _world_size():
    MPI = _mpi()
    return MPI.COMM_WORLD.Get_size() if MPI is not None else 1


def wait_for_rank_zero():
    """On a rank other than 0 (MPI's rank, before MPI starts the launcher's): wait
    ``SAME_ERROR_WAIT_S`` (see there), so that an error every rank meets is printed once per
    job. Call it just before printing."""
    MPI = _mpi()
    rank = MPI.COMM_WORLD.Get_rank() if MPI is not None else launcher_rank()
    if rank != 0:
        sys.stderr.flush()
        time.sleep(SAME_ERROR_WAIT_S)


def where():
    """``"rank R on host H"`` (MPI's rank and processor name; before MPI starts, the launcher's
    rank variable and the socket host name)."""
    MPI = _mpi()
    if MPI is not None:
        return f"rank {MPI.COMM_WORLD.Get_rank()} on host {MPI.Get_processor_name()}"
    return f"rank {launcher_rank()} on host {socket.gethostname()}"


def abort_job(message, code=ABORT_CODE, place=None):
    """Print ``message`` once, prefixed with ``place`` (default: :func:`where`), and end the
    whole job (once per job when every rank meets it: ``wait_for_rank_zero``).

    ``MPI_Abort(code)`` when MPI is initialised and the job has more than one rank (the other
    ranks may be waiting for this one); else ``sys.exit(code)``.
    """
    wait_for_rank_zero()
    print(f"{place or where()}: {message}", file=sys.stderr, flush=True)
    _end(code)


def _end(code):
    MPI = _mpi()
    if MPI is not None and MPI.COMM_WORLD.Get_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_DRAIN_S)
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


def _excepthook(kind, value, tb):
    _previous["sys"](kind, value, tb)   # the traceback, as Python prints it
    if _world_size() > 1:
        print(f"nnabla_torus: {where()}: unhandled {kind.__name__}: {value}; aborting the job",
              file=sys.stderr, flush=True)
        _end(ABORT_CODE)


def _thread_excepthook(args):
    _previous["threading"](args)         # "Exception in thread ..." and the traceback
    if args.exc_type is not SystemExit and _world_size() > 1:
        name = args.thread.name if args.thread is not None else "?"
        print(f"nnabla_torus: {where()}: unhandled {args.exc_type.__name__} in thread {name}: "
              f"{args.exc_value}; aborting the job", file=sys.stderr, flush=True)
        _end(ABORT_CODE)


def install():
    """Set the exception hooks and, once MPI runs on more than one rank, the exit notices.

    Idempotent and local (no collective); call it again after MPI starts to add the notices.
    """
    if "sys" not in _previous:
        _previous["sys"], sys.excepthook = sys.excepthook, _excepthook
        _previous["threading"], threading.excepthook = threading.excepthook, _thread_excepthook
    MPI = _mpi()
    if not _watch and MPI is not None and MPI.COMM_WORLD.Get_size() > 1:
        _watch.update(_post_receives(MPI.COMM_WORLD))
        atexit.register(_announce_exit)  # runs before mpi4py's MPI_Finalize


def _post_receives(world):
    """One posted receive per peer for its exit notice (``_announce_exit`` completes them).

    Per peer, not one ``MPI_ANY_SOURCE`` receive that is cancelled at exit: a notice that
    finds no posted receive stays unexpected, and MPICH 5 ended about 1 job in 3 with an
    unexpected message at ``MPI_Finalize`` killed after a clean run (hydra: "EXIT CODE: 9";
    plain mpi4py does the same), while a receive still pending there makes MPICH warn
    ("Builtin communicator ... has pending references") and wait for it.
    """
    import numpy as np
    me = world.Get_rank()
    peers = [r for r in range(world.Get_size()) if r != me]
    buffer = np.zeros(world.Get_size(), np.int64)
    requests = [world.Irecv(buffer[r:r + 1], source=r, tag=EXIT_TAG) for r in peers]
    return {"peers": peers, "requests": requests, "buffer": buffer, "seen": {}}


def gone(peers, grace=EXIT_GRACE_S):
    """The ranks among ``peers`` that announced their exit at least ``grace`` seconds ago.

    Polled by the communicator's waits (waits.Pacer, every 10 ms) and the watchdog; it
    tests the receives (one ``MPI_Testsome`` over p - 1, O(p)) at most every ``GONE_POLL_S``.
    """
    MPI = _mpi()
    if not _watch or MPI is None or _watch.get("announced"):
        return []
    now = time.monotonic()
    if now >= _watch.get("poll_at", 0.0):
        _watch["poll_at"] = now + GONE_POLL_S
        arrived = MPI.Request.Testsome(_watch["requests"])   # completed ones become null
        for i in arrived or ():
            _watch["seen"].setdefault(_watch["peers"][i], now)
    if not _watch["seen"]:
        return []
    return sorted(r for r in set(peers) if now - _watch["seen"].get(r, now) >= grace)


def _announce_exit():
    """At exit: tell every other rank this one has gone (one small message each), then wait
    for theirs, so that ``MPI_Finalize`` finds no message and no receive pending.

    At the end of a job every rank exits, so the notices meet at once (``MPI_Finalize`` would
    wait for the last rank anyway). A rank whose peers go on without it (an early exit) waits
    until they notice and abort the job, or at most ``EXIT_WAIT_S``; then it cancels the
    receives still pending (under MPICH a notice that comes later may still end the job
    killed, as before).
    """
    MPI = _mpi()
    if MPI is None or not _watch or _watch.get("announced"):
        return
    import numpy as np
    world = MPI.COMM_WORLD
    me = np.array([world.Get_rank()], np.int64)
    sends = [world.Isend(me, dest=r, tag=EXIT_TAG) for r in _watch["peers"]]
    _watch["announced"] = True
    receives = _watch["requests"]
    deadline = time.monotonic() + EXIT_WAIT_S
    while not MPI.Request.Testall(sends + receives) and time.monotonic() < deadline:
        time.sleep(1e-3)
    for request in receives:
        if request != MPI.REQUEST_NULL:
            request.Cancel()
            request.Wait()
