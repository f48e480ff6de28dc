"""What a training run keeps in a checkpoint, and how every rank gets the same one back.

checkpoint.py is the file (atomic, checksummed, the newest intact one); this module is the
run's side of it: rank 0 saves the parameters (BN statistics included), the solver states, the
step, the data position, the batch-size controller's plan and its decisions so far, the
noise-scale estimator and the step-time refit; on ``--resume`` rank 0 picks the newest intact
file, every rank reads exactly that one, and a checkpoint of another world size is resplit and
resharded (resize.py); ``save`` writes the run's checkpoint now, from its ``run``::

    save(run)                                                          # every rank
    write_checkpoint(cfg, comm, solvers, step, stream, batch, extra)   # every rank
    meta = restore_checkpoint(cfg, comm, solvers, batch, log, model_meta)
"""
import json
import time

import nnabla as nn
import numpy as np

import resize
from checkpoint import (CheckpointError, check_model, checkpoint_path, checkpoint_step,
                        load_latest_checkpoint, read_checkpoint, save_checkpoint)
from epoch_end import average_running_stats
from nnabla_torus.launching.elastic_protocol import CHECKPOINT_PREFIX
from nnabla_torus.planning import priors
from nnabla_torus.planning.controller import BatchPlan
from report import ranks


def write_checkpoint(cfg, comm, solvers, step, stream, batch, extra):
    """Save params, solver states, step, data position and controller state (rank 0 writes);
    return the file's path on rank 0, None elsewhere.

    Call it on every rank after the BN statistics were averaged (one model everywhere).
    Under ``--elastic`` rank 0 then announces it to nnabla-torus-run (``CHECKPOINT_PREFIX``
    with the step, the path and the seconds the write took)."""
    if comm.rank != 0:
        return
    start = time.perf_counter()
    ctrl, noise = batch.controller, batch.noise
    arrays = {f"param/{k}": v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()}
    solver_arrays, solver_steps = solvers.state_arrays()
    arrays.update(solver_arrays)
    meta = dict(extra, step=step, ranks=comm.size, solver_steps=solver_steps,
                loader=stream.state(),
                plan=list(ctrl.current) if ctrl.current else None,
                noise={k: (v.tolist() if isinstance(v, np.ndarray) else v)
                       for k, v in vars(noise).items()} if noise else None,
                refit=batch.refit.state() if batch.refit is not None else None,
                decisions=ctrl.state() if noise else None)
    path = save_checkpoint(cfg.output_dir, step, arrays, meta)
    if cfg.elastic:
        print(CHECKPOINT_PREFIX + json.dumps({"step": step, "path": path, "seconds": round(
            time.perf_counter() - start, 4)}), flush=True)
    return path


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


def restore_checkpoint(cfg, comm, solvers, batch, log, model_meta):
    """Load the newest intact checkpoint; return its meta (the loop continues from it).

    Raises ValueError on every rank when it was written for another model. A checkpoint of
    another world size resumes with the global batch split anew and the rest of the epoch
    resharded (resize.py).
    """
    arrays, meta, path = load_agreed_checkpoint(cfg.output_dir, comm, log)
    ctrl, noise = batch.controller, batch.noise
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
        log(f"checkpoint {path} was written by {ranks(saved_ranks)}, this run has {comm.size}: "
            + message)
    elif meta["plan"]:
        ctrl.current = BatchPlan(*meta["plan"])
    if noise and meta["noise"] and len(meta["noise"]["_sums"]) != len(noise._sums):
        log("resume: the checkpoint's noise-scale state is of an older format (no error "
            "estimate): the noise scale is measured anew")
    elif noise and meta["noise"]:
        for key, value in meta["noise"].items():
            setattr(noise, key, np.array(value) if key == "_sums" else value)
    if batch.refit is not None and meta.get("refit"):
        note = batch.refit.load_state(meta["refit"])
        if note:
            log(f"resume: {note}")
    if noise and meta.get("decisions") is not None:
        log(f"resume: {ctrl.load_state(meta['decisions'])}")
    log(f"resumed from {path}: step {meta['step']}, epoch {meta['epoch']:.3f}, run "
        f"{meta.get('run_id') or 'of an earlier version (no run id)'}")
    return meta


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
                 comm=[comm.algorithm, str(comm.grid)], model=run.net.model_meta,
                 run_id=progress.run_id,
                 noise_series=priors.trusted_points(progress.noise_series),
                 **{name: None if value is None else float(value) for name, value in (
                     ("top1", progress.top1), ("top5", progress.top5),
                     ("best_top1", progress.best_top1))})
    progress.checkpoint = write_checkpoint(cfg, comm, run.net.solvers, progress.step,
                                           run.data.stream, run.planning.batch, extra)
