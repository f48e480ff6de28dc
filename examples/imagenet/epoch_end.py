"""What the ranks do together at the end of an epoch (or of each ``--val-every`` part of one):
agree on the undecodable images, make the BN statistics one model's, and measure accuracy over
the whole validation set.

Every function here is collective: call it on every rank. Example::

    share_bad_images(train_set, comm, reported, log, epoch)
    average_running_stats(comm)
    top1, top5 = validate(val_set, model, cfg, comm, device_id, log)
    if validation_due(run, epoch_before_the_step):
        end_of_epoch(run)        # all of it for train.py's run, with the epoch's log line
"""
import math
import time

import nnabla as nn
import numpy as np

import data
import report


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
                              num_threads=data.threads_per_rank(comm.local_size),
                              on_bad=cfg.bad_images, dtype=dtype, val_crop=cfg.val_crop)
    for images, labels in loader:
        data.feed(x, images)
        logits.forward(clear_buffer=True)
        valid = labels[:, 0] >= 0
        top5 = np.argsort(-logits.d, axis=1)[:, :5]
        hits = top5 == labels
        counts[:3] += [hits[valid, 0].sum(), hits[valid].any(axis=1).sum(), valid.sum()]
    loader.close()                                # its pools' memory back before training
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


def validation_due(run, epoch):
    """True when the step that began at fractional ``epoch`` crossed a multiple of
    ``--val-every`` epochs (1: each epoch's end; 0.25: four times an epoch)."""
    every = run.settings.cfg.val_every
    return math.floor(run.data.stream.epoch() / every) > math.floor(epoch / every)


def end_of_epoch(run):
    """Share the undecodable images found, average BN statistics, validate, log the epoch or
    the part of it since the last validation (its own mean loss, images/s and time, the run's
    ETA, the seconds all this took) and start the next one's meter."""
    settings, data, progress = run.settings, run.data, run.progress
    comm, epoch = run.parallel.comm, data.stream.epoch()
    started = time.time()
    data.stream.close_finished()
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
                                           settings.cfg.epochs, time.time() - started))
    progress.epoch_meter = report.EpochMeter(epoch)
