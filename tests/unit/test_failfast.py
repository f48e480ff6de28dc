"""failfast on one process (the multi-rank behaviour: tests/mpi/test_failfast_mpi.py), the
once-per-job log filter, and integer averaging by the rule floor(sum / p)."""
import logging
import sys
import threading

import numpy as np
import pytest

from nnabla_torus.comm import failfast
from nnabla_torus.comm.collectives import scale_numpy
from nnabla_torus.comm.communicator import log_once_per_job


def test_abort_job_on_one_process_prints_rank_and_host_once_and_exits(capsys):
    with pytest.raises(SystemExit) as ended:
        failfast.abort_job("train.py: error: --batch must be >= 1", 2)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("train.py: error") == 1
    assert err.startswith("rank 0 on host ") and err.endswith(": train.py: error: --batch must "
                                                              "be >= 1\n"), err


def test_install_is_idempotent_and_chains_to_the_previous_hooks(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a[0]))
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    monkeypatch.setattr(failfast, "_previous", {})
    failfast.install()
    failfast.install()
    assert sys.excepthook is failfast._excepthook
    assert threading.excepthook is failfast._thread_excepthook
    try:
        raise KeyError("x")
    except KeyError:
        sys.excepthook(*sys.exc_info())     # one process: printed, nothing aborted
    worker = threading.Thread(target=lambda: 1 / 0)
    worker.start()
    worker.join()
    assert seen == [KeyError, ZeroDivisionError]


def test_without_exit_notices_no_rank_has_gone():
    assert failfast.gone([0, 1, 2]) == []


def test_gone_tests_the_receives_at_most_every_poll_interval(monkeypatch):
    """One MPI_Testsome costs O(p) (41-434 us at 2,176 ranks): the 10 ms polls of a wait may
    not all pay it. A notice seen at a poll counts EXIT_GRACE_S later."""
    clock, polls = [100.0], []

    class Request:
        @staticmethod
        def Testsome(requests):
            polls.append(clock[0])
            return [1] if clock[0] >= 100.25 else []       # rank 2's notice arrives

    monkeypatch.setattr(failfast, "_mpi", lambda: type("MPI", (), {"Request": Request}))
    monkeypatch.setattr(failfast.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(failfast, "_watch", {"peers": [1, 2, 3], "requests": [None] * 3,
                                             "seen": {}})
    gone = []
    while clock[0] < 102.0:
        gone.append(failfast.gone([1, 2, 3], grace=1.0))
        clock[0] = round(clock[0] + 0.01, 2)                 # the waits' LOST_CHECK_S
    step = round(failfast.GONE_POLL_S / 0.01)
    assert len(polls) == len(gone) // step                   # 1 call in 10 tests
    first = next(i for i, g in enumerate(gone) if g)
    named_at = 100.0 + first * 0.01
    assert gone[first] == [2]
    assert 100.25 + 1.0 <= named_at < 100.25 + 1.0 + failfast.GONE_POLL_S, named_at


def test_library_log_lines_pass_on_rank_zero_only_unless_marked_per_rank(caplog):
    name = "nnabla_torus.test_once"
    for rank, expected in ((0, ["same", "mine"]), (3, ["mine"])):
        logger = logging.getLogger(f"{name}{rank}")
        log_once_per_job(rank, names=(logger.name,))
        log_once_per_job(rank, names=(logger.name,))      # once
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=logger.name):
            logger.info("same")
            logger.info("mine", extra={"every_rank": True})
        assert [r.getMessage() for r in caplog.records] == expected
        assert len(logger.filters) == 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("p", [2, 3, 7])
def test_integer_averages_are_the_floor_of_the_sum(dtype, p):
    total = np.arange(-20, 21, dtype=np.int64)
    if np.dtype(dtype).kind == "u":
        total = total + 20
    data = total.astype(dtype)
    scale_numpy(data, 1.0 / p)
    assert np.array_equal(data, (total // p).astype(dtype))


def test_integers_refuse_a_factor_that_is_not_one_over_p():
    with pytest.raises(ValueError, match=r"cannot scale int32 data by 3.0: integer arrays are "
                                         r"only averaged"):
        scale_numpy(np.ones(3, np.int32), 3.0)
    floats = np.full(3, 3.0, np.float32)
    scale_numpy(floats, 1 / 3)
    assert np.allclose(floats, 1.0)


def test_an_error_before_mpi_starts_waits_on_ranks_other_than_zero(monkeypatch, capsys):
    """Every rank parses the same flags: rank 0 prints, the launcher ends the others during
    their wait (before: the same config error once per rank)."""
    waits = []
    monkeypatch.setattr(failfast.time, "sleep", waits.append)
    monkeypatch.setattr(failfast, "_mpi", lambda: None)              # before MPI starts
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    failfast.wait_for_rank_zero()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    failfast.wait_for_rank_zero()
    assert waits == [failfast.SAME_ERROR_WAIT_S]
