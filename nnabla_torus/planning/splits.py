"""Splits of a global batch: ranks x per-rank micro-batch x accumulation steps.

A fixed run (and the batch-size controller's start at B0) takes ``split_batch``'s split, the
fewest accumulation steps; the adaptive controller scores every split of a batch
(``splits_of``) and takes the one fastest at the low end of its throughput error
(docs/adaptive-batch.md, "Throughput refit").
"""
import math


def split_batch(target, world_size, max_local_batch):
    """(local_batch, accum_steps) for a global batch near ``target`` on ``world_size`` ranks.

    ``accum_steps`` is the fewest that keeps ``local_batch <= max_local_batch``; with it,
    ``local_batch`` is the one whose ``world_size * local_batch * accum_steps`` is closest to
    ``target`` (equal when ``target`` splits exactly).

    >>> split_batch(69632, 1088, 32), split_batch(1000, 3, 64), split_batch(128, 3, 32)
    ((32, 2), (56, 6), (21, 2))
    """
    per_rank = max(1, round(target / world_size))
    accum = max(1, math.ceil(per_rank / max_local_batch))
    local = max(1, min(max_local_batch, round(target / (world_size * accum))))
    return local, accum


MAX_ACCUM = 64         # accumulation steps of the largest default max_batch (ranks x
                       # max_local_batch x MAX_ACCUM) and of any split an adaptive run scores


def splits_of(per_rank, max_local_batch):
    """Every (local_batch, accum_steps) with ``local_batch x accum_steps == per_rank``,
    ``local_batch <= max_local_batch`` and ``accum_steps <= MAX_ACCUM``, largest local first.

    >>> splits_of(64, 32)
    [(32, 2), (16, 4), (8, 8), (4, 16), (2, 32), (1, 64)]
    """
    return [(m, per_rank // m) for m in range(min(per_rank, max_local_batch), 0, -1)
            if per_rank % m == 0 and per_rank // m <= MAX_ACCUM]
