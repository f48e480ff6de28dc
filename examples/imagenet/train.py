"""Data-parallel ImageNet training with nnabla and the nnabla-torus communicator.

With no arguments it builds (once, cached) a small ImageNet-layout dataset from scikit-learn's
handwritten digits and trains a small ResNet-18 on it with the ``digits-cpu`` recipe, through
the same code path as ImageNet: DALI input sharded by rank, torus all-reduce overlapped with
backward, the batch-size controller, the planner, checkpoints. Launch commands:

    # any machine, no data: 4 ranks on the CPU (>= 95 % val top-1 in a few minutes)
    mpirun -np 4 python examples/imagenet/train.py
    # plain ResNet-50, 90 epochs, 8 GPUs (recipes/resnet50-90ep.yaml)
    mpirun -np 8 python examples/imagenet/train.py --data-dir /data/imagenet --context cudnn
    # Sony's 224-second recipe (v1): batch 34K -> 68K, FP16, LARS (recipes/sony-224s.yaml;
    # v2 adds label smoothing: -C sony-122s)
    mpirun -np 2176 python examples/imagenet/train.py -C sony-224s --data-dir /data/imagenet
    # continue the run in --output-dir from its newest intact checkpoint (any rank count)
    mpirun -np 4 python examples/imagenet/train.py --resume 1
    # elastic (docs/elastic.md): relaunched on 1, 2, then 4 ranks as the batch grows
    nnabla-torus-run --slots 4 --ranks-schedule 0:1,2:2,4:4 -- \
        python examples/imagenet/train.py --batch-schedule 0:32,2:64,4:128

``--data-dir`` holds ``train/<wnid>/*.JPEG``, ``val/`` and the ``path label`` lists
``train.txt`` / ``val.txt`` (nnabla-examples' layout). Every knob is a flag, an environment
variable and a recipe key (``python train.py --help``; precedence CLI > recipe > env > default).
With ``--plan auto`` (default) and ``--algorithm auto`` (default) the planner chooses the
all-reduce algorithm and grid from a cluster profile (``--profile``; default ``cpu-2core`` on
a CPU, ``abci`` otherwise) at each global batch, and logs the rank count that profile would
be fastest with; an explicit ``--algorithm`` or ``--grid`` is kept and only advised on.
The last line on rank 0 is a JSON summary (val_top1, val_top5, images_per_sec, wall_s, ...;
strict JSON: null where a value is missing). Only rank 0 logs, except errors; progress is a
tqdm bar when stderr is a terminal, else a line every ``--log-every`` steps. Undecodable
training images are skipped and named at the epoch end (``--bad-images stop`` ends the job
naming the file instead); labels outside the class set are refused (training) or left out of
the accuracy with a warning (validation).
Rank 0 writes the monitors (``*.series.txt``), ``training.png``, the checkpoints and, at the
end, the model as nnabla users deploy it (``model.h5`` from nn.save_parameters, ``model.nnp``
for ``nnabla_cli infer`` and the C++ runtime; ``--init-params model.h5`` starts a run from it) to
``--output-dir``; ``--resume`` reads them on every rank, so on several hosts put it on a
shared file system. A checkpoint resumes on another rank count with the same global batch and
data position (resize.py); with ``--elastic 1`` (set by ``nnabla-torus-run``) the script exits
with status 75 after a checkpoint when the planner says another rank count pays for the new
batch phase, and with 76 after a checkpoint on SIGUSR1 (the launcher's Ctrl-C).
"""
import json
import logging
import math
import os
import signal
import sys
import time

# nnabla calls logging.basicConfig(level=INFO) at import (nnabla/logger.py, line 91 at v1.39.0):
# "Initializing CPU extension..." on every rank, and every library's INFO lines (matplotlib's)
# after it. A root handler configured first makes that call a no-op.
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.solvers as S
from nnabla.ext_utils import get_extension_context
from nnabla.monitor import Monitor, MonitorSeries

import nnabla_torus as C
from nnabla_torus.launching import elastic
from nnabla_torus.comm.communicator import DEFAULTS
from nnabla_torus.planning.controller import BatchPlan
from nnabla_torus.loss_scaling import DynamicLossScaling
from nnabla_torus.planning.costmodel import ALGORITHMS
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from nnabla_torus.overlap import BucketedAllReduce, overlaps_backward
from nnabla_torus.planning.schedules import BatchSchedule
from nnabla_torus.comm.topology import Grid, parse_grid

import data
import digits
import resize
from checkpoint import (CheckpointError, check_model, checkpoint_path, checkpoint_step,
                        load_latest_checkpoint, read_checkpoint, remove_stale_temporaries,
                        save_checkpoint)
from config import build_schedules, parse_config
from models import get_model, is_bn_or_bias
from planning import RunPlanner

SERIES = ("train_loss", "train_error", "lr", "global_batch", "images_per_sec", "val_top1",
          "val_top5", "noise_scale")     # noise_scale: B_simple (samples), adaptive runs only
