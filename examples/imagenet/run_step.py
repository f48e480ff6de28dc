"""One step of the training loop: the batch plan at this epoch, the graph (and overlap reducer)
for it, the optimizer step with its bookkeeping, and the step times fed to the refit.

step.py is the graph and one step's all-reduced gradients; this module is the run's side of
a step (learning rate, noise scale, loss scaling, monitors, progress). Example (train.main
does this)::

    batch_plan = plan_step(run, epoch)       # logs a batch change; the planner replans
    loss = take_step(run, batch_plan, epoch)
"""
from nnabla_torus.overlap import BucketedAllReduce, overlaps_backward

import report
from divergence import count_nonfinite, gradients_finite
from overlap_trial import choose_overlap, retime_overlap
from step import build_graph, train_step
from training_planner import replan_and_switch


def plan_step(run, epoch):
    """The batch control's BatchPlan at ``epoch`` (AdaptiveBatch: momentum scaled at a change);
    logs a change and its notes, and lets the planner replan."""
    log, planning, progress = run.settings.log, run.planning, run.progress
    # At a change the momentum buffers, which hold the old rate's steps, are scaled to the
    # new rate: the steps after it move as a fixed run's at the new batch.
    plan = planning.batch.plan(epoch, solvers=run.net.solvers.solvers.values())
    if plan.changed:
        log(f"step {progress.step}: {plan.reason}")
        progress.history.append([round(epoch, 4), plan.global_batch])
    for note in planning.batch.pop_notes():
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
    batch, scaler, comm = planning.batch, run.parallel.scaler, run.parallel.comm
    # FP16: the norms are of gradients times the loss scale in force for this step (an
    # overflowed, skipped step leaves inf in them: the estimator skips it).
    grad_scale = 1.0 if scaler is None else scaler.scale
    batch.begin_step()
    loss, error, sync_s = train_step(run.data.stream, net.graph, plan, net.solvers, comm,
                                     net.grads, run.parallel.reducer, scaler)
    global_sqnorm = batch.observe_gradients(grad_scale)   # None: one rank, or not adaptive
    noise = batch.noise
    if noise is not None:
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
    step_time = batch.end_step(sync_s)
    retime_overlap(run, step_time)
    planner = planning.planner
    if batch.exchanged and planner is not None:
        use_measured_times(run, plan)
    progress.train_time += step_time
    progress.images_seen += plan.global_batch
    progress.epoch_meter.add(loss, plan.global_batch, step_time)
    report.add_step(progress.monitors, progress.step, loss, error, lr, plan.global_batch,
                    step_time, noise_scale=None if noise is None else noise.b_simple,
                    predicted=planner.summary["in_use"]["images_per_s"]
                    if planner is not None and planner.summary else None)
    if log.progress is not None:
        log.progress.update(progress.step, run.data.stream.epoch() * len(run.data.train_set),
                            loss, lr, plan.global_batch)
    return loss


def use_measured_times(run, plan):
    """From the first fit of this run's own step times on (not a prior's), the planner plans
    every decision with the measured time; rank-mean times on every rank: all replan alike."""
    fit, planner = run.planning.batch.refit.fit(), run.planning.planner
    line = planner.use_measured(None if fit is None or fit.of_prior else fit)
    if line:
        run.settings.log(line)
        replan_and_switch(planner, plan, run.parallel.comm, run.settings.log)
