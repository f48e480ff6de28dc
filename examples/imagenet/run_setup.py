"""Set a training run up: the data, the model, the solvers, the planner and the schedules
(``set_up``), then the state a checkpoint holds, or a fresh start (``resume_or_start``).

The context and the communicator are run_context.py's; what ``run`` holds, run_state.py's;
the batch prior the controller starts from, run_prior.py's. Example (train.main does this)::

    run = set_up(cfg, log)       # collective: the communicator, one initial model everywhere
    resume_or_start(run)         # the step, data position, stream, monitors (--resume)
"""
import os

import numpy as np
import nnabla as nn

from nnabla_torus.loss_scaling import DynamicLossScaling
from nnabla_torus.planning import efficiency_fit
from nnabla_torus.planning.model_cost import count_cost
from nnabla_torus.planning.schedules import BatchSchedule
from nnabla_torus.training import State

import embedded
import image_lists
import report
import resize
from config import build_schedules
from divergence import GradientAbsSum
from models import get_model, load_initial_parameters
from run_checkpoint import RUN_FILES, restore_checkpoint
from run_context import make_context_and_comm
from run_prior import batch_prior
from run_state import Data, Network, Parallel, Planning, RunState, Settings
from solvers import SolverGroup
from step import build_graph
from stream import TrainStream
from training_planner import TrainingPlanner


def open_datasets(cfg, log):
    """Return (train_set, val_set); the embedded --dataset when no --data-dir is given."""
    root = (os.path.expanduser(cfg.data_dir) if cfg.data_dir
            else embedded.ensure_dataset(cfg.dataset))
    train_set = image_lists.read_dataset(*image_lists.split_source(root, "train"))
    val_set = image_lists.read_dataset(*image_lists.split_source(root, "val"),
                                       num_classes=train_set.num_classes,
                                       class_names=train_set.class_names)
    count, first = val_set.outside
    if count:
        log(f"warning: {count} validation image(s) have a label outside the "
            f"{train_set.num_classes} training classes (first: {first}); they are left out of "
            f"val top-1/top-5")
    if cfg.train_images:
        # A seeded subset mixes the classes (the list is ordered by class folder).
        keep = np.sort(np.random.default_rng(cfg.seed).permutation(len(train_set))
                       [:cfg.train_images])
        train_set = image_lists.Dataset(train_set.root, [train_set.files[i] for i in keep],
                                 train_set.labels[keep])
    check_batch_fits(cfg, len(train_set))
    return train_set, val_set


def check_batch_fits(cfg, images):
    """ValueError when a global batch of --batch-schedule that the run reaches (a phase that
    starts before --epochs), or adaptive's --min-batch, is larger than the training set: an
    epoch would be less than one step, its images repeated in it."""
    batches = [b for start, b in BatchSchedule.parse(cfg.batch_schedule).phases
               if start < cfg.epochs]
    largest = max(batches + ([cfg.min_batch] if cfg.adaptive_batch and cfg.min_batch else []))
    if largest > images:
        raise ValueError(f"global batch {largest} (--batch-schedule {cfg.batch_schedule}"
                         f"{f', --min-batch {cfg.min_batch}' if cfg.min_batch else ''}) is larger "
                         f"than the {images} training images: one step would repeat images "
                         f"within itself. Lower the batch, or train on more images")


