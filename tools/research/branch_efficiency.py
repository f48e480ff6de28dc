"""The statistical efficiency of a larger batch measured inside one run, by branching from the
same weights: a check of what any efficiency model fitted within a run could see.

At each point ``--at`` (epochs) of a single-process run at ``--batch`` (default: the recipe's
first batch), the weights, BN statistics and momentum buffers are saved and two branches of
``--branch-epochs`` of images start from them: one at ``--batch``, one at ``--large-batch``
on the same images in the same order (the recipe's learning-rate schedule and scaling at each
batch; the momentum buffer as it is, or multiplied by the rate's ratio with ``--momentum-scale
rate``, Goyal et al.'s correction, arXiv:1706.02677, section 2.2, which the controller applies
at a batch change). The training
loss on a fixed set of ``--probe-images`` training images is read along the first branch and
at the end of the second. The efficiency of the large batch relative to the small one is the
images the small batch needed to reach the large branch's loss over the images the large branch
used: McCandlish et al.'s definition (arXiv:1812.06162, section 2.3), measured over one branch
instead of a whole run. From the first branch's end the run goes on at ``--batch``. Fixed runs
measure the ratio over whole runs instead (``time_to_accuracy.py efficiency``)::

    python tools/research/branch_efficiency.py -C clusters-mlp --large-batch 1024 --seed 1

One process, no MPI: a step at batch B is a data-parallel step of global batch B (BN
statistics aside, which data-parallel ranks take over their own images). The run is the
recipe's up to the last ``--at`` point: clusters' five branches take about 2 minutes here,
digits' about 3 and shapes' (6,400 probe images through a ResNet) about 12.
"""
import argparse
import math
from types import SimpleNamespace

import _tools  # noqa: F401  (tools/ on sys.path, for _example)
import _example  # noqa: F401  (examples/imagenet on sys.path)
import nnabla as nn
import numpy as np

import data
from config import build_schedules, parse_config
from models import get_model
from run_setup import open_datasets
from solvers import SolverGroup
from step import build_graph
from stream import TrainStream
from nnabla_torus.knobs import add_knob, number
from nnabla_torus.planning.schedules import BatchSchedule

CURVE_POINTS = 16    # probe-loss readings along the small batch's branch


def add_run_knobs(parser, env_prefix, at_default):
    """The single-process run's knobs, shared with hessian_noise_scale.py: the recipe, its
    batch, the points ``--at`` and the seed; env twins ``<env_prefix>_CONFIG`` and so on."""
    add_knob(parser, "--config", f"{env_prefix}_CONFIG", "clusters-mlp",
             "the recipe (train.py's -C)", short="-C")
    add_knob(parser, "--batch", f"{env_prefix}_BATCH", 0,
             "the run's batch (0: the recipe's first batch)", type=number(int, low=0))
    add_knob(parser, "--at", f"{env_prefix}_AT", at_default,
             "epochs of the run at which to measure, comma-separated, increasing")
    add_knob(parser, "--seed", f"{env_prefix}_SEED", 1, "the run's seed (weights, order)",
             type=number(int, low=0))


def check_run_knobs(parser, args):
    """``args.at`` as a list of epochs, or a parser error."""
    try:
        args.at = [float(v) for v in args.at.split(",")]
    except ValueError:
        parser.error(f"--at: comma-separated epochs, got {args.at!r}")
    if sorted(args.at) != args.at or args.at[0] < 0:
        parser.error(f"--at: epochs >= 0 in increasing order, got {args.at}")
    return args


