"""--checkpoint-every: a number of steps or auto (Young/Daly from the run's own times)."""
import time
import types

import pytest

import checkpoint_policy
from examples.imagenet.config import parse_config
from nnabla_torus.planning.machine_profile import load_profile


def test_the_flag_takes_auto_or_steps(capsys):
    assert parse_config(["--checkpoint-every", "auto"]).checkpoint_every == "auto"
    assert parse_config(["--checkpoint-every", "25"]).checkpoint_every == 25
    with pytest.raises(SystemExit):
        parse_config(["--checkpoint-every", "often"])
    assert "must be an integer >= 0 (or auto)" in capsys.readouterr().err


class FakeComm:
    size = 2

    def allreduce_numpy(self, array):        # two ranks with the same values
        array *= self.size
        return array


def fake_run(every):
    lines = []
    progress = types.SimpleNamespace(step=0, train_time=0.0, auto_checkpoint_every=0,
                                     monitors=None)
    run = types.SimpleNamespace(
        settings=types.SimpleNamespace(cfg=types.SimpleNamespace(checkpoint_every=every),
                                       log=lines.append),
        progress=progress, parallel=types.SimpleNamespace(comm=FakeComm()),
        planning=types.SimpleNamespace(planner=types.SimpleNamespace(
            prof=load_profile("cpu-2core"))))
    return run, lines


def test_auto_measures_its_first_checkpoint_then_keeps_young_dalys_interval(monkeypatch):
    monkeypatch.setattr(checkpoint_policy, "save", lambda run: time.sleep(0.05))
    run, lines = fake_run("auto")
    due = []
    for step in range(1, 12):
        run.progress.step, run.progress.train_time = step, 0.5 * step
        if checkpoint_policy.due(run):
            due.append(step)
            checkpoint_policy.timed_save(run)
    assert due == [checkpoint_policy.AUTO_STEPS]
    every = run.progress.auto_checkpoint_every
    # a 0.05 s checkpoint against 50,677 GPU-hours / 2 GPUs: about 3,000 s, 6,000 steps
    assert every > 1000 and len(lines) == 1, lines
    assert lines[0].startswith(f"--checkpoint-every auto: checkpoint every {every} step(s)")
    assert "(measured)" in lines[0] and "500.0 ms per step" in lines[0], lines[0]
    run.progress.step = every * 2
    assert checkpoint_policy.due(run)


def test_a_number_is_a_fixed_interval_and_zero_none():
    run, _ = fake_run(5)
    run.progress.step = 10
    assert checkpoint_policy.due(run)
    run.progress.step = 11
    assert not checkpoint_policy.due(run)
    run, _ = fake_run(0)
    run.progress.step = 10
    assert not checkpoint_policy.due(run)
