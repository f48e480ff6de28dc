"""Data-parallel ImageNet training with nnabla and the nnabla-torus communicator.

With no arguments it builds (once, cached) a small ImageNet-layout dataset from scikit-learn's
handwritten digits and trains a small ResNet-18 on it with the ``digits-cpu`` recipe, through
the same code path as ImageNet: DALI input sharded by rank, torus all-reduce overlapped with
backward, the batch-size controller, the planner, checkpoints::

    mpirun -np 4 python examples/imagenet/train.py          # any machine, no data, 4 CPU ranks
    mpirun -np 8 python examples/imagenet/train.py --data-dir /data/imagenet --context cudnn
    srun --mpi=pmix -n 8 python examples/imagenet/train.py ...   # Slurm (or train.sbatch)

Every knob is a flag, an environment variable and a recipe key (``python train.py --help``).
Other commands, how the loop reads, the modules beside this file, output, resuming and the
exit statuses: docs/imagenet.md; Slurm and PBS: docs/clusters.md.
"""
import json
import math
import os
import signal
import sys
import time

# nnabla calls logging.basicConfig(level=INFO) at import (nnabla/logger.py, line 91 at v1.39.0):
# "Initializing CPU extension..." on every rank, and every library's INFO lines (matplotlib's)
# after it. A root handler configured first makes that call a no-op.
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

import numpy as np
import nnabla as nn

from nnabla_torus.launching import elastic
from nnabla_torus.loss_scaling import DynamicLossScaling
from nnabla_torus.planning import priors
from nnabla_torus.planning.controller import momentum_scale
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from nnabla_torus.planning.overlap_choice import describe as describe_overlap_choice
from nnabla_torus.planning.model_cost import count_cost
from nnabla_torus.planning.step_refit import EXCHANGE_STEPS, StepTimeRefit, describe as describe_fit
from nnabla_torus.overlap import BucketedAllReduce, overlaps_backward
from nnabla_torus.planning.schedules import BatchSchedule

import digits
import image_lists
import report
import resize
from checkpoint import CheckpointError, remove_stale_temporaries
from config import build_schedules, parse_config
from models import export_model, get_model, load_initial_parameters
from overlap_trial import OverlapTrial
from training_planner import TrainingPlanner, replan_and_switch
from epoch_end import average_running_stats, share_bad_images, validate
from run_checkpoint import restore_checkpoint, write_checkpoint
from run_context import make_context_and_comm
from run_state import Data, Network, Parallel, Planning, RunState, Settings
from solvers import SolverGroup
from step import build_graph, train_step
from stream import TrainStream

EXIT_DIVERGED = 3     # the loss was not finite for --max-nonfinite-steps steps (every rank)


# ----------------------------------------------------------------------------------------------
# set-up: data (the context and the communicator: run_context.py)

def open_datasets(cfg, log):
    """Return (train_set, val_set); the embedded digits data when no --data-dir is given."""
    root = os.path.expanduser(cfg.data_dir) if cfg.data_dir else digits.ensure_digits_dataset()
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
    return train_set, val_set


# ----------------------------------------------------------------------------------------------
# the loop: set-up, one step, the end of an epoch, the summary

