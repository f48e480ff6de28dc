"""examples/own_loop/train.py, a user's own nnabla loop on the public API, under
nnabla-torus-run: a rank killed with SIGKILL after the first checkpoint, the launcher restarts
the job from it, and the run ends with exactly the parameters of a run that was not killed."""
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

SCRIPT = "examples/own_loop/train.py"
TIMEOUT_S = 600          # each launcher run, killed as a group beyond it


def launch(output_dir):
    """nnabla-torus-run --slots 4 of the example (seed 3, 2 epochs) into ``output_dir``."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_MCA_rmaps_base_oversubscribe="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nnabla_torus.launching.elastic", "--slots", "4",
         "--ranks-schedule", "0:4", "--", "python", SCRIPT, "--output-dir", str(output_dir),
         "--seed", "3", "--epochs", "2"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    timer = threading.Timer(TIMEOUT_S, os.killpg, (proc.pid, signal.SIGKILL))
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
