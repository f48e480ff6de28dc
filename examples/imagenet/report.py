"""What rank 0 reports: the log, the progress line or bar, the monitor series, the plot, JSON.

Only rank 0 prints (``RankZeroLog``), through the tqdm bar when there is one; the library's
warnings go the same way (``configure_logging``). The monitors are nnabla's
``MonitorSeries`` files ``<output_dir>/<name>.series.txt``, kept up to the checkpoint on a
resume; ``write_plots`` draws ``training.png`` (loss, accuracy, batch) and ``speed.png``
(learning rate, measured vs predicted images/s) from them, or warns without matplotlib.
``EpochMeter`` gives the epoch line its own mean loss, images/s, time and the run's ETA.
Example::

    log = RankZeroLog(comm.rank)
    log.progress = Progress(total=17256, initial=0, every=50, enabled=True)
    log("epoch 1.00 step 14: ...")          # through the bar, or a plain line
"""
import logging
import math
import os
import sys
import time

import numpy as np
from nnabla.monitor import Monitor, MonitorSeries

SERIES = ("train_loss", "train_error", "lr", "global_batch", "images_per_sec", "val_top1",
          "val_top5", "noise_scale",     # noise_scale: B_simple (samples), adaptive runs only
          "predicted_images_per_sec")    # the planner's prediction for the plan in use
EPOCH_SERIES = ("val_top1", "val_top5")     # indexed by epoch; the others by optimizer step



def clock():
    """The wall-clock time of a console line, HH:MM:SS (local time)."""
    return time.strftime("%H:%M:%S")


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

    def line(self, epoch, step, top1, top5, epochs):
        """The epoch line at fractional ``epoch`` of ``epochs``; the ETA at this epoch's pace
        (its steps, validation and checkpoints, over the epochs since ``start_epoch``: a short
        first epoch of a resumed run, or one that ends a step past the boundary, 1.04 -> 2.09)."""
        wall = time.time() - self.started
        part = epoch - self.start_epoch
        left = (epochs - epoch) * wall / part if part > 0 else math.inf
        return (f"{clock()} epoch {epoch:.2f} step {step}: train loss {self.mean_loss:.4f} "
                f"(epoch mean), val top-1 {json_value(top1)} top-5 {json_value(top5)}, "
                f"{self.images_per_s:.0f} images/s, epoch {duration(self.seconds)}, "
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


class Progress:
    """Rank 0's progress: a tqdm bar on a terminal, else a plain line every ``every`` steps.

    A bar written to a file is thousands of carriage-return frames; a line per N steps reads
    well in a log. ``write`` prints a log line without breaking the bar.
    """

    def __init__(self, total, initial, every, enabled):
        self.bar, self.every, self.enabled = None, every, enabled
        self.total, self.tic = total, time.time()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=min(initial, total), unit="img",
                            unit_scale=True, dynamic_ncols=True)   # stderr: stdout keeps the log

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
        if self.bar is not None:
            self.bar.update(seen - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.3g}", batch=batch, refresh=False)
        elif self.enabled and self.every and step % self.every == 0:
            print(f"{clock()} step {step}: {seen:,}/{self.total:,} images ({seen / self.total:.1%}), "
                  f"loss {loss:.4f}, lr {lr:.3g}, global batch {batch}, "
                  f"{time.time() - self.tic:.0f} s", flush=True)

    def close(self):
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


def make_monitors(cfg, rank, resumed_at=None):
    """MonitorSeries per name (rank 0 only); on resume keep the rows up to the checkpoint.

    ``resumed_at``: (step, epoch) of the checkpoint. MonitorSeries truncates its file when
    created, so the kept rows are written back after it.
    """
    if rank != 0:
        return None
    kept = {}
    for name in SERIES if resumed_at else ():
        path = series_path(cfg.output_dir, name)
        limit = resumed_at[1] if name in EPOCH_SERIES else resumed_at[0]
        if os.path.exists(path):
            kept[name] = [line for line in open(path) if series_x(line) <= limit + 1e-9]
    monitor = Monitor(cfg.output_dir)
    # interval 0 writes every value: at interval 1 MonitorSeries averages adds whose index moved
    # by less than 1, and a validation at epoch 2.08 after a mid-epoch batch change would merge
    # the one at 3.00 into the next row
    monitors = {name: MonitorSeries(name, monitor, interval=0 if name in EPOCH_SERIES else 1,
                                    verbose=False) for name in SERIES}
    for name, lines in kept.items():
        with open(series_path(cfg.output_dir, name), "a") as f:
            f.writelines(lines)
    return monitors