def main(argv=None):
    cfg = parse_config(argv)
    t_start = time.time()
    # MPI started by the communicator's module: fail-fast installed and Open MPI's osc/ucx
    # notices off before MPI starts (importing mpi4py.MPI first would print them per window)
    from nnabla_torus.comm.communicator import MPI
    log = report.RankZeroLog(MPI.COMM_WORLD.rank)
    report.configure_logging(MPI.COMM_WORLD.rank, log)
    run = set_up(cfg, log)
    resume_or_start(run)
    status, request = 0, None
    stream, advisor, progress = run.data.stream, run.planning.advisor, run.progress
    while not finished(run):
        epoch = stream.epoch()
        batch_plan = plan_step(run, epoch)
        if advisor is not None and advisor.due(batch_plan, epoch):
            request = resize.elastic_request(advisor, batch_plan, epoch, cfg.elastic, log)
            if request is not None:
                status = elastic.EXIT_RESIZE
                break
        take_step(run, batch_plan, epoch)
        if diverged(run):
            status = EXIT_DIVERGED
            break
        if math.floor(stream.epoch()) > math.floor(epoch) or finished(run):
            end_of_epoch(run)
        stopping = cfg.elastic and run.parallel.comm.allreduce_numpy(
            np.array([len(progress.stop_signal)], np.float32))[0] > 0   # every rank stops together
        if finished(run) or stopping or (cfg.checkpoint_every
                                         and progress.step % cfg.checkpoint_every == 0):
            save(run)
        if stopping:
            log(f"step {progress.step}: stopped on a signal; checkpoint written, resume with "
                f"--resume 1")
            status = elastic.EXIT_STOPPED
            break
    return summary(run, status, request, t_start)


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
    noise = NoiseScaleEstimator() if cfg.adaptive_batch else None
    comm.track_sqnorms = noise is not None
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
        f"{comm.size} ranks, {all_reduce}")
    # The run's own step times, measured once (step_refit): the planner plans with them once
    # fitted (observe_step_times), and so does the adaptive batch's goodput (on several ranks:
    # before, with this run's predicted throughput; flat with --plan off); an adaptive run
    # decides on a prior (an earlier run's, or published) when there is one, before it has
    # measured (priors.Prior.starts: from step 0, or where the earlier run's estimate began).
    adaptive_refit = noise is not None and comm.size > 1
    refit = prior = key = None
    if cfg.adaptive_refit_steps and (planner is not None or adaptive_refit):
        refit = StepTimeRefit(comm.size, planner and planner.compute_line(),
                              min_steps=cfg.adaptive_refit_steps,
                              warmup_steps=cfg.adaptive_refit_warmup)
    if noise is not None:
        key, prior = batch_prior(cfg, comm, planner, n_params, train_set,
                                 refit if adaptive_refit else None, log)
    ctrl, lr_schedule = build_schedules(
        cfg, comm.size, noise, throughput=planner and planner.throughput,
        model_error=planner and planner.model_error, refit=refit if adaptive_refit else None,
        prior=prior, epoch_images=len(train_set))
    if noise is not None:
        noise.reference_batch = ctrl.min_batch     # the EMA's memory: 0.95 per B0 samples,
        #                                            whatever batch the prior starts at
    return RunState(settings, Parallel(comm), Data(train_set, val_set),
                    Network(model, params, grads, solvers),
                    Planning(planner, noise, refit, ctrl, lr_schedule, prior_key=key))


def data_name(cfg, train_set):
    """The dataset's name in a prior's key and in the published figures: ``digits`` (the
    embedded data), ``imagenet`` (1,000 classes), else the data folder."""
    if not cfg.data_dir:
        return "digits"
    return "imagenet" if train_set.num_classes == 1000 else os.path.abspath(cfg.data_dir)


def batch_prior(cfg, comm, planner, n_params, train_set, refit, log):
    """(key, Prior or None) of --batch-prior: rank 0 reads it (its own disk) and sends it to
    every rank, so every controller decides alike; the refit takes its step times."""
    from nnabla_torus.comm.communicator import MPI
    machine = (f"{planner.prof.name if planner else 'no planner'} "
               f"{len(comm.hosts.hosts)}x{comm.hosts.ranks_per_host or 0}")
    key = priors.prior_key(
        {"arch": cfg.arch, "width": cfg.width, "image_size": cfg.image_size,
         "parameters": n_params},
        {"data": data_name(cfg, train_set), "images": len(train_set),
         "classes": train_set.num_classes}, comm.size, machine)
    found = None
    if comm.rank == 0:
        found = priors.find(cfg.batch_prior, comm.settings.cache_dir, key, cfg.arch,
                            data_name(cfg, train_set))
    spec, line = MPI.COMM_WORLD.bcast(found, root=0)
    log(line)
    prior = priors.from_spec(spec, cfg.epochs)
    if prior is not None and prior.step_times is not None and refit is not None:
        refused = refit.load_prior(prior.step_times)
        if refused:
            log(f"batch prior: {refused}")
    return key, prior


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
    if comm.rank == 0:
        remove_stale_temporaries(cfg.output_dir, log)
    if cfg.resume:
        meta = restore_checkpoint(cfg, comm, net.solvers, planning.ctrl, planning.noise, log,
                                  net.model_meta)
        progress.step, progress.images_seen, progress.train_time = (
            meta["step"], meta["images_seen"], meta["train_time"])
        progress.history, loader_state = meta["history"], meta["loader"]
        resumed_at = (progress.step, meta["epoch"])
        loss_scale = meta["loss_scale"] or loss_scale
        if planning.planner is not None and planning.planner.applies and meta.get("comm"):
            comm.set_algorithm(*meta["comm"])    # the planner's choice in force at the checkpoint
            planning.planner.settled = True
    data.stream = TrainStream(data.train_set, cfg, comm, run.settings.device_id, loader_state,
                              dtype=run.settings.type_config)
    planning.advisor = None if planning.planner is None else resize.ResizeAdvisor(
        planning.planner, BatchSchedule.parse(cfg.batch_schedule), cfg.adaptive_batch,
        cfg.epochs, len(data.train_set), comm.size)
    if cfg.elastic and planning.advisor is None:
        log(f"elastic: --plan off leaves no planner to choose rank counts: the run keeps "
            f"{comm.size} ranks (use --plan on)")
    if cfg.elastic:          # the launcher's Ctrl-C: checkpoint at the end of this step
        signal.signal(signal.SIGUSR1, lambda signum, frame: progress.stop_signal.append(signum))
    progress.monitors = report.make_monitors(cfg, comm.rank, resumed_at)
    progress.epoch_meter = report.EpochMeter(data.stream.epoch())
    # FP16: nnabla's dynamic loss scaling rules around the (overlapped) all-reduce.
    run.parallel.scaler = DynamicLossScaling(loss_scale) if cfg.type_config == "half" else None
    if cfg.max_steps and progress.step >= cfg.max_steps:
        log(f"nothing to train: the checkpoint is at step {progress.step}, --max-steps is "
            f"{cfg.max_steps}; raise --max-steps to continue")
    if comm.rank == 0:
        n = len(data.train_set)
        log.progress = report.Progress(round(cfg.epochs * n), round(data.stream.epoch() * n),
                                       cfg.log_every, cfg.progress)