def set_up(cfg, log):
    """Context, communicator, data, model (one initial model on every rank), solvers, planner
    and schedules, as the RunState the loop reads (``run``; run_state.py)."""
    messages = []
    ctx, comm, type_config = make_context_and_comm(cfg, messages.append)
    for text in messages + [cfg.describe()] + cfg.notes:
        log(text)
    settings = Settings(cfg=cfg, log=log, type_config=type_config,
                        device_id=None if cfg.context == "cpu" else comm.local_rank)
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
    n_params = sum(v.size for v in params.values())
    planner = None if cfg.plan == "off" else TrainingPlanner.from_config(
        cfg, n_params, comm.size, len(train_set),
        applies=cfg.algorithm == "planned" and not cfg.grid,
        ranks_per_host=comm.hosts.ranks_per_host,     # FLOPs of one image, from the graph:
        gflops_per_image=count_cost(model(nn.Variable((1, 3, cfg.image_size,
                                                       cfg.image_size)), False)).gflops_per_image)
    # What runs: the planner's choice, logged at each global batch, or the one set here.
    planned = planner is not None and planner.applies
    all_reduce = (f"all-reduce: the planner's choice for profile {planner.prof.name} at "
                  f"each global batch" if planned else
                  f"all-reduce {comm.algorithm} on grid {comm.grid}")
    log(f"{cfg.arch} x{cfg.width}: {n_params:,} parameters, {len(train_set)} training / "
        f"{len(val_set)} validation images, {train_set.num_classes} classes; "
        f"{report.ranks(comm.size)}, {all_reduce}")
    # The run's own step times, measured by the batch control (AdaptiveBatch): the planner
    # plans with them once fitted (take_step), and so does the adaptive batch's goodput (on
    # several ranks: before, with this run's predicted throughput); an adaptive run decides on
    # a prior (an earlier run's, or published) when there is one, before it has measured
    # (priors.Prior.starts: from step 0, or where the earlier run's estimate began).
    key = prior = None
    if cfg.adaptive_batch:
        key, prior = batch_prior(cfg, comm, planner, n_params, train_set, log)
    timed = planner is not None or (cfg.adaptive_batch and comm.size > 1)
    batch, lr_schedule = build_schedules(
        cfg, comm, throughput=planner and planner.throughput,
        model_error=planner and planner.model_error, prior=prior,
        epoch_images=len(train_set), refit_steps=cfg.adaptive_refit_steps if timed else 0,
        refit_warmup=cfg.adaptive_refit_warmup, compute_line=planner and planner.compute_line())
    if batch.controller.efficiency is not None:
        log(f"goodput: efficiency fitted to fixed runs ({cfg.efficiency_fit}): "
            + efficiency_fit.describe(batch.controller.efficiency))
    state = State(comm, cfg.output_dir, nn.get_parameters(grad_only=False), solvers.solvers,
                  run_files=RUN_FILES, announce=cfg.elastic, log=log)
    return RunState(settings, Parallel(comm), Data(train_set, val_set),
                    Network(model, params, grads, solvers, GradientAbsSum(grads)),
                    Planning(planner, batch, lr_schedule, prior_key=key), state)


def resume_or_start(run):
    """The run's state (step, images seen, history, data position, loss scale) from the
    checkpoint with --resume, else fresh (run_state.Progress's defaults); then the stream,
    elastic advisor, monitors, progress."""
    cfg, log = run.settings.cfg, run.settings.log
    comm, data, net, planning = run.parallel.comm, run.data, run.net, run.planning
    progress = run.progress
    loader_state, resumed_at, loss_scale = None, None, cfg.loss_scale
    net.model_meta = dict(arch=cfg.arch, width=cfg.width, classes=data.train_set.num_classes,
                          image_size=cfg.image_size, recipe=cfg.recipe)
    if cfg.resume:
        meta = restore_checkpoint(run)
        progress.step, progress.images_seen, progress.train_time = (
            meta["step"], meta["images_seen"], meta["train_time"])
        progress.history, loader_state = meta["history"], meta["loader"]
        progress.top1, progress.top5, progress.best_top1 = (
            meta.get("top1"), meta.get("top5"), meta.get("best_top1"))
        progress.noise_series = [tuple(p) for p in meta.get("noise_series") or []]
        resumed_at = (progress.step, meta["epoch"])
        loss_scale = meta["loss_scale"] or loss_scale
        if planning.planner is not None and planning.planner.applies and meta.get("comm"):
            comm.set_algorithm(*meta["comm"])    # the planner's choice in force at the checkpoint
            planning.planner.settled = True
    else:
        run.state.start(resume=False)
    data.stream = TrainStream(data.train_set, cfg, comm, run.settings.device_id, loader_state,
                              dtype=run.settings.type_config)
    planning.advisor = None if planning.planner is None else resize.ResizeAdvisor(
        planning.planner, BatchSchedule.parse(cfg.batch_schedule), cfg.adaptive_batch,
        cfg.epochs, len(data.train_set), comm.size)
    if cfg.elastic and planning.advisor is None:
        log(f"elastic: --plan off leaves no planner to choose rank counts: the run keeps "
            f"{report.ranks(comm.size)} (use --plan on)")
    progress.monitors = report.make_monitors(cfg, comm.rank, resumed_at)
    progress.epoch_meter = report.EpochMeter(data.stream.epoch())
    # FP16: nnabla's dynamic loss scaling rules around the (overlapped) all-reduce.
    # Its overflow check: one fused count read once a step, not one wait per parameter.
    run.parallel.scaler = (DynamicLossScaling(loss_scale, grads=net.grads, comm=comm)
                           if cfg.type_config == "half" else None)
    if cfg.max_steps and progress.step >= cfg.max_steps:
        log(f"nothing to train: the checkpoint is at step {progress.step}, --max-steps is "
            f"{cfg.max_steps}; raise --max-steps to continue")
    if comm.rank == 0:
        n = len(data.train_set)
        log.progress = report.Progress(round(cfg.epochs * n), round(data.stream.epoch() * n),
                                       cfg.log_every, cfg.progress)
