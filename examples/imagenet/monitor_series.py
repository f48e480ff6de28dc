"""The monitor series of a run and the plots drawn from them (rank 0).

Files ``<output_dir>/<name>.series.txt``, one per name of ``SERIES``, in nnabla's
``MonitorSeries`` format ("index value" lines), kept up to the checkpoint on a resume and
written with ``write_series`` (at each checkpoint and at the end of the run); ``write_plots``
draws ``training.png`` (loss, accuracy, batch) and ``speed.png`` (learning rate, measured vs
predicted images/s) from them, or warns without matplotlib.
"""
import math
import os

import numpy as np

from nnabla_torus.files import atomic_open, atomic_path

SERIES = ("train_loss", "train_error", "lr", "global_batch", "images_per_sec", "val_top1",
          "val_top5", "noise_scale",     # noise_scale: B_simple (samples), adaptive runs only
          "predicted_images_per_sec")    # the planner's prediction for the plan in use
EPOCH_SERIES = ("val_top1", "val_top5")     # indexed by epoch; the others by optimizer step


class Series:
    """One monitor series: its rows in memory, its file rewritten whole by ``write``.

    Not nnabla's ``MonitorSeries``, which truncates the file when created and appends to it in
    place: a full disk or a kill then leaves a cut file, and a resumed run first empties the
    file of the run it continues. Here ``write`` renames a complete temporary over the file
    (``atomic_open``), so the file is always the previous whole one or the new whole one; its
    rows are a few bytes per step, so rewriting them at each checkpoint is cheap.
    """

    def __init__(self, path, rows=()):
        self.path, self.rows = path, list(rows)

    def add(self, index, value):
        """Add ``value`` at step or epoch ``index`` (one row per call)."""
        self.rows.append(f"{index} {float(value):g}\n")

    def write(self):
        with atomic_open(self.path, "w") as f:
            f.writelines(self.rows)


def make_monitors(cfg, rank, resumed_at=None):
    """Series per name (rank 0 only); on resume keep the rows up to the checkpoint.

    ``resumed_at``: (step, epoch) of the checkpoint. The files are not touched until
    ``write_series``.
    """
    if rank != 0:
        return None
    monitors = {}
    for name in SERIES:
        path, kept = series_path(cfg.output_dir, name), []
        if resumed_at and os.path.exists(path):
            limit = resumed_at[1] if name in EPOCH_SERIES else resumed_at[0]
            with open(path) as f:
                kept = [line for line in f if series_x(line) <= limit + 1e-9]
        monitors[name] = Series(path, kept)
    return monitors


def write_series(monitors):
    """Write every series' file whole (None: not rank 0); WriteError names a file that could
    not be written (its previous content kept)."""
    for series in (monitors or {}).values():
        series.write()


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
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=80)
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
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=80)
    plt.close(fig)