def finished(run):
    """True once the run has trained its epochs (or --max-steps)."""
    cfg, step = run.settings.cfg, run.progress.step
    return run.data.stream.epoch() >= cfg.epochs or bool(cfg.max_steps and step >= cfg.max_steps)


def plan_step(run, epoch):
    """The controller's BatchPlan at ``epoch``; logs a change and lets the planner replan."""
    log, planning, progress = run.settings.log, run.planning, run.progress
    before = planning.ctrl.current
    plan = planning.ctrl.plan(epoch)
    if plan.changed:
        log(f"step {progress.step}: {plan.reason}")
        progress.history.append([round(epoch, 4), plan.global_batch])
        # The momentum buffer holds the old rate's steps: scaled to the new rate, the steps
        # after the change move as a fixed run's at the new batch (docs/adaptive-batch.md).
        run.net.solvers.scale_momentum(momentum_scale(before, plan))
    for note in planning.ctrl.pop_notes() if planning.noise is not None else ():
        log(f"step {progress.step}: {note}")
    if planning.planner is not None and plan.global_batch != planning.planner.batch:
        replan_and_switch(planning.planner, plan, run.parallel.comm, log)
    return plan


def graph_for(run, plan):
    """The training graph (and overlap reducer) for ``plan``'s micro-batch, built anew when
    the per-rank batch or the accumulation changes."""
    net, parallel = run.net, run.parallel
    if (plan.local_batch, plan.accum_steps) == net.graph_key:
        return
    net.graph_key = (plan.local_batch, plan.accum_steps)
    if parallel.reducer is not None:
        parallel.reducer.close()     # its thread serves the old graph's buckets
        parallel.reducer = None
    cfg, comm, log = run.settings.cfg, parallel.comm, run.settings.log
    net.graph = build_graph(net.model, plan.local_batch, cfg.image_size, cfg.label_smoothing,
                            plan.accum_steps)
    if cfg.overlap and not overlaps_backward(comm) and not choose_overlap(run, plan):
        log(f"overlap off: on the nccl backend only algorithm native overlaps on the "
            f"device (nnabla's all_reduce_callback); "
            f"{comm.algorithm} enqueues every collective on the stream backward runs "
            f"on: the gradients are all-reduced after backward")
    elif cfg.overlap:
        parallel.reducer = BucketedAllReduce(
            comm, net.graph[3], net.params, bucket_mib=cfg.bucket_mib,
            grad_bytes=2 if run.settings.type_config == "half" else 4)