EPOCH_SERIES = ("val_top1", "val_top5")     # indexed by epoch; the others by optimizer step


# ----------------------------------------------------------------------------------------------
# set-up: context, communicator, data, model, solvers

def cuda_environment(cfg):
    """Variables nnabla-ext-cuda reads once, when get_extension_context imports it: TF32.

    nnabla sets NVIDIA_TF32_OVERRIDE=0 (full FP32 convolutions even on A100/H100) unless
    NNABLA_CUDA_ALLOW_TF32 is set and not "0" (ext ``src/nbla/cuda/init.cpp.tmpl`` ~76-83),
    so the recipe key must be turned into that variable before the context is made."""
    return {"NNABLA_CUDA_ALLOW_TF32": "1" if cfg.allow_tf32 else "0"}


def make_context_and_comm(cfg, log_all):
    """Return (ctx, comm, type_config) with the device chosen by the rank's local index."""
    type_config = cfg.type_config
    if cfg.context == "cpu" and type_config == "half":
        type_config = "float"          # nnabla's CPU extension has no FP16 kernels
        log_all("type_config half needs a CUDA context; this CPU run trains in fp32 (with "
                "the FP16 dynamic loss scaling, so that code path runs)")
    os.environ.update(cuda_environment(cfg))
    ctx = get_extension_context(cfg.context, device_id="0", type_config=type_config)
    if cfg.elastic:
        from mpi4py import MPI
        cfg.grid, note = resize.fit_grid(cfg.grid, MPI.COMM_WORLD.size)
        if note:
            log_all(note)
    # auto starts on the communicator's default; the planner switches before the first step.
    algorithm = DEFAULTS["algorithm"] if cfg.algorithm == "auto" else cfg.algorithm
    comm = C.MultiProcessDataParallelCommunicator(ctx, algorithm=algorithm, grid=cfg.grid or None)
    comm.init()
    ctx.device_id = str(comm.local_rank)
    nn.set_default_context(ctx)
    return ctx, comm, type_config


def open_datasets(cfg, log):
    """Return (train_set, val_set); the embedded digits data when no --data-dir is given."""
    root = cfg.data_dir or digits.ensure_digits_dataset()
    train_set = data.read_dataset(os.path.join(root, "train"), os.path.join(root, "train.txt"))
    val_set = data.read_dataset(os.path.join(root, "val"), os.path.join(root, "val.txt"),
                                num_classes=train_set.num_classes)
    count, first = val_set.outside
    if count:
        log(f"warning: {count} validation image(s) have a label outside the "
            f"{train_set.num_classes} training classes (first: {first}); they are left out of "
            f"val top-1/top-5")
    if cfg.train_images:
        # A seeded subset mixes the classes (the list is ordered by class folder).
        keep = np.sort(np.random.default_rng(cfg.seed).permutation(len(train_set))
                       [:cfg.train_images])
        train_set = data.Dataset(train_set.root, [train_set.files[i] for i in keep],
                                 train_set.labels[keep])
    return train_set, val_set


class TrainStream:
    """Endless per-rank training batches, epoch after epoch, at a changeable batch size.

    ``epoch()`` is fractional: loader epoch + share of the epoch consumed, the same on every
    rank. A new batch size continues the current epoch at ``loader.position``; an epoch begun
    on another world size continues in its resharded order (``resize.EpochLayout``).
    """

    def __init__(self, train_set, cfg, comm, device_id, state=None, dtype="float"):
        self.layout = resize.EpochLayout(len(train_set), cfg.seed, comm.size, state)
        threads = data.threads_per_rank(comm.local_size)
        self.make = lambda **kw: data.make_loader(
            train_set, rank=comm.rank, size=comm.size, train=True, image_size=cfg.image_size,
            seed=cfg.seed, device_id=device_id, num_threads=threads,
            crop_scale=(cfg.min_crop_area, 1.0),
            flip=cfg.flip, on_bad=cfg.bad_images, dtype=dtype, order=self.layout.order, **kw)
        self.loader = self.make(batch_size=state["batch_size"], resume=state) if state else None

    def epoch(self):
        if self.loader is None:
            return 0.0
        return self.loader.epoch + self.layout.fraction(self.loader.position)

    def at_epoch_end(self):
        return self.loader is not None and self.loader.position >= self.layout.per_rank

    def state(self):
        """Data position for the checkpoint (at an epoch end: the start of the next one)."""
        if self.loader is None:
            return None
        if self.at_epoch_end():
            return {"epoch": self.loader.epoch + 1, "start_image": 0,
                    "batch_size": self.loader.batch_size, "consumed_steps": 0}
        return dict(self.loader.state(), **self.layout.state())

    def next_batch(self, batch_size):
        if self.loader is None:
            self.loader = self.make(batch_size=batch_size, epoch=0)
        elif self.at_epoch_end():
            self.layout.start(self.loader.epoch + 1)
            self.loader = self.make(batch_size=batch_size, epoch=self.loader.epoch + 1)
        elif self.loader.batch_size != batch_size:
            self.loader = self.make(batch_size=batch_size, epoch=self.loader.epoch,
                                    start_image=self.loader.position)
        return next(self.loader)


