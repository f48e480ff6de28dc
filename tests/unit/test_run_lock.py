"""The run folder's lock (nnabla_torus/training/run_lock.py) and what a State does with it:
a second run in a live run's folder is refused and touches none of its files (issue 65)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from nnabla_torus.launching.elastic_protocol import ENV_LAUNCH
from nnabla_torus.training import State
from nnabla_torus.training.checkpoint_file import list_checkpoints, set_aside_earlier_run
from nnabla_torus.training.run_lock import LOCK_NAME, STALE_AFTER_S, RunFolderBusy, RunLock

LIVE_RUN = """
import sys, time
from nnabla_torus.training import State
state = State(None, sys.argv[1], {})
state.start(resume=False)
state.step = 7
state.save()
open(state.checkpoint.replace('.npz.chk', '.npz.tmp%d.chk' % __import__('os').getpid()), 'w')
print('ready', flush=True)
time.sleep(60)
"""


def write_lock(folder, **record):
    (folder / LOCK_NAME).write_text(json.dumps(dict({"started": "then", "job": ""}, **record)))


def test_a_second_run_in_a_live_runs_folder_is_refused_and_touches_nothing(tmp_path):
    """Before: the second run moved the live run's checkpoints to earlier-run-*/ and deleted
    its writer's temporary."""
    live = subprocess.Popen([sys.executable, "-c", LIVE_RUN, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "ready"
        before = sorted(os.listdir(tmp_path))
        lines = []
        with pytest.raises(RunFolderBusy) as error:
            State(None, str(tmp_path), {}, log=lines.append).start(resume=False)
        assert str(error.value) == (
            f"{tmp_path} is in use by a live run: pid {live.pid} on host "
            f"{socket.gethostname()} (since " + str(error.value).split("(since ")[1])
        assert "wait for it to end, or use another output folder" in str(error.value)
        assert sorted(os.listdir(tmp_path)) == before and lines == []
        assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == \
            ["ckpt-000000007.npz.chk"]
    finally:
        live.kill()
        live.wait()


def test_a_dead_pid_on_this_host_is_taken_over_with_a_line(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(tmp_path, pid=dead.pid, host=socket.gethostname())
    lines = []
    lock = RunLock.acquire(str(tmp_path), lines.append)
    assert len(lines) == 1 and f"from pid {dead.pid} on host {socket.gethostname()}: " \
        "that process is gone" in lines[0]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert os.listdir(tmp_path) == []


def test_another_hosts_lock_is_stale_only_when_not_refreshed_for_the_bound(tmp_path):
    write_lock(tmp_path, pid=1, host="elsewhere")
    with pytest.raises(RunFolderBusy, match="pid 1 on host elsewhere"):
        RunLock.acquire(str(tmp_path), print)
    old = time.time() - STALE_AFTER_S - 5
    os.utime(tmp_path / LOCK_NAME, (old, old))
    lines = []
    RunLock.acquire(str(tmp_path), lines.append).release()
    assert "not refreshed for 3605 s (over 3600 s)" in lines[0]


def test_an_earlier_job_of_the_same_launcher_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_LAUNCH, "launcher-1")
    write_lock(tmp_path, pid=1, host="elsewhere", job="launcher-1")
    lines = []
    RunLock.acquire(str(tmp_path), lines.append).release()
    assert "an earlier job of this nnabla-torus-run" in lines[0]


def test_release_leaves_another_runs_lock(tmp_path):
    lock = RunLock.acquire(str(tmp_path), print)
    write_lock(tmp_path, pid=1, host="elsewhere")          # taken over meanwhile
    lock.release()
    assert (tmp_path / LOCK_NAME).exists()


def test_a_model_without_checkpoints_is_set_aside_too(tmp_path):
    """Before: a folder with model.h5 and plots but no checkpoints was left as it was, and
    the new run overwrote them."""
    for name in ("model.h5", "training.png"):
        (tmp_path / name).write_text(name)
    lines = []
    aside = set_aside_earlier_run(str(tmp_path), ("model.h5", "*.png"), lines.append)
    assert sorted(os.listdir(aside)) == ["model.h5", "training.png"]
    assert (tmp_path / "model.h5").exists() is False
    assert "no checkpoints, its model or plots" in lines[0] and "--resume" not in lines[0]

