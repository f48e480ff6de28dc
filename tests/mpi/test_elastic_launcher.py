"""nnabla-torus-run under real mpirun: with a stand-in script (relaunch on request, stop on
a failure that repeats with status and last lines, restart limit, Ctrl-C forwarded; a killed or
stopped rank restarted from the checkpoint, the restart budget per hour; relaunch from a
hostfile and Ctrl-C also under MPICH, Intel MPI and the system's MPI), then driving
examples/imagenet/train.py (1 -> 2 ranks; Ctrl-C leaves a checkpoint that resumes on 1 rank;
without the launcher train.py only logs what it would do)."""
import fcntl
import json
import os
import pty
import signal
import socket
import subprocess
import sys
import termios
import time
import uuid

import pytest

from tests.mpirun import REPO, library_python, run_mpi
from tests.slowdown import scaled

FAKE = "tests/mpi/progs/elastic_fake.py"


def launcher(*args, python=sys.executable, env=None, **popen):
    """nnabla-torus-run ``args`` run by ``python`` (whose venv's MPI library the job uses),
    with ``env`` added to this environment; ``popen``: Popen's arguments (default: the output
    read as text from a pipe)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_MCA_rmaps_base_oversubscribe="1", **(env or {}))
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **popen}
    return subprocess.Popen([python, "-m", "nnabla_torus.launching.elastic", *args], cwd=REPO,
                            env=env, **popen)


def run(*args, timeout=120, python=sys.executable):
    """nnabla-torus-run ``args``: (exit status, output); a launcher that runs longer than
    ``timeout`` seconds is SIGKILLed (its job ends with it) and fails the test."""
    proc = launcher(*args, python=python)
    try:
        out, _ = proc.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"nnabla-torus-run ran over {scaled(timeout)} s:\n{out}") from None
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


FAILING = "tests/mpi/progs/failing_fake.py"


def test_a_killed_rank_restarts_from_the_newest_checkpoint(tmp_path):
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAILING,
                      str(tmp_path), "--fail", "kill", "--at", "6", "--every", "4")
    assert status == 0, out
    assert ("restart 1 after a failure: rank 1 killed by signal 9 (Killed) (host "
            f"{socket.gethostname()}, rank(s) [1], exit status 137); relaunching from the "
            "newest checkpoint (step 4 announced)") in out, out
    assert "restart 1: training again from step 4: 2 step(s) lost (the failed run reached " \
           "step 6)" in out, out
    assert "FINISHED 2 10" in out and "finished after 1 restart(s)" in out, out


def test_a_failure_that_repeats_stops_after_the_budget_with_one_line(tmp_path):
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--restarts-per-hour", "1",
                      "--", "python", FAILING, str(tmp_path), "--fail", "kill",
                      "--fail-launches", "9")
    assert status == 137 and out.count("launch: ") == 2, out
    stops = [line for line in out.splitlines() if "stopping" in line]
    assert len(stops) == 1 and "failure 2 within an hour: --restarts-per-hour 1 restarts " \
                               "spent" in stops[0], out


@pytest.mark.slow
def test_the_same_failure_twice_in_a_row_stops_with_one_line(tmp_path):
    """Rank 1 killed at step 6 at every launch: before, restarted until --restarts-per-hour
    (4) was spent, 5 launches."""
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAILING,
                      str(tmp_path), "--fail", "kill", "--fail-launches", "9")
    assert status == 137 and out.count("launch: ") == 2, out
    stops = [line for line in out.splitlines() if "stopping" in line]
    assert len(stops) == 1 and ("failed the same way twice in a row: rank 1 killed by signal 9 "
                                "(Killed)") in stops[0] and "at step 6)" in stops[0], out


@pytest.mark.slow
def test_a_full_disk_stops_at_once_and_says_so(tmp_path):
    """The OSError of a full disk at every launch: before, "rank 1 ... exited with status 1"
    was restarted 4 times and the launcher never said the disk was full."""
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAILING,
                      str(tmp_path), "--fail", "disk", "--fail-launches", "9")
    assert status == 1 and out.count("launch: ") == 1, out
    stops = [line for line in out.splitlines() if "stopping" in line]
    assert len(stops) == 1 and ("stopping: the disk is full: unhandled OSError: [Errno 28] No "
                                f"space left on device: '{tmp_path}/model.nnp'; aborting the "
                                f"job (host {socket.gethostname()}, rank(s) [1]) would repeat "
                                "on a restart") in stops[0], out


@pytest.mark.slow
def test_a_folder_another_live_run_holds_stops_at_once(tmp_path):
    """State's RunFolderBusy on every rank: before, "rank 0 crashed (RunFolderBusy)" (or rank
    1) was relaunched 4 times, and a relaunch took the folder over once the live run ended."""
    live = subprocess.Popen(["sleep", "120"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "run.lock").write_text(json.dumps(
            {"pid": live.pid, "host": socket.gethostname(), "started": "t", "job": "other"}))
        status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAILING,
                          str(tmp_path), "--fail", "busy")
    finally:
        live.kill()
        live.wait()
    assert status == 1 and out.count("launch: ") == 1, out
    stops = [line for line in out.splitlines() if "stopping" in line]
    assert len(stops) == 1 and (f"stopping: {tmp_path}/run is in use by a live run: pid "
                                f"{live.pid} on host {socket.gethostname()} (since t)") \
        in stops[0], out


def test_the_scripts_error_stops_at_once(tmp_path):
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAILING,
                      str(tmp_path), "--fail", "error")
    assert status == 1 and out.count("launch: ") == 1, out
    assert "stopping: train.py: error: image 7 of the list cannot be decoded" in out, out


@pytest.mark.slow
def test_a_stopped_rank_is_ended_by_the_timeout_and_the_run_restarts(tmp_path):
    """SIGSTOP on rank 1: the communicator's timeout (5 s) ends the job, the launcher
    restarts it from the checkpoint."""
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--mpirun-args",
                      "-x NNABLA_TORUS_TIMEOUT=5", "--", "python", FAILING, str(tmp_path),
                      "--fail", "stop", "--api", "communicator", timeout=240)
    assert status == 0, out
    assert "restart 1 after a failure: timeout: rank 0: rank(s) [1] did not arrive" in out, out
    assert "training again from step 4: 2 step(s) lost" in out, out


def interrupt_when(proc, marker, timeout=120):
    """Read ``proc``'s output until a line holds ``marker``, send Ctrl-C; the output."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker in line:   # epoch lines start with the time of day
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=scaled(timeout))
    return "".join(lines) + out


