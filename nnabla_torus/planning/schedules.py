"""Schedules over fractional epochs: the global batch size and the base learning rate.

Example (the paper's batch-size control, 34K -> 68K after the 5 warm-up epochs)::

    >>> bs = BatchSchedule.parse("0:34816,5:69632")
    >>> bs.batch(4.99), bs.batch(5.0)
    (34816, 69632)
    >>> lr = LearningRateSchedule(0.1, epochs=90, warmup_epochs=5, decay="step")
    >>> lr.lr(2.5), lr.lr(10), lr.lr(35)
    (0.05, 0.1, 0.010000000000000002)
"""
import math


class BatchSchedule:
    """Piecewise-constant global batch: ``[(start_epoch, global_batch), ...]``, first at 0."""

    def __init__(self, phases):
        phases = [(float(e), int(b)) for e, b in phases]
        text, example = self._text(phases), "e.g. '0:34816,5:69632'"
        if not phases or phases[0][0] != 0.0:
            raise ValueError(f"batch schedule {text} must start at epoch 0, {example}")
        if any(not math.isfinite(e) for e, _ in phases):
            raise ValueError(f"batch schedule {text}: epochs must be finite, {example}")
        if any(b < 1 for _, b in phases):
            raise ValueError(f"batch schedule {text}: every global batch must be >= 1, {example}")
        if any(a[0] >= b[0] for a, b in zip(phases, phases[1:])):
            raise ValueError(f"batch schedule {text}: epochs must increase strictly from one "
                             f"phase to the next, {example}")
        self.phases = phases

    @staticmethod
    def _text(phases):
        return ",".join(f"{e:g}:{b}" for e, b in phases) or "''"

    @classmethod
    def parse(cls, text):
        """Parse ``"epoch:batch,epoch:batch"``, e.g. ``"0:34816,5:69632"``; K suffix = x1024."""
        phases = []
        for item in str(text).split(","):
            epoch, sep, batch = item.partition(":")
            batch = batch.strip().upper()
            try:
                value = int(float(batch[:-1]) * 1024) if batch.endswith("K") else int(batch)
                phases.append((float(epoch), value))
            except (ValueError, OverflowError):
                raise ValueError(f"batch schedule item {item!r} is not 'epoch:batch' "
                                 f"(e.g. '0:34816,5:69632' or '0:34K,5:68K')") from None
        return cls(phases)

    def batch(self, epoch):
        """Global batch at fractional ``epoch``."""
        return self.phase(epoch)[1]

    def phase(self, epoch):
        """(start_epoch, global_batch) of the phase containing ``epoch``."""
        current = self.phases[0]
        for start, batch in self.phases:
            if epoch >= start:
                current = (start, batch)
        return current

    def __str__(self):
        return self._text(self.phases)


DECAYS = ("cosine", "step", "poly", "none")


class LearningRateSchedule:
    """Linear warm-up from ``warmup_start_lr`` to ``base_lr``, then a decay to ``epochs``.

    ``decay``: ``cosine`` (0.5(1+cos(pi t))), ``step`` (x gamma at each milestone epoch),
    ``poly`` ((1-t)^power) or ``none``; t is the fraction of the post-warm-up epochs done.
    ``base_lr`` is for the reference batch; the controller multiplies by its ``lr_factor``.
    """

    def __init__(self, base_lr, epochs, warmup_epochs=5, decay="cosine", milestones=(30, 60, 80),
                 gamma=0.1, power=2.0, warmup_start_lr=0.0):
        if decay not in DECAYS:
            raise ValueError(f"unknown LR decay {decay!r}; choose one of {DECAYS}")
        if not 0 <= warmup_epochs < epochs:
            raise ValueError(f"warmup_epochs={warmup_epochs} must be in [0, epochs={epochs})")
        self.base_lr, self.epochs, self.warmup_epochs = float(base_lr), float(epochs), warmup_epochs
        self.decay, self.milestones, self.gamma = decay, tuple(milestones), gamma
        self.power, self.warmup_start_lr = power, float(warmup_start_lr)

    def lr(self, epoch):
        """Learning rate at fractional ``epoch`` (for the reference batch)."""
        if epoch < self.warmup_epochs:
            frac = epoch / self.warmup_epochs
            return self.warmup_start_lr + (self.base_lr - self.warmup_start_lr) * frac
        t = min(max((epoch - self.warmup_epochs) / (self.epochs - self.warmup_epochs), 0.0), 1.0)
        if self.decay == "cosine":
            return self.base_lr * 0.5 * (1.0 + math.cos(math.pi * t))
        if self.decay == "step":
            return self.base_lr * self.gamma ** sum(epoch >= m for m in self.milestones)
        if self.decay == "poly":
            return self.base_lr * (1.0 - t) ** self.power
        return self.base_lr
