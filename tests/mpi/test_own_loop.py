"""examples/own_loop/train.py, a user's own nnabla loop on the public API, under
nnabla-torus-run: a rank killed with SIGKILL after the first checkpoint, the launcher restarts
the job from it, and the run ends with exactly the parameters of a run that was not killed
(with a fixed batch; with --adaptive-batch 1, what a restart guarantees: see its test)."""
import re
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from nnabla_torus.launching.elastic_protocol import CHECKPOINT_PREFIX
from tests.mpirun import REPO
from tests.slowdown import scaled

SCRIPT = "examples/own_loop/train.py"
TIMEOUT_S = 600          # each launcher run on the reference machine, killed beyond it


def launch(output_dir, *flags):
    """nnabla-torus-run --slots 4 of the example (seed 3, 2 epochs; ``flags`` come last and
    override) into ``output_dir``."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nnabla_torus.launching.elastic", "--slots", "4",
         "--ranks-schedule", "0:4", "--", "python", SCRIPT, "--output-dir", str(output_dir),
         "--seed", "3", "--epochs", "2", *flags], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timer = threading.Timer(scaled(TIMEOUT_S), os.killpg, (proc.pid, signal.SIGKILL))
    timer.start()
    return proc, timer


def rank_pid(output_dir, rank):
    """The pid of the example's rank ``rank`` writing to ``output_dir`` (from /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if SCRIPT.encode() in b" ".join(cmdline) and str(output_dir).encode() in cmdline and \
                f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no rank {rank} of {SCRIPT} found")


def parameters(path):
    import nnabla as nn
    with nn.parameter_scope(path):
        nn.load_parameters(path)
        return {name: var.d.copy() for name, var in nn.get_parameters(grad_only=False).items()}


@pytest.mark.slow
def test_a_rank_killed_after_the_first_checkpoint_ends_with_the_unfailed_runs_params(tmp_path):
    start = time.monotonic()
    proc, timer = launch(tmp_path / "whole")
    whole_out, _ = proc.communicate()
    timer.cancel()
    assert proc.returncode == 0, whole_out
    whole_s = time.monotonic() - start

    start = time.monotonic()
    proc, timer = launch(tmp_path / "killed")
    lines, killed = [], False
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(CHECKPOINT_PREFIX) and not killed:      # the first checkpoint
            os.kill(rank_pid(tmp_path / "killed", 3), signal.SIGKILL)
            killed = True
    proc.wait()
    timer.cancel()
    out = "".join(lines)
    killed_s = time.monotonic() - start
    assert proc.returncode == 0, out
    assert "restart 1 after a failure: rank 3 killed by signal 9" in out, out
    assert "resumed from " in out and "finished after 1 restart(s)" in out, out
    assert "run lock: took over" in out, out          # rank 0 of the killed job was ended
    whole, killed = (parameters(str(tmp_path / d / "params.h5")) for d in ("whole", "killed"))
    assert sorted(whole) == sorted(killed)
    worst = max(float(np.max(np.abs(whole[k] - killed[k]))) for k in whole)
    print(f"own loop: exit {proc.returncode}, max abs difference {worst}, unfailed "
          f"{whole_s:.1f} s, killed and restarted {killed_s:.1f} s")
    for name in whole:
        np.testing.assert_array_equal(killed[name], whole[name], err_msg=name)


def killed_run(output_dir, *flags):
    """(exit code, output) of a launcher run whose rank 3 is killed at the first checkpoint
    after its first change of the global batch."""
    proc, timer = launch(output_dir, *flags)
    lines, killed = [], False
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(CHECKPOINT_PREFIX) and not killed and len(batches(lines)) > 1:
            os.kill(rank_pid(output_dir, 3), signal.SIGKILL)
            killed = True
    proc.wait()
    timer.cancel()
    return proc.returncode, "".join(lines)


def batches(out):
    """[(step, global batch)] of the example's ``global batch N =`` lines, in order."""
    return [(int(step), int(batch)) for step, batch in
            re.findall(r"^step (\d+): global batch (\d+) = ", "".join(out), re.M)]


@pytest.mark.slow
def test_an_adaptive_run_killed_after_the_first_checkpoint_resumes_its_batch(tmp_path):
    """--adaptive-batch 1, a rank killed at the first checkpoint after the batch grew from
    16: the job restarts from it with the batch it had there, and both runs finish.

    The final parameters are not compared: AdaptiveBatch decides on the step times it measures
    (wall clock, rank means), which differ between two runs and between a run and its restart,
    so the two runs change their batch at other steps or to other sizes. What a restart
    guarantees is its checkpoint's state: the same global batch and the noise scale,
    decisions and step times measured until then (AdaptiveBatch.state_dict in State.extras).
    """
    flags = ("--adaptive-batch", "1", "--epochs", "4")    # room for the first change under load
    proc, timer = launch(tmp_path / "whole", *flags)
    whole_out, _ = proc.communicate()
    timer.cancel()
    assert proc.returncode == 0, whole_out
    code, out = killed_run(tmp_path / "killed", *flags)
    assert code == 0, out
    assert "restart 1 after a failure: rank 3 killed by signal 9" in out, out
    for run in (whole_out, out):
        assert batches(run)[0] == (0, 16) and max(b for _, b in batches(run)) > 16, run
    first, restart = out.split("restart 1 after a failure")
    resumed = int(re.search(r"resumed from \S+: step (\d+)", restart).group(1))
    at_checkpoint = [b for step, b in batches(first) if step < resumed][-1]
    assert at_checkpoint > 16, out
    line = re.search(r"^step \d+: global batch .*", restart, re.M).group(0)
    # the same batch, or a decision at the first step that starts from it
    assert batches(line)[0] == (resumed, at_checkpoint) or \
        f"batch {at_checkpoint} (" in line, out
    assert "finished after 1 restart(s)" in out, out
    whole, killed = (parameters(str(tmp_path / d / "params.h5")) for d in ("whole", "killed"))
    assert sorted(whole) == sorted(killed)
    same = all(np.array_equal(whole[k], killed[k]) for k in whole)
    print(f"own loop, adaptive: batches unfailed {batches(whole_out)}, killed {batches(out)}; "
          f"final parameters bitwise equal: {same}")


@pytest.mark.slow
def test_the_launchers_ctrl_c_stops_the_own_loop_with_a_checkpoint_it_resumes(tmp_path):
    """Before State.stop_requested, the ranks of a user's loop died of the forwarded SIGUSR1
    and lost the steps since their last checkpoint; now they agree, save and exit 76."""
    proc, timer = launch(tmp_path / "run", "--checkpoint-every", "1000", "--epochs", "50")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(CHECKPOINT_PREFIX):            # the first epoch's end
            proc.send_signal(signal.SIGINT)          # the user's Ctrl-C on the launcher
            break
    out, _ = proc.communicate()
    timer.cancel()
    out = "".join(lines) + out
    assert proc.returncode == 130, out
    assert "stopped on a signal; the checkpoint is resumable" in out, out
    stopped_at = max(int(m) for m in re.findall(r'"step": (\d+)', out))
    first = int(re.search(r'"step": (\d+)', "".join(lines)).group(1))
    assert stopped_at > first, out                   # a checkpoint written at the stop
    proc, timer = launch(tmp_path / "run", "--checkpoint-every", "1000", "--epochs", "2",
                         "--resume", "1")
    out, _ = proc.communicate()
    timer.cancel()
    assert f"resumed from {tmp_path / 'run'}/ckpt-{stopped_at:09d}.npz.chk" in out, out
