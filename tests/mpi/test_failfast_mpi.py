"""One rank leaving early ends the whole job within seconds, named once; integer averages are
exact by their rule; ranks configured differently get a ValueError on every rank at init.

The leaving rank runs ``tests/mpi/progs/failfast_loop.py``, a plain script that only imports
nnabla_torus, inits the communicator and all-reduces in a loop, at the default
NNABLA_TORUS_TIMEOUT (300 s: before nnabla_torus.comm.failfast, the job ended after T + 1 s, or
2T + 1 s when rank 0 left).
"""
import re
import time

import pytest

from nnabla_torus.comm.watchdog import BLOCKING_EXIT_GRACE_S
from tests.mpirun import expect_passed, run_mpi
from tests.slowdown import scaled

PROG = "tests/mpi/progs/failfast_loop.py"
LIMIT_S = 5.0    # from the victim leaving to mpirun's exit (the target)


def leave(ranks, victim, how, at=3, env=None):
    """Run the loop with ``victim`` leaving ``how`` at iteration ``at`` (-1: before init);
    return (output, seconds from its leaving to mpirun's exit)."""
    with pytest.raises(AssertionError) as failed:       # run_mpi raises on a non-zero exit
        run_mpi(ranks, [PROG, "--victim", str(victim), "--how", how, "--at", str(at)],
                timeout=120, env={"NNABLA_TORUS_TIMEOUT": "", **(env or {})})
    ended = time.time()
    out = str(failed.value).replace("\0", "")   # mpirun's output may hold NUL bytes
    assert re.match(r"exit [1-9]\d*: ", out), out[:3000]   # non-zero, and not "timeout after"
    assert "DONE" not in out, out
    left = re.search(rf"^LEAVE {victim} ([\d.]+)$", out, re.M)
    assert left, out
    return out, ended - float(left.group(1))


@pytest.mark.parametrize("ranks, victim", [(2, 0), (2, 1), (4, 0), (4, 3), (8, 0), (8, 5)])
def test_an_unhandled_exception_on_one_rank_aborts_the_job_at_once(ranks, victim):
    out, seconds = leave(ranks, victim, "raise")
    assert f"RuntimeError: boom on rank {victim}" in out and "Traceback" in out, out
    named = re.findall(r"^nnabla_torus: rank (\d+) on host \S+: unhandled RuntimeError: boom on "
                       r"rank \d+; aborting the job", out, re.M)
    assert named == [str(victim)], out        # once, by the rank that raised
    assert "did not arrive" not in out and "left the script" not in out, out
    assert seconds < scaled(LIMIT_S), f"{seconds:.1f} s from the exception to the end of the job"


BLOCKING = {"NNABLA_TORUS_ALGORITHM": "native", "NNABLA_TORUS_CHECK": "0"}  # MPI_Allreduce


@pytest.mark.parametrize("ranks, victim, how, at, env", [
    (4, 0, "exit-message", 3, {}), (4, 3, "exit-message", 3, {}), (2, 1, "exit-code", 3, {}),
    (2, 0, "return", 3, {}), (4, 2, "exit-message", -1, {}),
    pytest.param(4, 3, "exit-message", 3, BLOCKING, marks=pytest.mark.slow)],
    ids=["exit-0", "exit-3", "exit-code", "return", "exit-before-init", "exit-blocking-call"])
def test_a_rank_that_leaves_early_is_named_by_the_ranks_waiting_for_it(ranks, victim, how, at, env):
    out, seconds = leave(ranks, victim, how, at, env)
    if how == "exit-message":
        assert f"failfast_loop.py: error: bad input on rank {victim}" in out, out
    # Host names are known once init() ran, and to the communicator, not to the watchdog.
    # No end-of-line anchor: mpirun's abort banner can land on the same line of the capture.
    host = r" \(rank \d+ ran on \S+\)" if at >= 0 and not env else ""
    named = re.findall(rf"^nnabla_torus: rank \d+: rank\(s\) \[(\d+)\] left the script .*"
                       rf"they will not arrive{host}; aborting the job", out, re.M)
    assert named and set(named) == {str(victim)}, out
    # In a blocking library call the peers trust an exit notice only after a longer grace.
    limit = scaled(LIMIT_S) + (BLOCKING_EXIT_GRACE_S if env else 0)
    assert seconds < limit, f"{seconds:.1f} s from the exit to the end of the job"


