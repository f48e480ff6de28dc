"""Every collective call of the communicator runs through here: the cross-rank check of its
arguments, one calling thread at a time, and the end of the job when a peer is missing, has
left its script or died (named with its host), so that no rank hangs or sums a partial result.
How the check rides on shared memory and what each failure prints: docs/communicator.md.
"""
import sys
import time

from mpi4py import MPI

from .errors import CollectiveTimeout, RankGone, RankLost
from .rendezvous import CallMismatch, call_hash, check_same_call, raise_mismatch
from .waits import lost_ranks, rank_lost

LOST_GRACE_S = 5.0  # seconds a rank that saw a peer die waits for mpirun to end the job


def collective(comm, group, signature, what, body, fold=False):
    """Check the call across ``group``, then run ``body`` (see ``guarded``).

    ``fold``: when the group shares one host's memory (``group.sync``), the check is not a
    synchronisation of its own but rides on the call's first shared arrival
    (``Group.check_value``): ``body`` must start every exchange with
    ``collectives.run_algorithm``.
    """
    def checked():
        sync = getattr(group, "sync", None)
        if not comm.check or not (fold and sync is not None):
            if comm.check:
                check_same_call(group.control, group.ranks, signature, comm.timeout, what,
                                sync=sync)
            return body()
        group.check_value = call_hash(signature) or 1
        comm._checking = what   # names the call if run_algorithm's check arrival waits
        try:
            result = body()
            comm.backend.check_arrival(group, what)   # a call with nothing to exchange
        except CallMismatch:
            raise_mismatch(group.control, group.ranks, signature, what)
        finally:
            group.check_value = 0   # never carried into a later call
        return result
    return guarded(comm, what, checked)


def guarded(comm, what, body):
    """Run ``body``; abort the job if a peer is missing (CollectiveTimeout), has left its
    script (RankGone) or is dead (RankLost, also from an MPI error the death caused).
    ConcurrentCall when another thread is inside a collective (:mod:`.threads`)."""
    try:
        with comm._one_caller.enter(what, comm.rank):
            result = body()
    except (CollectiveTimeout, RankGone) as e:
        gone = getattr(e, "gone", [])
        names = comm._host_names
        where = "".join(f" (rank {r} ran on {names[r]})" for r in gone if r < len(names))
        print(f"nnabla_torus: {e}{where}; aborting the job", file=sys.stderr, flush=True)
        abort(comm, 70)
        raise
    except RankLost as e:
        end_for_lost(comm, e)
        raise
    except MPI.Exception as e:  # a blocking library call failed: was it a dead peer?
        lost = rank_lost(e, comm.rank, what)
        if lost is None:
            raise
        end_for_lost(comm, lost)
        raise lost from e
    # Open MPI's hierarchical all-reduce can return normally with a partial sum when a
    # peer died; a dead rank known now means the result cannot be trusted.
    lost = lost_ranks()
    if lost:
        end_for_lost(comm, RankLost(comm.rank, lost, what))
    return result


def end_for_lost(comm, error):
    """Say which rank(s) died and where, let mpirun end the job, abort it if it does not.

    mpirun ends every process once it hears of the death (about 1 s) and names the dead
    rank; aborting at once would make mpirun name this survivor instead, and the peers of
    this survivor name it as lost. After LOST_GRACE_S (at most the timeout) abort anyway.
    """
    names = comm._host_names
    where = ", ".join(f"rank {r} ran on {names[r]}" for r in error.lost if r < len(names))
    print(f"nnabla_torus: {error}; aborting"
          + (f" ({where}; mpirun reports how it ended)" if where else ""),
          file=sys.stderr, flush=True)
    time.sleep(min(LOST_GRACE_S, comm.timeout))
    abort(comm, 70)


def abort(comm, code):
    """End the whole job with exit ``code`` (the backend's resources first)."""
    if comm.backend is not None:
        comm.backend.abort(code)
    MPI.COMM_WORLD.Abort(code)
