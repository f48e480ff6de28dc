"""Open MPI names a job's session folder after mpirun's pid (``ompi.<pid>`` in TMPDIR or
/tmp). A SIGKILLed mpirun leaves its folder behind, and a later mpirun given the same pid
stops at start: "The PMIx server's listener thread failed to start" (exit 213; pids wrap at
32,768 here, so a long test run hits it). Jobs started by the launcher, ``nnabla-torus-mpirun``
and this suite get a private base folder of their own (``private_session_base``)."""
import os
import signal
import subprocess

import pytest

from nnabla_torus.launching.mpirun_cmd import mpi_library, mpirun_command, mpirun_path
from nnabla_torus.launching.mpirun_cmd import private_session_base
from tests.mpirun import REPO, run_killable

pytestmark = pytest.mark.skipif(mpi_library(mpirun_path()) != "openmpi",
                                reason="the session folder is Open MPI's")
UP = "import sys, time; from mpi4py import MPI; print('up', flush=True); time.sleep(60)"
HELLO = "from mpi4py import MPI; print('rank', MPI.COMM_WORLD.rank, 'up')"


def killed_job_folder(base):
    """The session folder that a 2-rank job's mpirun, SIGKILLed once its ranks run, leaves in
    ``base``."""
    env = dict(os.environ, PRTE_MCA_prte_tmpdir_base=str(base))
    proc = subprocess.Popen(mpirun_command(2, ["-c", UP]), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = [proc.stdout.readline() for _ in range(2)]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lines == ["up\n"] * 2, lines
    left = os.path.join(base, f"ompi.{proc.pid}")
    assert os.path.isdir(left), os.listdir(base)
    return left


def run_with_pid_reused(stale, env):
    """(status, output) of a 2-rank job whose mpirun's pid is the one ``stale`` belonged to:
    a shell copies the folder to ``$TMPDIR/ompi.$$`` and becomes mpirun (exec keeps the pid)."""
    cmd = ["bash", "-c", 'cp -a "$0" "$TMPDIR/ompi.$$" && exec "$@"', stale,
           *mpirun_command(2, ["-c", HELLO])]
    return run_killable(cmd, env, timeout=60)


def test_a_killed_jobs_folder_stops_the_next_mpirun_with_its_pid_but_not_ours(tmp_path):
    stale = killed_job_folder(tmp_path / "killed")
    shared = tmp_path / "tmp"
    shared.mkdir()
    env = dict(os.environ, TMPDIR=str(shared), PYTHONPATH=REPO)
    status, out = run_with_pid_reused(stale, env)
    assert status != 0 and "listener thread failed to start" in out, (status, out)   # the cause
    with private_session_base(env) as job_env:
        status, out = run_with_pid_reused(stale, job_env)
        base = job_env["PRTE_MCA_prte_tmpdir_base"]
        assert os.listdir(base) == []                                 # mpirun cleaned up
    assert not os.path.exists(base)
    assert status == 0 and sorted(line for line in out.splitlines() if "up" in line) == [
        "rank 0 up", "rank 1 up"], out
