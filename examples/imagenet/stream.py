"""The training stream: endless per-rank batches, epoch after epoch, at a changeable batch size.

A new global batch (the batch-size controller) or a new world size (a resized resume,
resize.py) continues the current epoch where it stands, so the learning-rate schedule, which
reads the fractional epoch, never jumps. Example::

    stream = TrainStream(train_set, cfg, comm, device_id=None)
    images, labels = stream.next_batch(32)     # one micro-batch of this rank
    stream.epoch()                             # e.g. 0.089: the same on every rank
"""
import data
import resize


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

    def close_finished(self):
        """At an epoch's end, free the finished epoch's DALI pipeline and its pool memory now
        (before validation builds its own), not when the next epoch's replaces it."""
        if self.at_epoch_end():
            self.loader.close()

    def next_batch(self, batch_size):
        old = self.loader
        if old is None:
            self.loader = self.make(batch_size=batch_size, epoch=0)
        elif self.at_epoch_end():
            self.layout.start(old.epoch + 1)
            old.close()     # before the new pipeline: never both in device memory
            self.loader = self.make(batch_size=batch_size, epoch=old.epoch + 1)
        elif old.batch_size != batch_size:
            old.close()
            self.loader = self.make(batch_size=batch_size, epoch=old.epoch,
                                    start_image=old.position)
        return next(self.loader)