def choose_overlap(run, plan):
    """On NCCL with an algorithm that cannot overlap (torus2d across hosts): the cost model's
    choice between it after backward and native overlapped, logged once per run with its
    numbers (nnabla_torus/planning/overlap_choice.py); with ``--algorithm planned`` switch to
    native when that is faster. True when the run now overlaps."""
    planning, comm, cfg = run.planning, run.parallel.comm, run.settings.cfg
    if planning.planner is None:
        return False
    if planning.overlap_trial is None:
        choice = planning.planner.overlap_choice(plan.local_batch, comm.grid.x)
        if not planning.overlap_choice_logged:
            planning.overlap_choice_logged = True
            run.settings.log(describe_overlap_choice(choice, planning.planner.prof.name) + (
                "; timing both on this run next" if cfg.algorithm == "planned" else
                f" (kept {comm.algorithm}: --algorithm {cfg.algorithm} was asked for)"))
        if cfg.algorithm != "planned":
            return False
        planning.overlap_trial = OverlapTrial(choice, comm.grid)
    if planning.overlap_trial.running != "native":
        return False
    comm.set_algorithm("native")
    return True


def retime_overlap(run, step_time):
    """Feed the overlap trial (choose_overlap) one step; switch when it says so, rebuilding
    the graph's reducer for the new algorithm; log the measured choice once it is made."""
    planning, comm = run.planning, run.parallel.comm
    trial = planning.overlap_trial
    if trial is None or trial.done:
        return
    switch = trial.observe(comm, step_time)
    if trial.done:
        run.settings.log(describe_overlap_choice(trial.choice, planning.planner.prof.name))
    if switch is not None:
        comm.set_algorithm(switch, trial.grid if switch == "torus2d" else None)
        run.net.graph_key = None      # graph_for builds the reducer of the new algorithm


def take_step(run, plan, epoch):
    """One optimizer step at ``plan``: gradients, noise scale, update, monitors, progress
    (``progress.nonfinite_steps`` counts a step whose gradients are not finite); returns this
    rank's training loss of the step."""
    graph_for(run, plan)
    net, planning, progress, log = run.net, run.planning, run.progress, run.settings.log
    lr = planning.lr_schedule.lr(epoch) * plan.lr_factor
    net.solvers.set_learning_rate(lr)
    noise, scaler, comm = planning.noise, run.parallel.scaler, run.parallel.comm
    if noise is not None:
        comm.pop_sqnorms()          # drop what other all-reduces (BN statistics) added
    # FP16: the norms are of gradients times the loss scale in force for this step (an
    # overflowed, skipped step leaves inf in them: the estimator skips it).
    grad_scale = 1.0 if scaler is None else scaler.scale
    tic = time.time()
    loss, error, sync_s = train_step(run.data.stream, net.graph, plan, net.solvers, comm,
                                     net.grads, run.parallel.reducer, scaler)
    global_sqnorm = None            # of the all-reduced gradients (several ranks, adaptive)
    if noise is not None:
        local_sqnorm, global_sqnorm = comm.pop_sqnorms()
        if comm.size == 1:
            global_sqnorm = None
        else:
            noise.update(local_sqnorm / grad_scale ** 2, plan.local_batch * plan.accum_steps,
                         global_sqnorm / grad_scale ** 2, plan.global_batch)
        progress.noise_series.append((epoch / run.settings.cfg.epochs, noise.b_simple,
                                      noise.rse))
    updated = scaler is None or scaler.unscale(net.solvers)
    finite = (not run.settings.cfg.max_nonfinite_steps or
              gradients_finite(run, global_sqnorm, updated))
    if updated:
        net.solvers.weight_decay(run.settings.cfg.weight_decay)
        net.solvers.update()
    else:
        log(f"step {progress.step}: FP16 gradients overflowed, update skipped; loss scale now "
            f"{scaler.scale:g}")
    progress.step += 1
    count_nonfinite(progress, finite)
    step_time = time.time() - tic
    retime_overlap(run, step_time)
    if planning.refit is not None:
        observe_step_times(run, plan, step_time, sync_s)
    progress.train_time += step_time
    progress.images_seen += plan.global_batch
    progress.epoch_meter.add(loss, plan.global_batch, step_time)
    planner = planning.planner
    report.add_step(progress.monitors, progress.step, loss, error, lr, plan.global_batch,
                    step_time, noise_scale=None if noise is None else noise.b_simple,
                    predicted=planner.summary["in_use"]["images_per_s"]
                    if planner is not None and planner.summary else None)
    if log.progress is not None:
        log.progress.update(progress.step, run.data.stream.epoch() * len(run.data.train_set),
                            loss, lr, plan.global_batch)
    return loss


