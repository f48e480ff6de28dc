"""What rank 0 reports: the log, the progress line or bar, the epoch line, the closing lines, JSON.

Only rank 0 prints (``RankZeroLog``), through the tqdm bar when there is one; the library's
warnings go the same way (``configure_logging``). ``EpochMeter`` gives the epoch line its own
mean loss, images/s, time and the run's ETA. The monitor series and the plots are
``monitor_series``'s (``make_monitors``, ``add_step`` and ``write_plots`` answer here too).
Example::

    log = RankZeroLog(comm.rank)
    log.progress = Progress(total=17256, initial=0, every=50, enabled=True)
    log("epoch 1.00 step 14: ...")          # through the bar, or a plain line
"""
import logging
import math
import sys
import threading
import time
import weakref

import numpy as np

from monitor_series import SERIES
from monitor_series import (add_step, make_monitors, write_plots,  # noqa: F401  (train.py,
                            write_series)                           # tests)


def clock():
    """The wall-clock time of a console line, HH:MM:SS (local time)."""
    return time.strftime("%H:%M:%S")


def ranks(count):
    """"1 rank", "4 ranks"."""
    return f"{count} rank" + ("" if count == 1 else "s")


def duration(seconds):
    """``75`` -> "1 min 15 s", ``4000`` -> "1 h 07 min"; "?" when not finite."""
    if not math.isfinite(seconds):
        return "?"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def say_when_slow(progress_ref):
    """The thread of a :class:`Progress`: a line when no step has ended for SLOW_STEP_S
    seconds, then at twice the wait each time, until a step ends (or the Progress closes or
    is gone)."""
    said, ended = SLOW_STEP_S, None
    while True:
        progress = progress_ref()
        if progress is None or progress.closed.wait(1.0):
            return
        if progress.step_ended != ended:                      # a step ended: start again
            said, ended = SLOW_STEP_S, progress.step_ended
        waited = time.time() - ended
        if waited >= said:
            after = "the start" if progress.step is None else f"step {progress.step}"
            progress.write(f"{clock()} still working: {duration(waited)} since {after} "
                           f"(a step of this model and batch takes that long here)")
            said *= 2
        del progress


class EpochMeter:
    """One epoch's training: mean loss over its steps and ranks (``share_loss``: one
    all-reduce an epoch), its own images per second and seconds (the step times: validation
    and checkpoints not counted), and its wall time since the meter was made (all included:
    the ETA's pace). ``start_epoch``: the fractional epoch it starts at (the last epoch line's,
    or a resumed run's)."""

    def __init__(self, start_epoch=0.0):
        self.loss_sum, self.steps, self.images, self.seconds = 0.0, 0, 0, 0.0
        self.started, self.start_epoch = time.time(), float(start_epoch)

    def add(self, loss, images, seconds):
        self.loss_sum, self.steps = self.loss_sum + loss, self.steps + 1
        self.images, self.seconds = self.images + images, self.seconds + seconds

    def share_loss(self, comm):
        """Make the loss sum the mean over the ranks (collective: every rank calls it)."""
        self.loss_sum = float(comm.allreduce_numpy(np.array([self.loss_sum]))[0]) / comm.size

    @property
    def mean_loss(self):
        return self.loss_sum / self.steps if self.steps else math.nan

    @property
    def images_per_s(self):
        return self.images / self.seconds if self.seconds > 0 else math.nan

    def line(self, epoch, step, top1, top5, epochs, val_seconds=None):
        """The epoch line at fractional ``epoch`` of ``epochs`` (a part's line with
        ``--val-every`` below 1: its mean loss and time since ``start_epoch``), with the
        seconds its validation took (``val_seconds``: tools take them out of times to a
        target); the ETA at this epoch's pace
        (its steps, validation and checkpoints, over the epochs since ``start_epoch``: a short
        first epoch of a resumed run, or one that ends a step past the boundary, 1.04 -> 2.09)."""
        wall = time.time() - self.started
        part = epoch - self.start_epoch
        left = (epochs - epoch) * wall / part if part > 0 else math.inf
        whole = part > 0.99          # an epoch (or its end); else a --val-every part of one
        mean, took = (("epoch mean", "epoch") if whole else
                      (f"mean since epoch {self.start_epoch:.2f}", "part"))
        return (f"{clock()} epoch {epoch:.2f} step {step}: train loss {self.mean_loss:.4f} "
                f"({mean}), val top-1 {json_value(top1)} top-5 {json_value(top5)}"
                + ("" if val_seconds is None else f" ({val_seconds:.2f} s)") + ", "
                f"{self.images_per_s:.0f} images/s, {took} {duration(self.seconds)}, "
                f"ETA {duration(left)}")


class RankZeroLog:
    """``log(text)``: print on rank 0 only, through ``progress`` (a Progress) once it is set."""

    def __init__(self, rank):
        self.rank0, self.progress = rank == 0, None

    def __call__(self, text):
        if self.rank0 and self.progress is not None:
            self.progress.write(text)
        elif self.rank0:
            print(text, flush=True)


