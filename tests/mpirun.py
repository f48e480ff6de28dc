"""Run a Python program under mpirun from pytest with a hard timeout.

A deadlock fails the test (the whole process group is killed) instead of hanging CI. Example::

    from tests.mpirun import expect_passed, run_mpi
    out = run_mpi(4, ["tests/mpi/progs/check_overlap.py"])
    expect_passed(out, "check_overlap")

A test program ends, on success, with one line ``passed_line(name)`` ("PASSED check_overlap"),
which the test matches whole (not a substring of some other line) and counts.
"""
import os
import re
import signal
import subprocess
import tempfile

from nnabla_torus.launching.mpirun_cmd import mpi_library, mpirun_command, mpirun_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A rank's death as mpirun reports it ("process rank 3 with PID 812 on node vm exited on
# signal 9"), group 1 the rank; and as nnabla_torus reports it ("nnabla_torus: rank 0: lost
# rank(s) [3] during all_reduce ..."), groups the reporting rank and the list of lost ones.
DIED = re.compile(r"process\s+rank\s+(\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+\S+\s+exited\s+on"
                  r"\s+signal\s+9")
LOST = re.compile(r"nnabla_torus: rank (\d+): lost rank\(s\) \[([\d, ]*)\] during ")


def passed_line(name):
    """The line an MPI test program prints last when every check passed."""
    return f"PASSED {name}"


def expect_passed(out, name):
    """AssertionError with the output unless ``passed_line(name)`` is a whole line of ``out``,
    exactly once."""
    found = out.splitlines().count(passed_line(name))
    if found != 1:
        raise AssertionError(f"expected the line {passed_line(name)!r} once, found it {found} "
                             f"time(s):\n{out}")


def expect_passed_on_every_rank(out, label, ranks):
    """``expect_passed`` for the line "<label> rank r" of every rank r < ``ranks``."""
    for rank in range(ranks):
        expect_passed(out, f"{label} rank {rank}")


def run_mpi(np_, argv, timeout=120, env=None, check=True, mpirun_args=(), python=None):
    """Run ``python argv...`` on ``np_`` ranks; return combined stdout+stderr as text.

    ``python``: the ranks' interpreter (default: this one); another venv's runs under that
    venv's MPI library (tests/mpi/test_mpi_libraries.py).

    Raises AssertionError with the output when the job exits non-zero (``check``) or runs
    longer than ``timeout`` seconds (then every process of the job is killed first).
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    full_env.setdefault("OMPI_MCA_osc", "^ucx")   # quiet shared windows (communicator.py)
    if mpi_library(mpirun_path(python)) != "openmpi":
        # hydra (MPICH, Intel MPI) forwards each write as it comes: an unbuffered print's text
        # and its newline are two writes, and another rank's line can land between them.
        full_env.pop("PYTHONUNBUFFERED", None)
    # auto's table cache (comm/auto_cache.py): a fresh folder per job, so a job measures as
    # before (tests skew auto's clock) and never reads or writes the user's ~/.cache
    cache = tempfile.TemporaryDirectory(prefix="nnabla_torus_cache_")
    full_env["NNABLA_TORUS_CACHE_DIR"] = cache.name
    full_env.update(env or {})
    cmd = mpirun_command(np_, argv, mpirun_args, python=python)
    proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timeout after {timeout}s (deadlock?): {' '.join(cmd)}\n{out}")
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {' '.join(cmd)}\n{out}")
    cache.cleanup()
    return out
