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

from nnabla_torus.launching.mpirun_cmd import (mpirun_command, mpirun_path, open_mpi_version,
                                               private_session_base, version_text)
from tests.slowdown import scaled

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_TIMEOUT_S = 1200   # seconds tools/setup_venv.sh may take (MPI=system builds mpi4py)

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
    longer than ``timeout`` seconds on the reference machine, ``scaled(timeout)`` on this one
    (then every process of the job is killed first).
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    full_env.setdefault("OMPI_MCA_osc", "^ucx")   # quiet shared windows (communicator.py)
    version = open_mpi_version(version_text(mpirun_path(python)))
    if not version or int(version.split(".")[0]) < 5:
        # hydra (MPICH, Intel MPI) and Open MPI 4's orted forward each write as it comes: an
        # unbuffered print's text and its newline are two writes, and another rank's line can
        # land between them (under Open MPI 5 the suite's lines arrive whole).
        full_env.pop("PYTHONUNBUFFERED", None)
    cmd = mpirun_command(np_, argv, mpirun_args, python=python)
    # auto's table cache (comm/auto/cache.py): a fresh folder per job, so a job measures as
    # before (tests skew auto's clock) and never reads or writes the user's ~/.cache. Open
    # MPI's session folder too: a killed job's is left behind, named after its mpirun's pid,
    # and stops the later job that gets the same pid (private_session_base).
    with tempfile.TemporaryDirectory(prefix="nnabla_torus_cache_") as cache:
        full_env["NNABLA_TORUS_CACHE_DIR"] = cache
        full_env.update(env or {})
        with private_session_base(full_env, mpirun_args) as job_env:
            status, out = run_killable(cmd, job_env, timeout)
    if check and status != 0:
        raise AssertionError(f"exit {status}: {' '.join(cmd)}\n{out}")
    return out


def run_killable(cmd, env, timeout, on_timeout=None):
    """(exit status, stdout+stderr) of ``cmd`` run in the repository in its own process group;
    after ``scaled(timeout)`` seconds (``timeout``: the limit on the reference machine,
    tests/slowdown.py) the group is killed, ``on_timeout()`` called (e.g. to cancel a batch
    job) and AssertionError raised with the output."""
    limit = scaled(timeout)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        if on_timeout is not None:
            on_timeout()
        raise AssertionError(f"timeout after {limit:.0f} s ({timeout} s on the reference machine; "
                             f"deadlock?): {' '.join(cmd)}\n{out}")
    return proc.returncode, out


def library_python(library):
    """The interpreter of the venv of MPI library ``library`` (``mpich``, ``impi``, ``system``).

    ``$NNABLA_TORUS_TEST_VENV_<LIBRARY>`` when set, else ``.venv-<library>`` in the repository,
    made on first use by ``MPI=<library> EXTRAS=test tools/setup_venv.sh``; the test is skipped
    with set-up's last lines when that fails (no registry, no wheel for this machine; for
    ``system``: no mpirun on PATH outside the venvs).
    """
    import pytest   # here, not at the top: the MPI test programs import this module too
    override = os.environ.get(f"NNABLA_TORUS_TEST_VENV_{library.upper()}")
    venv = override or os.path.join(REPO, f".venv-{library}")
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".installed")
    # A system venv's bin/mpirun links the system's, which may have been removed since.
    runs = library != "system" or os.access(os.path.join(venv, "bin", "mpirun"), os.X_OK)
    if override or (os.path.exists(stamp) and os.path.exists(python) and runs
                    and open(stamp).read().startswith(f"MPI={library} ")):
        return python
    try:
        done = subprocess.run(["bash", "tools/setup_venv.sh", venv], cwd=REPO,
                              env={**os.environ, "MPI": library, "EXTRAS": "test"},
                              capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"MPI={library} tools/setup_venv.sh {venv} took over {SETUP_TIMEOUT_S} s")
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        pytest.skip(f"no {library} venv: MPI={library} tools/setup_venv.sh {venv} failed: "
                    + " | ".join(tail))
    return python