def gradients_finite(run, global_sqnorm, updated):
    """Whether this step's all-reduced gradients are finite: the same answer on every rank
    without a collective of its own (an inf or NaN in one rank's gradients reaches every
    rank's sum, and a non-finite loss gives non-finite gradients). From the noise scale's
    squared norm when it has one, else ``check_inf_or_nan_grad`` (one pass over the
    gradients). FP16: not finite only when the update was skipped at a loss scale of 1 or
    less (an overflow at a larger scale is the scaler's to handle, not a divergence)."""
    scaler = run.parallel.scaler
    if scaler is not None:
        return updated or scaler.scale * scaler.scaling_factor > 1.0
    if global_sqnorm is not None:
        return math.isfinite(global_sqnorm)
    return not run.net.solvers.check_inf_or_nan_grad()


def count_nonfinite(progress, finite):
    """Count the non-finite steps in a row (``diverged`` stops the run after
    --max-nonfinite-steps of them)."""
    if finite:
        progress.nonfinite_steps, progress.first_nonfinite = 0, None
        return
    progress.nonfinite_steps += 1
    if progress.first_nonfinite is None:
        progress.first_nonfinite = progress.step


def diverged(run):
    """True (every rank alike) once --max-nonfinite-steps steps in a row were not finite;
    rank 0 says which and what to do."""
    cfg, progress = run.settings.cfg, run.progress
    if not cfg.max_nonfinite_steps or progress.nonfinite_steps < cfg.max_nonfinite_steps:
        return False
    kept = (f"the last checkpoint, {progress.checkpoint}, is from before it"
            if progress.checkpoint else "no checkpoint was written")
    run.settings.log(
        f"{report.clock()} step {progress.step}: the run diverged: the all-reduced gradients "
        f"have not been finite for {progress.nonfinite_steps} steps (since step "
        f"{progress.first_nonfinite}; --max-nonfinite-steps {cfg.max_nonfinite_steps}); "
        f"stopped on every rank, {kept}. Lower --base-lr (now {cfg.base_lr:g}) or lengthen "
        f"--warmup-epochs (now {cfg.warmup_epochs:g})")
    return True


def observe_step_times(run, plan, step_time, sync_s):
    """Feed the throughput refit with rank means of the step and all-reduce wait seconds, so
    that every rank's controller decides alike: exchanged every ``EXCHANGE_STEPS``
    steps in one all-reduce (one a step cost ~7 ms a step on 4 ranks of this 2-core machine,
    1.0 s of a 15 s run: a collective on oversubscribed cores waits for the scheduler), and
    as soon as the batch in use could be measured (warm-up + min_steps steps) while it is not,
    so that a decision waits for no more steps than the refit needs."""
    progress, comm, refit = run.progress, run.parallel.comm, run.planning.refit
    progress.step_times.append((plan.local_batch, plan.accum_steps, step_time, sync_s))
    measurable = (not refit.ready(plan.local_batch, plan.accum_steps) and
                  len(progress.step_times) >= refit.warmup_steps + refit.min_steps)
    if len(progress.step_times) < EXCHANGE_STEPS and not measurable:
        return
    times = np.array([t[2:] for t in progress.step_times], np.float32)
    times = comm.allreduce_numpy(times) / comm.size
    before = refit.fit()
    for (local, accum, _, _), (step_s, wait_s) in zip(progress.step_times, times.tolist()):
        refit.observe(local, accum, step_s, wait_s)
    progress.step_times = []
    fit = refit.fit()
    if before is not None and before.of_prior and not fit.of_prior:
        run.settings.log(f"batch prior: this run's own step times replace the prior's from now "
                         f"on: {describe_fit(fit)}")
    planner = run.planning.planner
    if planner is not None:      # from the first fit of this run's own steps on, every
        #                          decision uses the measured time (not a prior's)
        line = planner.use_measured(None if fit is None or fit.of_prior else fit)
        if line:                 # same rank-mean times on every rank: all replan alike
            run.settings.log(line)
            replan_and_switch(planner, plan, comm, run.settings.log)