def recipe_of(args, tool):
    """The recipe of ``args.config`` at ``args.seed``, and ``args.batch`` set to its first batch
    if 0; an unknown recipe or a bad value in one ends the tool in one line."""
    try:
        cfg = parse_config(["-C", args.config, "--seed", str(args.seed)])
    except ValueError as e:
        raise SystemExit(f"{tool}: error: {e}") from None
    args.batch = args.batch or BatchSchedule.parse(cfg.batch_schedule).batch(0)
    return cfg


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_knobs(parser, "NNABLA_TORUS_BRANCH", "0.43,0.84,1.25,1.66,2.07")
    add_knob(parser, "--large-batch", "NNABLA_TORUS_BRANCH_LARGE_BATCH", 1024,
             "the large branch's batch", type=number(int, low=1))
    add_knob(parser, "--branch-epochs", "NNABLA_TORUS_BRANCH_EPOCHS", 0.4096,
             "images per branch, in epochs of the training set (clusters: 32,768 images, 32 "
             "steps at 1024)",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--probe-images", "NNABLA_TORUS_BRANCH_PROBE_IMAGES", 8192,
             "training images whose mean loss measures progress (at most the training set)",
             type=number(int, low=1))
    add_knob(parser, "--momentum-scale", "NNABLA_TORUS_BRANCH_MOMENTUM_SCALE", "none",
             "the large branch's momentum buffer: as it is (none) or times the rates' ratio "
             "(rate, the controller's rule)", choices=("none", "rate"))
    return check_run_knobs(parser, parser.parse_args(argv))


def images_to_reach(curve, loss):
    """Images along ``curve`` [(images, loss), ...] (from 0) until its running minimum first
    reaches ``loss``, linearly interpolated; inf when it never does, 0 when it starts there."""
    best = [curve[0]]
    for images, value in curve[1:]:
        best.append((images, min(value, best[-1][1])))
    for (n0, l0), (n1, l1) in zip(best, best[1:]):
        if l1 <= loss:
            return n0 if l0 <= loss else n0 + (n1 - n0) * (l0 - loss) / (l0 - l1)
    return 0.0 if best[0][1] <= loss else math.inf


class Branches:
    """The single-process run, its saved states and the probe loss."""

    def __init__(self, cfg, args):
        self.cfg, self.args = cfg, args
        self.train_set, _ = open_datasets(cfg, print)
        self.images = len(self.train_set)
        if args.large_batch > self.images:
            raise SystemExit(f"branch_efficiency.py: error: --large-batch {args.large_batch} is "
                             f"larger than the {self.images} training images of {cfg.dataset}")
        self.model = get_model(cfg.arch, self.train_set.num_classes, cfg.width,
                               stride_on=cfg.stride_on,
                               zero_init_last_gamma=cfg.zero_init_last_gamma)
        nn.seed(cfg.seed)
        self.graphs = {}
        self.graph(args.batch)                            # creates the parameters
        self.solvers = SolverGroup(cfg, nn.get_parameters())
        batch, self.lr_schedule = build_schedules(cfg, SimpleNamespace(size=1))   # one process
        self.controller = batch.controller
        probe = min(args.probe_images, self.images)
        self.probe = next(data.make_loader(
            self.train_set, probe, train=True, image_size=cfg.image_size, seed=cfg.seed + 7919,
            crop_scale=(cfg.min_crop_area, 1.0), flip=cfg.flip, val_crop=cfg.val_crop))
        self.probe_graph = build_graph(self.model, probe, cfg.image_size, cfg.label_smoothing, 1)
        # the example's training stream, of one process
        self.stream = TrainStream(self.train_set, cfg,
                                  SimpleNamespace(rank=0, size=1, local_size=1), None)

    def graph(self, batch):
        if batch not in self.graphs:
            self.graphs[batch] = build_graph(self.model, batch, self.cfg.image_size,
                                             self.cfg.label_smoothing, 1)
        return self.graphs[batch]

    def step(self, batch, epoch, images_labels=None):
        """One step at ``batch`` on ``images_labels`` (default: the run's next batch); returns
        the epoch after it."""
        x, t, loss, objective, _ = self.graph(batch)
        x.d, t.d = (np.asarray(a).reshape(v.shape) for a, v in
                    zip(images_labels or self.next_batch(), (x, t)))
        self.solvers.zero_grad()
        objective.forward(clear_no_need_grad=True)
        objective.backward(clear_buffer=True)
        self.solvers.set_learning_rate(self.rate(batch, epoch))
        self.solvers.weight_decay(self.cfg.weight_decay)
        self.solvers.update()
        return epoch + batch / self.images

    def rate(self, batch, epoch):
        """The recipe's learning rate at ``batch`` and ``epoch`` (its schedule and scaling)."""
        return self.lr_schedule.lr(epoch) * self.controller.lr_factor(batch)

    def next_batch(self):
        """The run's next (images, labels) at ``--batch``."""
        return self.stream.next_batch(self.args.batch)

    def save(self):
        return weights(), self.solvers.state_arrays()

    def restore(self, saved, momentum=1.0):
        saved_weights, (arrays, steps) = saved
        set_weights(saved_weights)
        self.solvers.load_state_arrays(arrays, steps)
        self.solvers.scale_momentum(momentum)

    def probe_loss(self):
        """Mean training loss over the probe images; BN statistics left as they were."""
        saved = weights()
        x, t, loss, _, _ = self.probe_graph
        x.d, t.d = (np.asarray(a).reshape(v.shape) for a, v in zip(self.probe, (x, t)))
        loss.forward(clear_no_need_grad=True)
        set_weights(saved)
        return float(loss.d)


