"""nnabla-torus-run under real mpirun, with a stand-in script: relaunch on request, stop on
anything else (status and last lines), restart limit, Ctrl-C forwarded as a checkpoint stop."""
import os
import signal
import subprocess
import sys
import time

from tests.mpirun import REPO

FAKE = "tests/mpi/progs/elastic_fake.py"


def launcher(*args, **popen):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_MCA_rmaps_base_oversubscribe="1")
    return subprocess.Popen([sys.executable, "-m", "nnabla_torus.elastic", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def run(*args, timeout=120):
    proc = launcher(*args)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_relaunches_on_the_requested_count_with_resume():
    status, out = run("--slots", "2", "--ranks-schedule", "0:1", "--", "python", FAKE, "grow")
    assert status == 0, out
    assert "-np 1 " in out and "-np 2 " in out, out
    assert "decision at epoch 1.000: test: grow; relaunching on 2 ranks" in out, out
    assert "RAN ON 2" in out and "--resume 1" in out, out
    assert "finished after 1 restart(s)" in out, out


def test_fewer_slots_than_requested_uses_what_exists():
    status, out = run("--slots", "1", "--ranks-schedule", "0:1", "--", "python", FAKE, "grow")
    assert status == 0, out
    assert "wanted 2 ranks but only 1 slots exist: using 1" in out, out
    assert "RAN ON 1" in out, out


def test_another_exit_stops_with_status_and_last_lines():
    status, out = run("--slots", "2", "--ranks-schedule", "0:1", "--", "python", FAKE, "fail")
    assert status == 3, out
    assert "exited with status 3 (not a resize request): stopping" in out, out
    assert "  | Traceback: something broke" in out and "  | line 29" in out, out
    assert out.count("launch: ") == 1, out                 # no loop


def test_restart_limit():
    status, out = run("--slots", "2", "--ranks-schedule", "0:1", "--max-restarts", "2", "--",
                      "python", FAKE, "always")
    assert status == 1 and out.count("launch: ") == 3, out
    assert "above --max-restarts 2: stopping" in out, out


def test_ctrl_c_is_forwarded_and_leaves_a_resumable_stop():
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAKE, "wait")
    lines = []
    deadline = time.time() + 60
    for line in proc.stdout:
        lines.append(line)
        if "WAITING" in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    out = "".join(lines) + out
    assert proc.returncode == 130, out
    assert "checkpoint is resumable" in out, out
