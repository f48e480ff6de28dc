"""A dead rank is named (RankLost) on one process: the wait loop, and the communicator's report.

The real thing (a rank SIGKILLed under mpirun) is tests/mpi/test_communicator.py and
tests/mpi/test_emucluster.py; here ``lost_ranks`` is replaced to say rank 3 died.
"""
import numpy as np
import nnabla as nn
import pytest
from mpi4py import MPI

import nnabla_torus
from nnabla_torus.comm import guarded_calls, waits
from nnabla_torus.comm.errors import RankLost
from nnabla_torus.comm.waits import lost_ranks, rank_lost, wait_requests


def test_no_rank_is_lost_in_a_healthy_job():
    assert lost_ranks() == []
    assert rank_lost(MPI.Exception(MPI.ERR_OTHER), 0, "x") is None   # an error, but nobody died
    assert rank_lost(ValueError("x"), 0, "x") is None


def test_the_message_names_the_rank_the_lost_ranks_and_the_operation():
    error = RankLost(1, [3, 5], "all_reduce (ring, group 'world') step 2/3")
    assert str(error) == ("rank 1: lost rank(s) [3, 5] during all_reduce (ring, group 'world') "
                          "step 2/3")
    assert error.lost == [3, 5]


def test_a_wait_names_a_dead_rank_long_before_its_timeout(monkeypatch):
    monkeypatch.setattr(waits, "lost_ranks", lambda: [3])
    buf = np.zeros(1)
    request = MPI.COMM_SELF.Irecv(buf, source=0, tag=4242)   # never sent: waits forever
    try:
        with pytest.raises(RankLost, match=r"rank 0: lost rank\(s\) \[3\] during bcast step 1"):
            wait_requests([request], 30.0, "bcast step 1", [3], 0)
    finally:
        request.Cancel()
        request.Wait()


def test_the_communicator_reports_a_death_then_aborts(monkeypatch, capsys):
    """Even a collective that returned: Open MPI's hierarchical all-reduce may return a partial
    sum when a peer dies, so a known death after the call fails it too."""
    comm = nnabla_torus.MultiProcessDataParallelCommunicator(algorithm="torus2d", timeout=2)
    comm.init()
    waited, aborted = [], []

    class Aborted(Exception):
        pass

    def abort(code):
        aborted.append(code)
        raise Aborted(f"abort({code})")

    monkeypatch.setattr(guarded_calls, "lost_ranks", lambda: [3])
    monkeypatch.setattr(guarded_calls.time, "sleep", waited.append)
    monkeypatch.setattr(comm.backend, "abort", abort)
    with pytest.raises(Aborted, match=r"^abort\(70\)$"):
        comm.all_reduce(nn.NdArray.from_numpy_array(np.ones(4, np.float32)))
    err = capsys.readouterr().err
    assert err.startswith("nnabla_torus: rank 0: lost rank(s) [3] during all_reduce (torus2d, "
                          "group 'world'); aborting"), err
    assert waited == [2] and aborted == [70]   # waited min(LOST_GRACE_S, timeout) for mpirun