def weights():
    """A copy of every parameter, BN statistics included."""
    return {k: v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()}


def set_weights(saved):
    for k, v in nn.get_parameters(grad_only=False).items():
        v.d = saved[k]


def probe_at(run, epoch):
    """Both branches from the state at ``epoch``; returns (row dict, the epoch after the small
    branch, whose state is then in force)."""
    small, large, args = run.args.batch, run.args.large_batch, run.args
    per_large = large // small                  # small batches in one large one
    steps_large = max(1, round(args.branch_epochs * run.images / large))
    steps_small = steps_large * per_large
    start, start_loss = run.save(), run.probe_loss()
    curve, e, seen = [(0, start_loss)], epoch, []
    every = max(1, steps_small // CURVE_POINTS)
    for i in range(1, steps_small + 1):
        seen.append(run.next_batch())
        e = run.step(small, e, seen[-1])
        if i % every == 0 or i == steps_small:
            curve.append((i * small, run.probe_loss()))
    end_small = run.save()
    rate_ratio = run.controller.lr_factor(large) / run.controller.lr_factor(small)
    run.restore(start, rate_ratio if args.momentum_scale == "rate" else 1.0)
    e_large = epoch
    for i in range(steps_large):               # the same images in the same order
        group = seen[i * per_large:(i + 1) * per_large]
        e_large = run.step(large, e_large, tuple(np.concatenate(part) for part in zip(*group)))
    large_loss = run.probe_loss()
    run.restore(end_small)
    ratio = images_to_reach(curve, large_loss) / (steps_large * large)
    return {"epoch": epoch, "start_loss": start_loss, "small_loss": curve[-1][1],
            "large_loss": large_loss, "efficiency": ratio}, e


def main(argv=None):
    args = parse_args(argv)
    cfg = recipe_of(args, "branch_efficiency.py")
    if args.large_batch <= args.batch or args.large_batch % args.batch:
        raise SystemExit(f"branch_efficiency.py: error: --large-batch {args.large_batch} must "
                         f"be a multiple (> 1) of the run's batch {args.batch}: the large "
                         f"branch trains on the small branch's images")
    run = Branches(cfg, args)
    print(f"{args.config}, seed {args.seed}: branches of {args.branch_epochs:g} epochs at "
          f"{args.batch} and {args.large_batch} (momentum buffer: {args.momentum_scale}); "
          f"E = images {args.batch} needed for the loss {args.large_batch} reached / images "
          f"{args.large_batch} used")
    print("epoch | probe loss at the start | after the branch at "
          f"{args.batch} | after the branch at {args.large_batch} | E({args.large_batch}) / "
          f"E({args.batch})")
    epoch, rows = 0.0, []
    for at in args.at:
        while epoch < at:
            epoch = run.step(args.batch, epoch)
        row, epoch = probe_at(run, epoch)
        rows.append(row)
        print(f"{row['epoch']:.3f} | {row['start_loss']:.4f} | {row['small_loss']:.4f} | "
              f"{row['large_loss']:.4f} | {shown(row['efficiency'])}", flush=True)
    ratios = sorted(r["efficiency"] for r in rows)
    print(f"median E({args.large_batch}) / E({args.batch}) over {len(rows)} branches: "
          f"{shown(float(np.median(ratios)))} (range {shown(ratios[0])} to {shown(ratios[-1])})")
    return rows


def shown(efficiency):
    """E as "0.571", or "> 1" where the small branch never reached the large one's loss."""
    return "> 1" if math.isinf(efficiency) else f"{efficiency:.3f}"


if __name__ == "__main__":
    main()
