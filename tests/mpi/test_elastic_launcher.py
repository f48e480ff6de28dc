"""nnabla-torus-run under real mpirun: with a stand-in script (relaunch on request, stop on
a failure that repeats with status and last lines, restart limit, Ctrl-C forwarded; a killed or
stopped rank restarted from the checkpoint, the restart budget per hour; relaunch from a
hostfile and Ctrl-C also under MPICH, Intel MPI and the system's MPI), then driving
examples/imagenet/train.py (1 -> 2 ranks; Ctrl-C leaves a checkpoint that resumes on 1 rank;
without the launcher train.py only logs what it would do)."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.mpirun import REPO, library_python, run_mpi
from tests.slowdown import scaled

FAKE = "tests/mpi/progs/elastic_fake.py"


def launcher(*args, python=sys.executable, **popen):
    """nnabla-torus-run ``args`` run by ``python`` (whose venv's MPI library the job uses)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_MCA_rmaps_base_oversubscribe="1")
    return subprocess.Popen([python, "-m", "nnabla_torus.launching.elastic", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def run(*args, timeout=120, python=sys.executable):
    proc = launcher(*args, python=python)
    out, _ = proc.communicate(timeout=scaled(timeout))
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


def test_the_scripts_error_stops_at_once(tmp_path):
    status, out = run("--slots", "2", "--ranks-schedule", "0:2", "--", "python", FAILING,
                      str(tmp_path), "--fail", "error")
    assert status == 1 and out.count("launch: ") == 1, out
    assert "stopping: train.py: error: image 7 of the list cannot be decoded" in out, out


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