def configure_logging(rank, log):
    """Print the library's warnings (``nnabla_torus.*``) through ``log`` on rank 0, beside the
    script's lines and without breaking the progress bar; on other ranks (only the records the
    communicator lets through there: those that differ per rank) on stderr with the rank.
    Its INFO lines are left out: they repeat what the loop logs (the batch changes)."""
    class Handler(logging.Handler):
        def emit(self, record):
            text = self.format(record)
            if rank == 0:
                log(text)
            else:
                print(f"rank {rank}: {text}", file=sys.stderr, flush=True)

    handler = Handler()
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("nnabla_torus")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.WARNING)
    logger.propagate = False


SLOW_STEP_S = 10.0   # seconds without a finished step before a "still working" line


class Progress:
    """Rank 0's progress: a tqdm bar on a terminal, else a plain line every ``every`` steps.

    A bar written to a file is thousands of carriage-return frames; a line per N steps reads
    well in a log. ``write`` prints a log line without breaking the bar. When no step has
    ended for SLOW_STEP_S seconds (ResNet-50 at 224 px on a CPU: minutes a step), a thread says
    so, at 10, 20, 40, ... s, so that a slow run is never silent (nnabla's kernels release the
    GIL: the thread runs while they compute).
    """

    def __init__(self, total, initial, every, enabled):
        self.bar, self.every, self.enabled = None, every, enabled
        self.total, self.tic = total, time.time()
        self.step, self.step_ended, self.closed = None, time.time(), threading.Event()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=min(initial, total), unit="img",
                            unit_scale=True, dynamic_ncols=True)   # stderr: stdout keeps the log
        if enabled:        # a weak reference: the thread ends with the Progress, closed or not
            threading.Thread(target=say_when_slow, args=(weakref.ref(self),),
                             daemon=True).start()

    def write(self, text):
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def update(self, step, position, loss, lr, batch):
        """After optimizer step ``step``: the run is at image ``position`` of its
        epochs x dataset images (shard padding not counted, so never past the total);
        ``batch`` images in this step."""
        seen = round(min(position, self.total))
        self.step, self.step_ended = step, time.time()
        if self.bar is not None:
            self.bar.update(seen - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.3g}", batch=batch, refresh=False)
        elif self.enabled and self.every and step % self.every == 0:
            print(f"{clock()} step {step}: {seen:,}/{self.total:,} images "
                  f"({seen / self.total:.1%}), "
                  f"loss {loss:.4f}, lr {lr:.3g}, global batch {batch}, "
                  f"{time.time() - self.tic:.0f} s", flush=True)

    def close(self):
        self.closed.set()
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def closing_summary(run, wall, plots):
    """The lines a person reads at the end of a run (rank 0): accuracy, times, every output."""
    progress, cfg = run.progress, run.settings.cfg
    out = cfg.output_dir
    yield (f"done: {run.data.stream.epoch():.2f} epochs, {progress.step} steps in "
           f"{duration(wall)} ({duration(progress.train_time)} training, "
           f"{progress.images_seen / max(progress.train_time, 1e-9):.0f} images/s); val top-1 "
           f"best {json_value(progress.best_top1)}, last {json_value(progress.top1)}")
    yield f"  model:       {out}/model.h5, {out}/model.nnp"
    yield f"  monitors:    {out}/*.series.txt ({', '.join(SERIES)})"
    if plots:
        yield f"  plots:       {', '.join(plots)}"
    if progress.checkpoint:
        yield f"  checkpoint:  {progress.checkpoint} (continue with --resume 1)"


def json_value(value):
    """``value`` rounded to 4 digits, or None (JSON null) when it is missing or not finite."""
    return None if value is None or not math.isfinite(value) else round(float(value), 4)


def strict_json(value):
    """``value`` with every non-finite float (anywhere in dicts and lists) replaced by None,
    so that ``json.dumps`` writes strict JSON (no NaN or Infinity)."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_json(run, wall):
    """The run's last line on rank 0, as a strict-JSON-able dict (null where a value is
    missing): accuracy, epochs, steps, throughput, wall seconds, what the all-reduce ran.
    ``run``: train.py's RunState (run_state.py)."""
    comm, progress, planner = run.parallel.comm, run.progress, run.planning.planner
    return strict_json({
        "val_top1": json_value(progress.top1), "val_top5": json_value(progress.top5),
        "epochs": round(run.data.stream.epoch(), 3), "steps": progress.step,
        "images_per_sec": round(progress.images_seen / max(progress.train_time, 1e-9), 1),
        "wall_s": round(wall, 1), "ranks": comm.size, "algorithm": comm.algorithm,
        "grid": str(comm.grid),
        "batch_schedule": ",".join(f"{e:g}:{b}" for e, b in progress.history),
        "plan": planner and planner.run_summary(),
        "bad_images": len(run.data.reported_bad),
        "diverged_since_step": progress.first_nonfinite if progress.nonfinite_steps else None})

