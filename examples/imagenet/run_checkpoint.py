"""What a training run keeps in a checkpoint, through the package's State
(nnabla_torus/training/state.py: the file, its atomic write, which one every rank restores).

Besides what the State keeps (parameters with BN statistics, solver states, step, epoch,
images seen, run id), a checkpoint of train.py holds the data position, the batch-size
controller's plan and its decisions so far, the noise-scale estimator, the step-time refit
and the run's record; a checkpoint of another world size is resplit and resharded
(resize.py). Example::

    save(run)                                  # every rank: BN averaged, rank 0 writes
    meta = restore_checkpoint(run)             # every rank, --resume
"""
import numpy as np

import resize
from epoch_end import average_running_stats
from nnabla_torus.planning import priors
from nnabla_torus.planning.controller import BatchPlan
from report import ranks

MODEL_FLAGS = {"arch": "--arch", "width": "--width", "classes": "the training list's labels",
               "recipe": "-C"}
# What a run writes into its --output-dir besides its checkpoints (run_end, report): set
# aside with them when a new run starts there.
RUN_FILES = ("model.h5", "model.nnp", "batch_prior.json", "*.series.txt", "training.png",
             "speed.png")


def check_model(meta, path, model, shapes, arrays):
    """Raise ValueError unless the checkpoint at ``path`` holds this run's model.

    ``model``: this run's {arch, width, classes, image_size, recipe}, compared with the one
    the checkpoint recorded (``meta["model"]``); ``shapes``: parameter name -> shape of this
    run, compared with the checkpoint's ``arrays`` (also for checkpoints without the record).
    Another recipe is refused too (its schedule and optimizer would continue another run's
    state). Returns a note for the log when only the image size differs (it changes the
    training, not the parameters), else "".
    """
    saved = meta.get("model") or {}
    differ = [f"{key} {saved[key]!r} (this run: {model[key]!r}, {flag})"
              for key, flag in MODEL_FLAGS.items() if key in saved and saved[key] != model[key]]
    wrong = [name for name, shape in shapes.items()
             if name not in arrays or arrays[name].shape != tuple(shape)]
    if differ or wrong:
        what = ", ".join(differ) if differ else (
            f"parameters that do not fit this model (first: {wrong[0]}, "
            f"{arrays[wrong[0]].shape if wrong[0] in arrays else 'missing'} there, "
            f"{tuple(shapes[wrong[0]])} here)")
        raise ValueError(f"--resume: {path} was written with {what}; resume with that run's "
                         f"settings, or start a new run in another --output-dir")
    changed = [f"{key} {saved[key]!r} -> {model[key]!r}" for key in ("image_size",)
               if key in saved and saved[key] != model[key]]
    return f"resume: changed since the checkpoint: {', '.join(changed)}" if changed else ""


def restore_checkpoint(run):
    """Restore the newest intact checkpoint (run.state.start); return its meta.

    Raises ValueError on every rank when it was written for another model. A checkpoint of
    another world size resumes with the global batch split anew and the rest of the epoch
    resharded (resize.py).
    """
    state, comm, log = run.state, run.parallel.comm, run.settings.log
    batch = run.planning.batch
    ctrl, noise = batch.controller, batch.noise

    def check(meta, path, arrays):
        note = check_model(meta, path, run.net.model_meta,
                           {f"param/{k}": v.shape for k, v in state.params.items()}, arrays)
        if note:
            log(note)
    meta = state.start(resume=True, check=check)
    if meta["plan"] and state.saved_ranks != comm.size:
        old = BatchPlan(*meta["plan"])
        ctrl.current, message = resize.resplit(meta["plan"], comm.size, ctrl.max_local_batch,
                                               ctrl.lr_factor)
        meta["loader"] = resize.resized_loader_state(
            meta["loader"], state.saved_ranks, old.local_batch * old.accum_steps,
            ctrl.current)
        meta["comm"] = None          # the planner's grid was for the old size: plan anew
        log(f"checkpoint {state.checkpoint} was written by {ranks(state.saved_ranks)}, this "
            f"run has {comm.size}: " + message)
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
    return meta


def save(run):
    """A checkpoint of the run now (collective: BN statistics averaged, rank 0 writes); none
    while the gradients are not finite, so that the kept checkpoints are from before a
    divergence."""
    scaler, comm, state = run.parallel.scaler, run.parallel.comm, run.state
    progress, batch = run.progress, run.planning.batch
    ctrl, noise = batch.controller, batch.noise
    if progress.nonfinite_steps:
        run.settings.log(f"step {progress.step}: no checkpoint: the gradients have not been "
                         f"finite since step {progress.first_nonfinite}")
        return
    average_running_stats(comm)
    state.step, state.epoch = progress.step, run.data.stream.epoch()
    state.images_seen = progress.images_seen
    state.global_batch = ctrl.current.global_batch if ctrl.current else None
    state.extras = dict(
        train_time=progress.train_time, history=progress.history,
        seed=run.settings.cfg.seed, loss_scale=scaler and scaler.scale,
        comm=[comm.algorithm, str(comm.grid)], model=run.net.model_meta,
        noise_series=priors.trusted_points(progress.noise_series),
        loader=run.data.stream.state(), plan=list(ctrl.current) if ctrl.current else None,
        noise={k: (v.tolist() if isinstance(v, np.ndarray) else v)
               for k, v in vars(noise).items()} if noise else None,
        refit=batch.refit.state() if batch.refit is not None else None,
        decisions=ctrl.state() if noise else None,
        **{name: None if value is None else float(value) for name, value in (
            ("top1", progress.top1), ("top5", progress.top5),
            ("best_top1", progress.best_top1))})
    progress.checkpoint = state.save()