def test_an_exception_before_init_aborts_the_job_too():
    out, seconds = leave(4, 1, "raise", at=-1)
    assert re.findall(r"^nnabla_torus: rank (\d+) on host \S+: unhandled RuntimeError", out,
                      re.M) == ["1"], out
    assert seconds < scaled(LIMIT_S), seconds


def test_an_exception_in_another_thread_aborts_the_job():
    out, seconds = leave(2, 1, "thread")
    assert re.search(r"^nnabla_torus: rank 1 on host \S+: unhandled ZeroDivisionError in thread "
                     r"loader: division by zero; aborting the job", out, re.M), out
    assert seconds < scaled(LIMIT_S), seconds


def test_abort_job_prints_the_message_once_without_a_traceback():
    out, seconds = leave(4, 2, "abort-job")
    assert re.findall(r"^rank 2 on host \S+: failfast_loop.py: error: bad input on rank 2$", out,
                      re.M), out
    assert "Traceback" not in out and re.match(r"exit 2: ", out), out
    assert seconds < scaled(LIMIT_S), seconds


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_integer_averages_are_the_floor_of_the_sum_over_p(ranks):
    out = run_mpi(ranks, ["tests/mpi/progs/init_cases.py", "ints"], timeout=120)
    expect_passed(out, f"init_cases ints on {ranks} ranks")


def test_ranks_with_different_settings_get_a_value_error_on_every_rank_at_init():
    ranks = 4
    out = run_mpi(ranks, ["tests/mpi/progs/init_cases.py", "settings"], timeout=120)
    differ = {"algorithm": "'torus2d' on rank(s) [0, 1, 2]; 'ring' on rank(s) [3]",
              "grid": "'4x1' on rank(s) [0, 1, 2]; '1x4' on rank(s) [3]",
              "wire_fp16": "False on rank(s) [0, 1, 2]; True on rank(s) [3]",
              "timeout": "60.0 on rank(s) [0, 1, 2]; 30.0 on rank(s) [3]",
              "check": "True on rank(s) [0, 1, 2]; False on rank(s) [3]",
              "segment_bytes": "4194304 on rank(s) [0, 1, 2]; 4096 on rank(s) [3]",
              "pipeline_bytes": "8388608 on rank(s) [0, 1, 2]; 0 on rank(s) [3]"}
    for name, text in differ.items():
        lines = re.findall(rf"^rank (\d+): {name}: (.*)$", out, re.M)
        assert sorted(int(r) for r, _ in lines) == list(range(ranks)), out
        for _, line in lines:
            assert line.startswith("init: ranks were given different settings") and \
                f"{name}: {text}" in line, line
    assert out.count(": same: NO ERROR") == ranks, out


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_poll_benchmark_prints_a_row_per_measurement(ranks):
    """tools/research/failfast_bench.py: gone() on every rank, Testsome over odd request counts."""
    out = run_mpi(ranks, ["tools/research/failfast_bench.py", "--calls", "50", "--repeat", "1",
                          "--requests", "1,5", "--gone-poll-s", "0"], timeout=120)
    rows = re.findall(r"^\s+(gone p=\d+|testsome K=\d+)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+%$",
                      out, re.M)
    assert [r[0] for r in rows] == [f"gone p={ranks}", "testsome K=1", "testsome K=5"], out
    assert all(float(worst) >= float(rank0) > 0 for _, rank0, worst in rows), out
    assert "gone() polls every 0 s" in out, out