def test_ctrl_c_is_forwarded_and_leaves_a_resumable_stop():
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAKE, "wait")
    out = interrupt_when(proc, "WAITING")
    assert proc.returncode == 130, out
    assert "checkpoint is resumable" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("library", ["mpich", "impi", "system"])
def test_hostfile_relaunch_and_ctrl_c_under_another_library(library, tmp_path):
    """Before: the launcher passed Open MPI's -x and --hostfile, which hydra refuses
    ("unrecognized argument x"); the hostfile becomes hydra's host:N machinefile."""
    python = library_python(library)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{socket.gethostname()} slots=2\n")
    status, out = run("--hostfile", str(hostfile), "--ranks-schedule", "0:1", "--", "python",
                      FAKE, "grow", python=python)
    assert status == 0, out
    assert "RAN ON 2" in out and "finished after 1 restart(s)" in out, out
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAKE, "wait",
                    python=python)
    out = interrupt_when(proc, "WAITING")
    assert proc.returncode == 130 and "checkpoint is resumable" in out, out


def tagged_processes(tag):
    """Command lines of the live processes whose environment holds ``tag``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(pid + ": " + f.read().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGKILL])
def test_the_job_does_not_outlive_the_launcher(signum):
    """Before: the job ran in its own session and only SIGINT/SIGTERM were handled; after a
    SIGHUP (a closed terminal) or a SIGKILL of the launcher, mpirun and both ranks trained on
    (prterun, python x 2 left)."""
    tag = f"NNABLA_TORUS_TEST_JOB={uuid.uuid4().hex}"
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAKE, "wait",
                    env=dict([tag.split("=")]))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "WAITING" in line:
            break
    assert len(tagged_processes(tag)) >= 4, lines       # launcher, mpirun, 2 ranks
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    deadline = time.monotonic() + 5
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_processes(tag) == [], "".join(lines) + out
    if signum == signal.SIGHUP:                         # stopped resumably, as by SIGTERM
        assert proc.returncode == 130 and "checkpoint is resumable" in out, out


def test_a_closed_terminal_stops_the_job_resumably():
    """The launcher on a terminal that closes (a lost ssh session): SIGHUP, then every write
    to the terminal fails (EIO). Before: the next job line's write raised, the launcher killed
    the job mid-checkpoint and exited 1."""
    tag = f"NNABLA_TORUS_TEST_JOB={uuid.uuid4().hex}"
    terminal, tty = pty.openpty()
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAKE, "wait",
                    env=dict([tag.split("=")]), stdin=tty, stdout=tty, stderr=tty,
                    start_new_session=True,       # the terminal becomes the launcher's own
                    preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(tty)
    seen = b""
    while b"WAITING" not in seen:
        seen += os.read(terminal, 4096)
    os.close(terminal)                             # hang up: SIGHUP to the launcher
    assert proc.wait(timeout=60) == 130, seen.decode()
    deadline = time.monotonic() + 5
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_processes(tag) == [], seen.decode()


def test_ranks_left_by_a_killed_mpirun_are_ended_before_a_restart():
    """Open MPI 5's ranks outlive a SIGKILLed mpirun (the OOM killer's choice, say); before,
    the launcher restarted beside them: two jobs in one folder."""
    tag = f"NNABLA_TORUS_TEST_JOB={uuid.uuid4().hex}"
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--max-restarts", "0", "--",
                    "python", FAKE, "wait", env=dict([tag.split("=")]))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "WAITING" in line:
            break
    mpirun = [p for p in tagged_processes(tag) if "/prterun " in p or "/mpirun " in p]
    os.kill(int(mpirun[0].split(":")[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert "mpirun ended leaving 2 process(es) of its job running" in out, out
    assert tagged_processes(tag) == [], "".join(lines) + out


def test_ctrl_c_during_start_up_stops_without_a_loop():
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAKE, "early")
    out = interrupt_when(proc, "STARTING")
    assert proc.returncode == 130, out
    assert "stopped by a signal before the ranks could checkpoint" in out, out
    assert out.count("launch: ") == 1, out


TRAIN = "examples/imagenet/train.py"
TINY = ["--train-images", "128", "--image-size", "16", "--local-batch", "16",
        "--reference-batch", "32", "--warmup-epochs", "0.5", "--progress", "0",
        "--checkpoint-every", "0"]


@pytest.mark.slow
def test_train_py_grows_from_one_to_two_ranks(tmp_path):
    status, out = run("--slots", "2", "--ranks-schedule", "0:1,1:2", "--", "python", TRAIN,
                      *TINY, "--epochs", "2", "--batch-schedule", "0:32,1:64",
                      "--output-dir", str(tmp_path), timeout=300)
    assert status == 0, out
    assert "elastic: requesting a relaunch on 2 ranks: resize (fixed GPU-count schedule)" in out
    assert "checkpoint" in out and "was written by 1 rank, this run has 2" in out, out
    assert "global batch 64 as 2 ranks x 16 x 2 accumulation (was 16 x 4 per rank)" in out, out
    summary = json.loads([line for line in out.splitlines() if line.startswith('{"val_top1"')][-1])
    assert summary["ranks"] == 2 and summary["epochs"] == 2.0
    assert summary["batch_schedule"] == "0:32,1:64", summary


@pytest.mark.slow
def test_train_py_stops_on_ctrl_c_with_a_resumable_checkpoint(tmp_path):
    proc = launcher("--slots", "2", "--ranks-schedule", "0:2", "--", "python", TRAIN, *TINY,
                    "--epochs", "50", "--batch-schedule", "0:32", "--output-dir", str(tmp_path))
    out = interrupt_when(proc, "epoch 1.00")          # a validation line: training under way
    assert proc.returncode == 130, out
    assert "stopped on a signal; checkpoint written" in out, out
    status, out = run("--slots", "2", "--ranks-schedule", "0:1", "--", "python", TRAIN, *TINY,
                      "--epochs", "50", "--batch-schedule", "0:32", "--resume", "1",
                      "--max-steps", "12", "--output-dir", str(tmp_path), timeout=300)
    assert status == 0 and "resumed from" in out, out
    assert "was written by 2 ranks, this run has 1" in out, out


def test_without_the_launcher_it_only_logs_what_the_launcher_would_do(tmp_path):
    out = run_mpi(2, [TRAIN] + TINY + ["--epochs", "1", "--batch-schedule", "0:32",
                                       "--max-steps", "2", "--output-dir", str(tmp_path)],
                  timeout=180)
    # a resize is logged as what the launcher would do; a decline only in elastic runs
    # (before: "elastic: decline ... break-even ..." in every run)
    assert "requesting a relaunch" not in out
    assert "elastic: decline" not in out and "elastic: keep" not in out, out
    assert '"steps": 2' in out