def build_graph(model, batch_size, image_size, label_smoothing, accum_steps, test=False):
    """Return (x, t, loss, objective, logits); objective = loss / accum_steps (what backward sees)."""
    x = nn.Variable((batch_size, 3, image_size, image_size))
    t = nn.Variable((batch_size, 1))
    logits = model(x, test=test)
    logits.persistent = True                 # read after forward(clear_no_need_grad=True)
    # Label smoothing: (1 - eps) * cross-entropy + eps * mean over classes of -log p.
    ce = F.softmax_cross_entropy(logits, t)
    if label_smoothing > 0:
        uniform = -F.mean(F.log_softmax(logits, axis=1), axis=1, keepdims=True)
        ce = (1.0 - label_smoothing) * ce + label_smoothing * uniform
    loss = F.mean(ce)
    loss.persistent = True
    objective = loss * (1.0 / accum_steps)   # accumulated micro-batch gradients average
    return x, t, loss, objective, logits


class SolverGroup:
    """Two nnabla solvers as one: weight decay (and LARS) only for conv/affine weights.

    BN parameters and biases get plain momentum and no decay (Jia et al. 2018) unless
    ``cfg.no_decay_bn_bias`` is off (then every parameter is in the first). Duck-types
    the solver methods that DynamicLossScaling and the loop call.
    """

    def __init__(self, cfg, params):
        exempt = is_bn_or_bias if cfg.no_decay_bn_bias else (lambda name: False)
        decayed = {k: v for k, v in params.items() if not exempt(k)}
        plain = {k: v for k, v in params.items() if exempt(k)}
        main = S.Lars(cfg.base_lr, cfg.momentum, cfg.lars_coefficient) \
            if cfg.optimizer == "lars" else S.Momentum(cfg.base_lr, cfg.momentum)
        main.set_parameters(decayed)
        other = S.Momentum(cfg.base_lr, cfg.momentum)
        other.set_parameters(plain)
        self.solvers = {"decayed": main, "plain": other}

    def _each(self, method, *args):
        for solver in self.solvers.values():
            getattr(solver, method)(*args)

    def set_learning_rate(self, lr):
        self._each("set_learning_rate", lr)

    def zero_grad(self):
        self._each("zero_grad")

    def scale_grad(self, scale):
        self._each("scale_grad", scale)

    def update(self):
        self._each("update")

    def weight_decay(self, rate):
        self.solvers["decayed"].weight_decay(rate)

    def check_inf_or_nan_grad(self):
        return any(s.check_inf_or_nan_grad() for s in self.solvers.values())

    def state_arrays(self):
        """Solver states as (name -> ndarray, name -> step count t)."""
        arrays, steps = {}, {}
        for group, solver in self.solvers.items():
            for name, state in solver.get_states().items():
                steps[f"{group}/{name}"] = state.t
                for key, var in state.pstate.items():
                    arrays[f"solver/{group}/{name}/{key}"] = var.d.copy()
        return arrays, steps

    def load_state_arrays(self, arrays, steps):
        for group, solver in self.solvers.items():
            states = solver.get_states()
            for name, state in states.items():
                state.t = steps[f"{group}/{name}"]
                for key, var in state.pstate.items():
                    var.d = arrays[f"solver/{group}/{name}/{key}"]
            solver.set_states(states)


# ----------------------------------------------------------------------------------------------
# the steps: train, validate, checkpoint

def train_step(stream, graph, plan, solvers, comm, grads, reducer, scaler):
    """One step's gradients over plan.accum_steps micro-batches; returns (loss, error) means.

    The gradients are all-reduced on return; with ``scaler`` (FP16) they are still multiplied
    by ``scaler.scale``: ``scaler.unscale(solvers)`` decides whether the update may run.
    """
    x, t, loss, objective, logits = graph
    sums = None                       # (loss, top-1 error) summed over micro-batches, on device
    solvers.zero_grad()
    for micro in range(plan.accum_steps):
        images, t.d = stream.next_batch(plan.local_batch)
        data.feed(x, images)          # on a GPU: device to device, in the compute dtype
        objective.forward(clear_no_need_grad=True)
        # Kept on the device and read once after the step: reading loss.d or logits.d here
        # would wait for the forward to finish before backward is even enqueued.
        step = (loss.data, F.mean(F.top_n_error(logits.data, t.data, axis=1, n=1)))
        sums = step if sums is None else tuple(F.add2(a, b) for a, b in zip(sums, step))
        reduce_now = reducer if micro == plan.accum_steps - 1 else None
        if scaler is not None:                                 # FP16: seeded with the scale
            scaler.backward(objective, reduce_now, clear_buffer=True)
        elif reduce_now is not None:
            reduce_now.backward(objective, clear_buffer=True)  # all-reduce overlaps backward
        else:
            objective.backward(clear_buffer=True)              # accumulate locally
    if reducer is None:
        comm.all_reduce(grads, division=True, inplace=False)
    return tuple(float(total.data) / plan.accum_steps for total in sums)