def add_step(monitors, step, loss, error, lr, batch, seconds, noise_scale=None,
             predicted=None):
    """Add optimizer step ``step`` to the monitors (None: not rank 0): ``batch`` images in
    ``seconds``; ``noise_scale``: B_simple in samples, when the adaptive batch measures it;
    ``predicted``: the planner's images/s for the plan in use."""
    if not monitors:
        return
    for name, value in (("train_loss", loss), ("train_error", error), ("lr", lr),
                        ("global_batch", batch), ("images_per_sec", batch / seconds)):
        monitors[name].add(step, value)
    for name, value in (("noise_scale", noise_scale), ("predicted_images_per_sec", predicted)):
        if value is not None:
            monitors[name].add(step, value)


def series_x(line):
    """The step or epoch a monitor line starts with; inf (not kept) for a blank or cut line,
    e.g. the last line of a run that was killed while writing it."""
    fields = line.split()
    try:
        return float(fields[0]) if len(fields) == 2 else math.inf
    except ValueError:
        return math.inf


def series_path(output_dir, name):
    return os.path.join(output_dir, f"{name}.series.txt")


PLOTS = ("training.png", "speed.png")


def write_plots(output_dir, log):
    """Draw ``PLOTS`` in ``output_dir`` from its monitor files; return their paths. Without
    matplotlib (optional: the ``[examples]`` extra installs it) a warning, and no plot."""
    try:
        import matplotlib
    except ImportError as e:
        log(f"warning: no plots ({e}); pip install matplotlib (or the [examples] extra) and "
            f"the monitor files in {output_dir} can be plotted later")
        return []
    matplotlib.use("Agg")
    paths = [os.path.join(output_dir, name) for name in PLOTS]
    plot_series(output_dir, paths[0])
    plot_speed(output_dir, paths[1])
    return paths


def read_series(output_dir, name):
    """(x, y) arrays of monitor ``name`` in ``output_dir`` (empty when there is no file)."""
    file = series_path(output_dir, name)
    rows = np.loadtxt(file, ndmin=2) if os.path.exists(file) else np.zeros((0, 2))
    return rows[:, 0], rows[:, 1]


def plot_speed(output_dir, path):
    """Write a PNG of the learning rate and of the measured vs the planner's predicted
    images/s per step."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(7, 5.5))
    axes[0].plot(*read_series(output_dir, "lr"))
    axes[0].set(ylabel="learning rate", xlabel="step")
    axes[1].plot(*read_series(output_dir, "images_per_sec"), label="measured", alpha=0.7)
    predicted = read_series(output_dir, "predicted_images_per_sec")
    if len(predicted[0]):
        axes[1].step(*predicted, where="post", label="predicted (planner)")
    axes[1].set(ylabel="images/s", xlabel="step")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_series(output_dir, path):
    """Write a PNG of loss, accuracy and global batch from the monitor files in output_dir."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=False)
    axes[0].plot(*read_series(output_dir, "train_loss"))
    axes[0].set(ylabel="train loss", xlabel="step")
    for name in ("val_top1", "val_top5"):
        axes[1].plot(*read_series(output_dir, name), marker="o", label=name)
    axes[1].set(ylabel="accuracy", xlabel="epoch", ylim=(0, 1))
    axes[1].legend()
    axes[2].step(*read_series(output_dir, "global_batch"), where="post")
    axes[2].set(ylabel="global batch (images)", xlabel="step")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
