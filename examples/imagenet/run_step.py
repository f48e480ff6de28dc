"""One step of the training loop: the batch plan at this epoch, the graph (and overlap reducer)
for it, the optimizer step with its bookkeeping, and the step times fed to the refit.

step.py is the graph and one step's all-reduced gradients; this module is the run's side of
a step (learning rate, noise scale, loss scaling, monitors, progress). Example (train.main
does this)::

    batch_plan = plan_step(run, epoch)       # logs a batch change; the planner replans
    loss = take_step(run, batch_plan, epoch)
"""
import time

import numpy as np

from nnabla_torus.planning.controller import momentum_scale
from nnabla_torus.planning.step_refit import EXCHANGE_STEPS, describe as describe_fit
from nnabla_torus.overlap import BucketedAllReduce, overlaps_backward

import report
from divergence import count_nonfinite, gradients_finite
from overlap_trial import choose_overlap, retime_overlap
from step import build_graph, train_step
from training_planner import replan_and_switch


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
