"""What a training run keeps in a checkpoint, through the package's State
(nnabla_torus/training/state.py: the file, its atomic write, which one every rank restores).

Besides what the State keeps (parameters with BN statistics, solver states, step, epoch,
images seen, run id), a checkpoint of train.py holds the data position, the batch control
(``AdaptiveBatch.state_dict()``: its plan, decisions, noise scale and measured step times)
and the run's record; a checkpoint of another world size is resplit and resharded
(resize.py). Example::

    save(run)                                  # every rank: BN averaged, rank 0 writes
    meta = restore_checkpoint(run)             # every rank, --resume
"""
import resize
from epoch_end import average_running_stats
from nnabla_torus.planning import priors
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

    def check(meta, path, arrays):
        if "batch" not in meta:
            raise ValueError(f"--resume: {path} is of an earlier train.py (its batch control "
                             f"is not an AdaptiveBatch state); start a new run in another "
                             f"--output-dir")
        note = check_model(meta, path, run.net.model_meta,
                           {f"param/{k}": v.shape for k, v in state.params.items()}, arrays)
        if note:
            log(note)
    meta = state.start(resume=True, check=check)
    lines = batch.load_state_dict(meta["batch"])    # another world size: the batch resplit
    saved = meta["batch"]
    if "global_batch" in saved and state.saved_ranks != comm.size:
        meta["loader"] = resize.resized_loader_state(
            meta["loader"], state.saved_ranks, saved["local_batch"] * saved["accum_steps"],
            batch.controller.current)
        meta["comm"] = None          # the planner's grid was for the old size: plan anew
        log(f"checkpoint {state.checkpoint} was written by {ranks(state.saved_ranks)}, this "
            f"run has {comm.size}: " + lines.pop(0))
    for line in lines:
        log(f"resume: {line}")
    return meta


def save(run):
    """A checkpoint of the run now (collective: BN statistics averaged, rank 0 writes); none
    while the gradients are not finite, so that the kept checkpoints are from before a
    divergence."""
    scaler, comm, state = run.parallel.scaler, run.parallel.comm, run.state
    progress, batch = run.progress, run.planning.batch
    if progress.nonfinite_steps:
        run.settings.log(f"step {progress.step}: no checkpoint: the gradients have not been "
                         f"finite since step {progress.first_nonfinite}")
        return
    average_running_stats(comm)
    state.step, state.epoch = progress.step, run.data.stream.epoch()
    state.images_seen = progress.images_seen
    plan = batch.controller.current
    state.global_batch = plan.global_batch if plan else None
    state.extras = dict(
        train_time=progress.train_time, history=progress.history,
        seed=run.settings.cfg.seed, loss_scale=scaler and scaler.scale,
        comm=[comm.algorithm, str(comm.grid)], model=run.net.model_meta,
        noise_series=priors.trusted_points(progress.noise_series),
        loader=run.data.stream.state(), batch=batch.state_dict(),
        **{name: None if value is None else float(value) for name, value in (
            ("top1", progress.top1), ("top5", progress.top5),
            ("best_top1", progress.best_top1))})
    progress.checkpoint = state.save()
