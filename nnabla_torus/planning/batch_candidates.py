"""The adaptive controller's candidates: the global batches realisable in [B0, max_batch] on
this world, each with every split of its per-rank samples, and the one split per batch a
decision scores.

The table is built once (``candidate_table``, with the cost model's throughput per row); each
decision keeps one row per global batch (``one_split_per_batch``): the split in use, else the
fastest at the low end of its throughput error (docs/adaptive-batch.md, "Throughput refit").
"""
import math

import numpy as np

from .splits import split_batch, splits_of

MAX_CANDIDATES = 512   # adaptive mode: global batches scored (geometrically spaced beyond)


def candidate_table(world_size, max_local_batch, min_batch, max_batch, throughput):
    """{column: array} of the realisable global batches in [min_batch, max_batch], one row
    per split: first ``split_batch``'s (the fewest accumulation steps; a fixed run's), then
    every other split of the same per-rank samples (``splits_of``), from which a decision
    takes the one fastest at the low end of its throughput error (``one_split_per_batch``)."""
    low = max(1, math.ceil(min_batch / world_size))
    high = max(low, max_batch // world_size)
    per_rank = np.unique(np.round(np.geomspace(low, high, min(high - low + 1, MAX_CANDIDATES))))
    rows = {}
    for k in per_rank.astype(int).tolist():
        local, accum = split_batch(k * world_size, world_size, max_local_batch)
        batch = world_size * local * accum
        if batch not in rows:
            rows[batch] = [(local, accum)] + [split for split in splits_of(
                local * accum, max_local_batch) if split != (local, accum)]
    table = [(b, m, s) for b in sorted(rows) for m, s in rows[b]
             if min_batch <= b <= max_batch]     # rounding can step out
    batch, local, accum = (np.array([row[i] for row in table], int) for i in range(3))
    speed = np.ones(len(batch)) if throughput is None else np.asarray(
        throughput(local, accum), float)      # None: a bigger batch buys nothing
    return {"global_batch": batch, "local_batch": local, "accum_steps": accum,
            "throughput": speed}


def one_split_per_batch(cand, plan, speed, error):
    """Rows of ``cand`` (``candidate_table``'s), one per global batch: the split in use
    (``plan``'s) for the batch in use, for every other batch the split fastest at the low end
    of its throughput error, speed / (1 + error): a measured micro-batch over one never run
    that is predicted a little faster (the "128 hold", docs/adaptive-batch.md: 256 as 32 x 2,
    never run, held back by the cost model's 14.5 % on 7 seeds of 10)."""
    in_use = ((cand["global_batch"] == plan.global_batch) &
              (cand["local_batch"] == plan.local_batch) &
              (cand["accum_steps"] == plan.accum_steps))
    order = np.lexsort((-speed / (1.0 + error), ~in_use, cand["global_batch"]))
    batches = cand["global_batch"][order]
    return order[np.r_[True, batches[1:] != batches[:-1]]]