def end_of_epoch(run):
    """Share the undecodable images found, average BN statistics, validate, log the epoch
    (its own mean loss, images/s and time, the run's ETA) and start the next one's meter."""
    settings, data, progress = run.settings, run.data, run.progress
    comm, epoch = run.parallel.comm, data.stream.epoch()
    share_bad_images(data.train_set, comm, data.reported_bad, settings.log, epoch)
    average_running_stats(comm)
    progress.top1, progress.top5 = validate(data.val_set, run.net.model, settings.cfg, comm,
                                            settings.device_id, settings.log,
                                            settings.type_config)
    if progress.monitors and progress.top1 is not None:
        progress.monitors["val_top1"].add(epoch, progress.top1)
        progress.monitors["val_top5"].add(epoch, progress.top5)
    if progress.top1 is not None and progress.top1 >= (progress.best_top1 or 0.0):
        progress.best_top1 = progress.top1
    progress.epoch_meter.share_loss(comm)
    settings.log(progress.epoch_meter.line(epoch, progress.step, progress.top1, progress.top5,
                                           settings.cfg.epochs))
    progress.epoch_meter = report.EpochMeter(epoch)


def save(run):
    """A checkpoint of the run now (collective: BN statistics averaged, rank 0 writes); none
    while the gradients are not finite, so that the kept checkpoints are from before a
    divergence."""
    scaler, comm = run.parallel.scaler, run.parallel.comm
    cfg, progress = run.settings.cfg, run.progress
    if progress.nonfinite_steps:
        run.settings.log(f"step {progress.step}: no checkpoint: the gradients have not been "
                         f"finite since step {progress.first_nonfinite}")
        return
    average_running_stats(comm)
    extra = dict(epoch=run.data.stream.epoch(), images_seen=progress.images_seen,
                 train_time=progress.train_time, history=progress.history, seed=cfg.seed,
                 loss_scale=scaler and scaler.scale,
                 comm=[comm.algorithm, str(comm.grid)], model=run.net.model_meta)
    progress.checkpoint = write_checkpoint(cfg, comm, run.net.solvers, progress.step,
                                           run.data.stream, run.planning.ctrl,
                                           run.planning.noise, extra)


def summary(run, status, request, t_start):
    """End the run: a resize request (checkpoint, request line), a stop or a divergence (the
    JSON summary line) returns ``status``; a finished run writes the model, the plots, the
    closing summary and the JSON summary line (rank 0)."""
    comm, log = run.parallel.comm, run.settings.log
    if run.parallel.reducer is not None:
        run.parallel.reducer.close()
    if log.progress is not None:
        log.progress.close()
    if status == elastic.EXIT_RESIZE:
        save(run)
        if comm.rank == 0:
            print(elastic.REQUEST_PREFIX + json.dumps(request), flush=True)
    if status == EXIT_DIVERGED and comm.rank == 0:
        print(json.dumps(report.summary_json(run, time.time() - t_start)), flush=True)
    if status:
        comm.barrier()               # rank 0's checkpoint is on disk before any rank exits
        comm.close()                 # NCCL communicators freed before the interpreter exits
        return status
    wall = time.time() - t_start
    if comm.rank == 0:
        output_dir = run.settings.cfg.output_dir
        if run.planning.noise is not None:
            leave_prior(run, comm.settings.cache_dir, output_dir, log)
        export_model(run.net.model, run.settings.cfg.image_size, output_dir, log)
        plots = report.write_plots(output_dir, log)
        for line in report.closing_summary(run, wall, plots):
            log(line)
        print(json.dumps(report.summary_json(run, wall)), flush=True)
    comm.close()                     # NCCL communicators freed before the interpreter exits


def leave_prior(run, cache_dir, output_dir, log):
    """Write this adaptive run's noise scale and step times as the batch prior of later runs:
    batch_prior.json in ``output_dir`` and the key's file in the cache (rank 0; a failure
    to write is a line, not an error)."""
    refit = run.planning.refit
    series, key = run.progress.noise_series, run.planning.prior_key
    for path in (os.path.join(output_dir, "batch_prior.json"), None):
        try:
            written = priors.save(cache_dir, key, series, refit and refit.state(),
                                  os.path.abspath(output_dir), path=path)
        except OSError as e:
            log(f"batch prior: not written ({e}); set NNABLA_TORUS_CACHE_DIR to a writable "
                f"folder")
            continue
        log(f"batch prior: written to {written}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError, CheckpointError) as error:
        # A message, not a traceback; abort_job ends every rank even when only this one raised
        # (after sys.exit it would wait in MPI_Finalize while the others wait for it).
        from nnabla_torus.comm import failfast
        failfast.abort_job(f"train.py: error: {error}")