def validate(val_set, model, cfg, comm, device_id, log, dtype="float"):
    """Return (top1, top5) accuracy over the whole validation set (all ranks' shards summed).

    Undecodable images are left out and counted in the log (``--bad-images skip``) or raise
    BadImageError (``stop``).
    """
    batch = min(cfg.local_batch, math.ceil(len(val_set) / comm.size))
    x = nn.Variable((batch, 3, cfg.image_size, cfg.image_size))
    logits = model(x, test=True)
    counts = np.zeros(4, np.float32)              # correct top-1, correct top-5, images, bad
    loader = data.make_loader(val_set, batch, comm.rank, comm.size, train=False,
                              image_size=cfg.image_size, device_id=device_id,
                              on_bad=cfg.bad_images, dtype=dtype)
    for images, labels in loader:
        data.feed(x, images)
        logits.forward(clear_buffer=True)
        valid = labels[:, 0] >= 0
        top5 = np.argsort(-logits.d, axis=1)[:, :5]
        hits = top5 == labels
        counts[:3] += [hits[valid, 0].sum(), hits[valid].any(axis=1).sum(), valid.sum()]
    counts[3] = loader.skipped()
    comm.allreduce_numpy(counts)
    if counts[3]:
        log(f"warning: {int(counts[3])} undecodable validation image(s) left out of the accuracy")
    return (counts[0] / counts[2], counts[1] / counts[2]) if counts[2] else (None, None)


def share_bad_images(dataset, comm, reported, log, epoch):
    """Merge every rank's undecodable training images into ``dataset.bad`` (collective); log them.

    A rank skips a bad image the moment it meets one (its step count stays the same); here, at
    the epoch end, the others learn of it so that later epochs leave it out without a retry.
    ``reported``: the indices logged before (updated). Logs the count and the new names.
    """
    total = comm.allreduce_numpy(np.array([len(dataset.bad)], np.float32))[0]
    if total != len(reported) * comm.size:          # some rank found a new one
        mask = np.zeros(len(dataset), np.float32)
        mask[list(dataset.bad)] = 1
        dataset.bad.update(np.flatnonzero(comm.allreduce_numpy(mask)).tolist())
    new = sorted(dataset.bad - reported)
    reported.update(new)
    if reported:
        log(f"epoch {epoch:.2f}: {len(reported)} undecodable training image(s) left out" +
            (f"; new: {', '.join(dataset.files[i] for i in new)}" if new else ""))


def average_running_stats(comm):
    """Average BN running mean/var over ranks so every rank evaluates and saves one model."""
    trainable = set(nn.get_parameters().keys())
    stats = [v.data for k, v in nn.get_parameters(grad_only=False).items() if k not in trainable]
    if stats:
        comm.all_reduce(stats, division=True, inplace=False)


def export_model(model, image_size, output_dir, log):
    """Write the final model as nnabla users deploy it: ``model.h5`` (nn.save_parameters, BN
    statistics included) and ``model.nnp`` (nnabla.utils.save: the inference graph, batch 1,
    input ``x`` of 3 x size x size, output ``y`` = logits, executor ``runtime``: the format
    ``nnabla_cli infer -c model.nnp -o out x.bin`` and nnabla's C++ runtime read)."""
    from nnabla.utils.save import save
    nn.save_parameters(os.path.join(output_dir, "model.h5"),
                       nn.get_parameters(grad_only=False))
    x = nn.Variable((1, 3, image_size, image_size))
    y = model(x, test=True)
    save(os.path.join(output_dir, "model.nnp"), {
        "networks": [{"name": "runtime", "batch_size": 1, "outputs": {"y": y},
                      "names": {"x": x}}],
        "executors": [{"name": "runtime", "network": "runtime", "data": ["x"],
                       "output": ["y"]}]})
    log(f"model written: {output_dir}/model.h5 and model.nnp (start another run from it with "
        f"--init-params {output_dir}/model.h5)")


def load_initial_parameters(path, log):
    """Overwrite every parameter of the model (BN statistics included) with the one of the
    same name in ``path`` (.h5, .protobuf or .nnp, as nn.load_parameters reads them); a
    ValueError names the parameters missing from the file or of another shape."""
    scope = "init_params"
    with nn.parameter_scope(scope):
        nn.load_parameters(path)
        loaded = nn.get_parameters(grad_only=False)
    model = {k: v for k, v in nn.get_parameters(grad_only=False).items()
             if not k.startswith(scope + "/")}
    missing = [k for k in model if k not in loaded]
    shapes = [f"{k} {tuple(loaded[k].shape)} (model {tuple(v.shape)})"
              for k, v in model.items() if k in loaded and loaded[k].shape != v.shape]
    problems = []
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        problems.append(f"missing {', '.join(missing[:5])}{more}")
    if shapes:
        problems.append(f"other shapes: {', '.join(shapes[:5])}")
    if problems:
        raise ValueError(f"--init-params {path} does not fit the model: {'; '.join(problems)} "
                         f"(use a file saved with the same --arch, --width and classes)")
    for name, variable in model.items():
        variable.d = loaded[name].d
    with nn.parameter_scope(scope):
        nn.clear_parameters()
    log(f"started from the parameters in {path} ({len(model)} arrays)")


