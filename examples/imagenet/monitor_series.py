"""The monitor series of a run and the plots drawn from them (rank 0).

nnabla's ``MonitorSeries`` files ``<output_dir>/<name>.series.txt``, one per name of
``SERIES``, kept up to the checkpoint on a resume; ``write_plots`` draws ``training.png``
(loss, accuracy, batch) and ``speed.png`` (learning rate, measured vs predicted images/s)
from them, or warns without matplotlib.
"""
import math
import os

import numpy as np
from nnabla.monitor import Monitor, MonitorSeries

SERIES = ("train_loss", "train_error", "lr", "global_batch", "images_per_sec", "val_top1",
          "val_top5", "noise_scale",     # noise_scale: B_simple (samples), adaptive runs only
          "predicted_images_per_sec")    # the planner's prediction for the plan in use
EPOCH_SERIES = ("val_top1", "val_top5")     # indexed by epoch; the others by optimizer step


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
