"""The example's progress lines (report.py): counted in dataset positions, so never above 100 %."""
import os
import sys
import time
import weakref

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import report  # noqa: E402


def test_progress_never_passes_the_total(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)   # plain lines, not a tqdm bar
    progress = report.Progress(total=17256, initial=0, every=1, enabled=True)
    progress.update(150, 16713.4, 0.83, 0.0004, 128)
    progress.update(155, 17256.0 + 1e-9, 0.64, 0.0001, 128)   # the last step's rounding
    lines = [line[9:] for line in capsys.readouterr().out.splitlines()]   # after HH:MM:SS
    assert lines[0].startswith("step 150: 16,713/17,256 images (96.9%), loss 0.8300"), lines
    assert lines[1].startswith("step 155: 17,256/17,256 images (100.0%)"), lines


def test_the_epoch_line_is_the_epochs_own(monkeypatch):
    """Before: the last step's loss and the run's images/s since its start (101 -> 259 over a
    run), no epoch time, no ETA, no time of day."""
    clock = iter([100.0, 130.0])                                   # made at 100 s, line at 130 s
    monkeypatch.setattr(report.time, "time", lambda: next(clock))
    meter = report.EpochMeter(1.0)
    for loss in (2.0, 1.0, 3.0):
        meter.add(loss, 64, 0.5)                                   # 3 steps of 64 images
    line = meter.line(2.0, 46, 0.91, 0.99, epochs=5, val_seconds=0.4)
    assert line[8:] == (" epoch 2.00 step 46: train loss 2.0000 (epoch mean), val top-1 0.91 "
                        "top-5 0.99 (0.40 s), 128 images/s, epoch 2 s, ETA 1 min 30 s"), line


def test_a_val_every_part_says_it_is_a_part(monkeypatch):
    clock = iter([100.0, 103.0])
    monkeypatch.setattr(report.time, "time", lambda: next(clock))
    meter = report.EpochMeter(1.25)
    meter.add(2.0, 64, 0.5)
    line = meter.line(1.5, 50, 0.8, 0.99, epochs=4, val_seconds=0.25)
    assert line[8:] == (" epoch 1.50 step 50: train loss 2.0000 (mean since epoch 1.25), val "
                        "top-1 0.8 top-5 0.99 (0.25 s), 128 images/s, part 0 s, ETA 30 s"), line


def test_the_eta_of_an_epoch_that_ends_past_its_boundary(monkeypatch):
    """Before: 256-image steps over 1,438 images end epochs at 1.04, 2.09, ...; the line at
    2.09 took its pace from 0.09 of an epoch (ETA 22 min for 40 s of training)."""
    clock = iter([100.0, 104.0])
    monkeypatch.setattr(report.time, "time", lambda: next(clock))
    meter = report.EpochMeter(1.04)
    meter.add(2.0, 256, 0.6)
    assert meter.line(2.09, 12, 0.4, 0.8, epochs=12).endswith("ETA 38 s")   # 9.91 x 4 / 1.05


def test_a_missing_plotting_library_costs_a_warning(tmp_path, monkeypatch):
    """Before: the run trained, saved its model, then exited 1 on ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)           # import matplotlib fails
    said = []
    assert report.write_plots(str(tmp_path), said.append) == []
    assert said[0].startswith("warning: no plots (") and "pip install matplotlib" in said[0]


class FakeClock:
    """report's ``time`` module with a clock that moves only when told: ``time()`` reads it,
    everything else (``strftime``) is the real module's."""

    def __init__(self, now):
        self.now, self.plan = now, []     # plan: [(time, action)] in time order

    def time(self):
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


class FakeClosed:
    """A Progress's ``closed`` event on the fake clock: ``wait(s)`` moves the clock by s,
    running the planned actions due by then at their own times; True once set."""

    def __init__(self, clock):
        self.clock, self.is_set = clock, False

    def set(self):
        self.is_set = True

    def wait(self, timeout):
        end = self.clock.now + timeout
        while self.clock.plan and self.clock.plan[0][0] <= end and not self.is_set:
            self.clock.now, action = self.clock.plan.pop(0)
            action()
        if not self.is_set:
            self.clock.now = end
        return self.is_set


def test_a_slow_step_says_so_while_it_runs(monkeypatch):
    """ResNet-50 at 224 px on a CPU takes minutes a step; the run printed nothing until the
    first step ended (11 min). Now a line comes at SLOW_STEP_S, 2x, 4x ... without a step
    ending, and the count starts again after each step. The Progress's thread runs here, in
    the test, on a fake clock (before: 6.6 s of real sleep, late under load)."""
    clock = FakeClock(1000.0)
    monkeypatch.setattr(report, "time", clock)
    monkeypatch.setattr(report, "SLOW_STEP_S", 1.0)
    lines = []
    progress = report.Progress(total=100, initial=0, every=0, enabled=False)   # no thread
    progress.write = lines.append
    progress.closed = FakeClosed(clock)

    def at_3_5_s():
        assert len(lines) == 2 and all("still working" in line and "since the start" in line
                                       for line in lines), lines   # at 1 s and 2 s, not 3 s
        progress.update(1, 10, 2.3, 0.1, 10)
    clock.plan = [(1003.5, at_3_5_s), (1005.1, progress.close)]
    report.say_when_slow(weakref.ref(progress))          # returns once the Progress closes
    assert clock.plan == [] and clock.now == 1005.1
    assert len(lines) == 3 and "since step 1" in lines[-1], lines   # 1.5 s after step 1


def test_a_global_batch_larger_than_the_data_is_refused():
    """128 against 72 images was not flagged (each step repeated images within itself)."""
    from types import SimpleNamespace
    from run_setup import check_batch_fits
    cfg = SimpleNamespace(batch_schedule="0:64,1:128", adaptive_batch=False, min_batch=0,
                          epochs=2)
    with pytest.raises(ValueError, match="global batch 128 .* larger than the 72 training images"):
        check_batch_fits(cfg, 72)
    check_batch_fits(cfg, 128)
    check_batch_fits(SimpleNamespace(**dict(vars(cfg), epochs=1)), 72)   # never reaches 128
    with pytest.raises(ValueError, match="--min-batch 96"):
        check_batch_fits(SimpleNamespace(batch_schedule="0:32", adaptive_batch=True,
                                         min_batch=96, epochs=1), 72)