def write_checkpoint(cfg, comm, solvers, step, stream, ctrl, noise, extra):
    """Save params, solver states, step, data position and controller state (rank 0 writes)."""
    average_running_stats(comm)
    if comm.rank != 0:
        return
    arrays = {f"param/{k}": v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()}
    solver_arrays, solver_steps = solvers.state_arrays()
    arrays.update(solver_arrays)
    meta = dict(extra, step=step, ranks=comm.size, solver_steps=solver_steps,
                loader=stream.state(),
                plan=list(ctrl.current) if ctrl.current else None,
                noise={k: (v.tolist() if isinstance(v, np.ndarray) else v)
                       for k, v in vars(noise).items()} if noise else None)
    save_checkpoint(cfg.output_dir, step, arrays, meta)


def load_agreed_checkpoint(directory, comm, log):
    """(arrays, meta, path) of the checkpoint rank 0 finds newest and intact, on every rank.

    On a shared file system that lags, ranks could see different newest files and then
    issue mismatched collectives: rank 0 chooses, every other rank reads exactly that file.
    Raises on every rank when rank 0 finds none or any rank cannot read rank 0's choice.
    """
    found, error = None, None
    if comm.rank == 0:
        try:
            found = load_latest_checkpoint(directory, log=log)
        except (FileNotFoundError, CheckpointError) as e:
            error = e
    # Two float32 halves carry any step exactly (float32 is exact only below 2**24).
    sent = nn.NdArray.from_numpy_array(np.array(
        divmod(checkpoint_step(found[2]) if found else -1, 1 << 20), np.float32))
    comm.bcast([sent], src=0, inplace=True)
    high, low = (int(v) for v in sent.data)
    step = high * (1 << 20) + low
    if step < 0:
        raise error or CheckpointError(f"--resume: rank 0 found no intact checkpoint in "
                                       f"{directory} (its log says why)")
    path = checkpoint_path(directory, step)
    if comm.rank != 0:
        try:
            found = (*read_checkpoint(path), path)
        except (OSError, CheckpointError) as e:
            error = e
    failed = comm.allreduce_numpy(np.array([error is not None], np.float32))[0]
    if failed:
        raise CheckpointError(f"--resume: {int(failed)} rank(s) could not read {path}, the "
                              f"newest intact checkpoint on rank 0" +
                              (f" ({error})" if error else "") + "; make --output-dir the same "
                              f"shared folder on every host, or wait until every host sees it")
    return found


def restore_checkpoint(cfg, comm, solvers, ctrl, noise, log, model_meta):
    """Load the newest intact checkpoint; return its meta (the loop continues from it).

    Raises ValueError on every rank when it was written for another model. A checkpoint of
    another world size resumes with the global batch split anew and the rest of the epoch
    resharded (resize.py).
    """
    arrays, meta, path = load_agreed_checkpoint(cfg.output_dir, comm, log)
    params = nn.get_parameters(grad_only=False)
    note = check_model(meta, path, model_meta,
                       {f"param/{k}": v.shape for k, v in params.items()}, arrays)
    if note:
        log(note)
    for name, var in params.items():
        var.d = arrays[f"param/{name}"]
    solvers.load_state_arrays(arrays, meta["solver_steps"])
    saved_ranks = meta.get("ranks", comm.size)
    if meta["plan"] and saved_ranks != comm.size:
        old = BatchPlan(*meta["plan"])
        ctrl.current, message = resize.resplit(meta["plan"], comm.size, ctrl.max_local_batch,
                                               ctrl.lr_factor)
        meta["loader"] = resize.resized_loader_state(
            meta["loader"], saved_ranks, old.local_batch * old.accum_steps, comm.size,
            ctrl.current)
        meta["comm"] = None          # the planner's grid was for the old size: plan anew
        log(f"checkpoint {path} was written by {saved_ranks} ranks, this run has {comm.size}: "
            + message)
    elif meta["plan"]:
        ctrl.current = BatchPlan(*meta["plan"])
    if noise and meta["noise"] and len(meta["noise"]["_sums"]) != len(noise._sums):
        log("resume: the checkpoint's noise-scale state is of an older format (no error "
            "estimate): the noise scale is measured anew")
    elif noise and meta["noise"]:
        for key, value in meta["noise"].items():
            setattr(noise, key, np.array(value) if key == "_sums" else value)
    log(f"resumed from {path}: step {meta['step']}, epoch {meta['epoch']:.3f}")
    return meta


# ----------------------------------------------------------------------------------------------
# monitors and the final plot

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
    monitors = {name: MonitorSeries(name, monitor, interval=1, verbose=False) for name in SERIES}
    for name, lines in kept.items():
        with open(series_path(cfg.output_dir, name), "a") as f:
            f.writelines(lines)
    return monitors


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


def plot_series(output_dir, path):
    """Write a PNG of loss, accuracy and global batch from the monitor files in output_dir."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def read(name):
        file = series_path(output_dir, name)
        rows = np.loadtxt(file, ndmin=2) if os.path.exists(file) else np.zeros((0, 2))
        return rows[:, 0], rows[:, 1]

    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=False)
    axes[0].plot(*read("train_loss"))
    axes[0].set(ylabel="train loss", xlabel="step")
    for name in ("val_top1", "val_top5"):
        axes[1].plot(*read(name), marker="o", label=name)
    axes[1].set(ylabel="accuracy", xlabel="epoch", ylim=(0, 1))
    axes[1].legend()
    axes[2].step(*read("global_batch"), where="post")
    axes[2].set(ylabel="global batch (images)", xlabel="step")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# main

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
            print(f"step {step}: {seen:,}/{self.total:,} images ({seen / self.total:.1%}), "
                  f"loss {loss:.4f}, lr {lr:.3g}, global batch {batch}, "
                  f"{time.time() - self.tic:.0f} s", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


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


def main(argv=None):
    cfg = parse_config(argv)
    t_start = time.time()
    messages = []
    progress = None

    def log(text):
        if rank0 and progress is not None:
            progress.write(text)
        elif rank0:
            print(text, flush=True)

    from mpi4py import MPI                 # the communicator starts MPI anyway
    rank0 = MPI.COMM_WORLD.rank == 0
    configure_logging(MPI.COMM_WORLD.rank, log)
    ctx, comm, type_config = make_context_and_comm(cfg, messages.append)
    for text in messages:
        log(text)
    log(cfg.describe())
    device_id = None if cfg.context == "cpu" else comm.local_rank

    train_set, val_set = open_datasets(cfg, log)
    model = get_model(cfg.arch, train_set.num_classes, cfg.width, stride_on=cfg.stride_on,
                      zero_init_last_gamma=cfg.zero_init_last_gamma)
    nn.seed(cfg.seed)
    build_graph(model, 1, cfg.image_size, 0.0, 1)               # create the parameters
    if cfg.init_params and not cfg.resume:
        load_initial_parameters(os.path.expanduser(cfg.init_params), log)
    params = nn.get_parameters()
    comm.bcast([v.data for v in nn.get_parameters(grad_only=False).values()], src=0,
               inplace=True)                                   # one initial model everywhere
    grads = [v.grad for v in params.values()]
    solvers = SolverGroup(cfg, params)
    noise = NoiseScaleEstimator() if cfg.adaptive_batch else None
    comm.track_sqnorms = noise is not None
    run_planner = None if cfg.plan == "off" else RunPlanner.from_config(
        cfg, sum(v.size for v in params.values()), comm.size, len(train_set),
        applies=cfg.algorithm == "auto" and not cfg.grid, ranks_per_host=comm.hosts.ranks_per_host)
    # What runs: the planner's choice, logged at each global batch, or the one set here.
    all_reduce = (f"all-reduce: the planner's choice for profile {run_planner.prof.name} at "
                  f"each global batch" if run_planner is not None and run_planner.applies else
                  f"all-reduce {comm.algorithm} on grid {comm.grid}")
    log(f"{cfg.arch} x{cfg.width}: {sum(v.size for v in params.values()):,} parameters, "
        f"{len(train_set)} training / {len(val_set)} validation images, "
        f"{train_set.num_classes} classes; {comm.size} ranks, {all_reduce}")
    # Adaptive batch: goodput with this run's predicted throughput (flat with --plan off).
    ctrl, lr_schedule = build_schedules(
        cfg, comm.size, noise, throughput=run_planner and run_planner.throughput,
        model_error=run_planner and run_planner.model_error)

    step, images_seen, train_time, history = 0, 0, 0.0, []
    loader_state, resumed_at, loss_scale = None, None, cfg.loss_scale
    model_meta = dict(arch=cfg.arch, width=cfg.width, classes=train_set.num_classes,
                      image_size=cfg.image_size, recipe=cfg.recipe)
    if rank0:
        remove_stale_temporaries(cfg.output_dir, log)
    if cfg.resume:
        meta = restore_checkpoint(cfg, comm, solvers, ctrl, noise, log, model_meta)
        step, images_seen, train_time = meta["step"], meta["images_seen"], meta["train_time"]
        history, loader_state = meta["history"], meta["loader"]
        resumed_at = (step, meta["epoch"])
        loss_scale = meta["loss_scale"] or loss_scale
        if run_planner is not None and run_planner.applies and meta.get("comm"):
            comm.set_algorithm(*meta["comm"])     # the planner's choice in force at the checkpoint
            run_planner.settled = True
    stream = TrainStream(train_set, cfg, comm, device_id, loader_state, dtype=type_config)
    advisor = None if run_planner is None else resize.ResizeAdvisor(
        run_planner, BatchSchedule.parse(cfg.batch_schedule), cfg.adaptive_batch, cfg.epochs,
        len(train_set), comm.size)
    if cfg.elastic and advisor is None:
        log(f"elastic: --plan off leaves no planner to choose rank counts: the run keeps "
            f"{comm.size} ranks (use --plan auto)")
    stop_signal = []
    if cfg.elastic:          # the launcher's Ctrl-C: checkpoint at the end of this step
        signal.signal(signal.SIGUSR1, lambda signum, frame: stop_signal.append(signum))
    exit_status, request = 0, None
    monitors = make_monitors(cfg, comm.rank, resumed_at)
    # FP16: nnabla's dynamic loss scaling rules around the (overlapped) all-reduce.
    scaler = DynamicLossScaling(loss_scale) if cfg.type_config == "half" else None

    graph, graph_key, reducer = None, None, None
    top1 = top5 = None
    reported_bad = set()

    def checkpoint_extra():
        return dict(epoch=stream.epoch(), images_seen=images_seen, train_time=train_time,
                    history=history, seed=cfg.seed, loss_scale=scaler and scaler.scale,
                    comm=[comm.algorithm, str(comm.grid)], model=model_meta)
    if cfg.max_steps and step >= cfg.max_steps:
        log(f"nothing to train: the checkpoint is at step {step}, --max-steps is "
            f"{cfg.max_steps}; raise --max-steps to continue")
    if rank0:
        progress = Progress(round(cfg.epochs * len(train_set)),
                            round(stream.epoch() * len(train_set)), cfg.log_every, cfg.progress)

    while stream.epoch() < cfg.epochs and not (cfg.max_steps and step >= cfg.max_steps):
        epoch = stream.epoch()
        plan = ctrl.plan(epoch)
        if plan.changed:
            log(f"step {step}: {plan.reason}")
            history.append([round(epoch, 4), plan.global_batch])
        for note in ctrl.pop_notes() if noise is not None else ():
            log(f"step {step}: {note}")
        if run_planner is not None and plan.global_batch != run_planner.batch:
            replan(run_planner, plan, comm, log)
        if advisor is not None and advisor.due(plan, epoch):
            request = elastic_request(advisor, plan, epoch, cfg.elastic, log)
            if request is not None:
                exit_status = elastic.EXIT_RESIZE
                break
        if (plan.local_batch, plan.accum_steps) != graph_key:
            graph_key = (plan.local_batch, plan.accum_steps)
            if reducer is not None:
                reducer.close()          # its thread serves the old graph's buckets
                reducer = None
            graph = build_graph(model, plan.local_batch, cfg.image_size, cfg.label_smoothing,
                                plan.accum_steps)
            if cfg.overlap and not overlaps_backward(comm):
                log(f"overlap off: on the nccl backend only algorithm native overlaps on the "
                    f"device (nnabla's all_reduce_callback), without the noise scale; "
                    f"{comm.algorithm} enqueues every collective on the stream backward runs "
                    f"on: the gradients are all-reduced after backward")
            elif cfg.overlap:
                reducer = BucketedAllReduce(comm, graph[3], params, bucket_mib=cfg.bucket_mib,
                                            grad_bytes=2 if type_config == "half" else 4)
        lr = lr_schedule.lr(epoch) * plan.lr_factor
        solvers.set_learning_rate(lr)

        if noise is not None:
            comm.pop_sqnorms()          # drop what other all-reduces (BN statistics) added
        # FP16: the norms are of gradients times the loss scale in force for this step (an
        # overflowed, skipped step leaves inf in them: the estimator skips it).
        grad_scale = 1.0 if scaler is None else scaler.scale
        tic = time.time()
        loss, error = train_step(stream, graph, plan, solvers, comm, grads, reducer, scaler)
        if noise is not None:
            local_sqnorm, global_sqnorm = comm.pop_sqnorms()
            if comm.size > 1:
                noise.update(local_sqnorm / grad_scale ** 2, plan.local_batch * plan.accum_steps,
                             global_sqnorm / grad_scale ** 2, plan.global_batch)
        if scaler is None or scaler.unscale(solvers):
            solvers.weight_decay(cfg.weight_decay)
            solvers.update()
        else:
            log(f"step {step}: FP16 gradients overflowed, update skipped; loss scale now "
                f"{scaler.scale:g}")
        step += 1
        step_time = time.time() - tic
        train_time += step_time
        images_seen += plan.global_batch

        if monitors:
            for name, value in (("train_loss", loss), ("train_error", error), ("lr", lr),
                                ("global_batch", plan.global_batch),
                                ("images_per_sec", plan.global_batch / step_time)):
                monitors[name].add(step, value)
            if noise is not None and noise.b_simple is not None:
                monitors["noise_scale"].add(step, noise.b_simple)
        if progress is not None:
            progress.update(step, stream.epoch() * len(train_set), loss, lr, plan.global_batch)

        finished = stream.epoch() >= cfg.epochs or (cfg.max_steps and step >= cfg.max_steps)
        if math.floor(stream.epoch()) > math.floor(epoch) or finished:   # an epoch ended
            share_bad_images(train_set, comm, reported_bad, log, stream.epoch())
            average_running_stats(comm)
            top1, top5 = validate(val_set, model, cfg, comm, device_id, log, type_config)
            if monitors and top1 is not None:
                monitors["val_top1"].add(stream.epoch(), top1)
                monitors["val_top5"].add(stream.epoch(), top5)
            log(f"epoch {stream.epoch():.2f} step {step}: train loss {loss:.4f}, val top-1 "
                f"{json_value(top1)} top-5 {json_value(top5)}, "
                f"{images_seen / train_time:.0f} images/s")
        stopping = cfg.elastic and comm.allreduce_numpy(
            np.array([len(stop_signal)], np.float32))[0] > 0    # every rank stops together
        if finished or stopping or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
            write_checkpoint(cfg, comm, solvers, step, stream, ctrl, noise, checkpoint_extra())
        if stopping:
            log(f"step {step}: stopped on a signal; checkpoint written, resume with --resume 1")
            exit_status = elastic.EXIT_STOPPED
            break

    if reducer is not None:
        reducer.close()
    if progress is not None:
        progress.close()
    if exit_status == elastic.EXIT_RESIZE:
        write_checkpoint(cfg, comm, solvers, step, stream, ctrl, noise, checkpoint_extra())
        if rank0:
            print(elastic.REQUEST_PREFIX + json.dumps(request), flush=True)
    if exit_status:
        comm.barrier()               # rank 0's checkpoint is on disk before any rank exits
        comm.close()                 # NCCL communicators freed before the interpreter exits
        return exit_status
    wall = time.time() - t_start
    if rank0:
        export_model(model, cfg.image_size, cfg.output_dir, log)
        plot_series(cfg.output_dir, os.path.join(cfg.output_dir, "training.png"))
        print(json.dumps(strict_json({
            "val_top1": json_value(top1), "val_top5": json_value(top5),
            "epochs": round(stream.epoch(), 3), "steps": step,
            "images_per_sec": round(images_seen / max(train_time, 1e-9), 1),
            "wall_s": round(wall, 1), "ranks": comm.size, "algorithm": comm.algorithm,
            "grid": str(comm.grid),
            "batch_schedule": ",".join(f"{e:g}:{b}" for e, b in history),
            "plan": run_planner and run_planner.summary,
            "bad_images": len(reported_bad)})), flush=True)
    comm.close()                     # NCCL communicators freed before the interpreter exits


def elastic_request(advisor, plan, epoch, acting, log):
    """The launcher request for ``plan`` at ``epoch`` (dict), or None to go on as launched.

    Without --elastic (``acting`` False) the decision is only logged: what nnabla-torus-run
    would do here.
    """
    ranks, decision, note = advisor.decide(plan, epoch)
    move = decision.resize and ranks != advisor.size
    verb = "requesting a relaunch on" if acting else "nnabla-torus-run would relaunch on"
    log("elastic: " + (f"{verb} {ranks} ranks: " if move else "") + decision.reason
        + (f" ({note})" if note else ""))
    if not (acting and move):
        return None
    return {"ranks": ranks, "epoch": epoch, "global_batch": plan.global_batch,
            "reason": decision.reason, "gain_s": decision.gain_s,
            "restart_cost_s": decision.restart_cost_s}


def replan(run_planner, batch_plan, comm, log):
    """Plan for ``batch_plan`` and switch ``comm`` to rank 0's choice (collective)."""
    choice, lines = run_planner.replan(batch_plan, (comm.algorithm, str(comm.grid)))
    for line in lines:
        log(line)
    # Every rank planned the same; rank 0's choice is sent anyway so no rounding can split them.
    grid = parse_grid(choice[1]) if choice and choice[1] else None
    code = np.array([-1, 0, 0], np.float32) if choice is None else np.array(
        [ALGORITHMS.index(choice[0]), grid.x if grid else 0, grid.y if grid else 0], np.float32)
    sent = nn.NdArray.from_numpy_array(code)
    comm.bcast([sent], src=0, inplace=True)
    algorithm, x, y = (int(v) for v in sent.data)
    if algorithm >= 0:
        comm.set_algorithm(ALGORITHMS[algorithm], Grid(x, y) if x else None)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError, CheckpointError) as error:
        # A message, not a traceback; abort_job ends every rank even when only this one raised
        # (after sys.exit it would wait in MPI_Finalize while the others wait for it).
        from nnabla_torus.comm import failfast
        failfast.abort_job(f"train.py: error: {error}")
