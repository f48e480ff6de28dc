"""The candidates the planner scores: GPU counts, grids, per-GPU batch and accumulation splits.

Candidates are columns (numpy arrays, one entry per candidate): :func:`topology_columns` pairs
each GPU count with each algorithm and each of its grids (:func:`grids`), :func:`batch_columns`
pairs each topology with per-GPU batches and accumulation steps, only those that give the
target global batch when there is one (else :class:`UnsplittableBatch` names the nearest).
"""
import math

import numpy as np

from ..comm.collectives import registry_entry
from .costmodel import ALGORITHMS


def gpus_text(count):
    """``"1 GPU"``, ``"4 GPUs"``: a GPU count as the plans print it."""
    return f"{count} GPU" + ("" if count == 1 else "s")


def gpu_counts(max_gpus, gpus_per_host):
    """Candidate GPU counts: 1..g (one host), then every whole number of hosts up to max."""
    one_host = np.arange(1, min(gpus_per_host, max_gpus) + 1)
    hosts = np.arange(2, max_gpus // gpus_per_host + 1) * gpus_per_host
    return np.concatenate([one_host, hosts])


def grids(p, algorithm, g):
    """Row lengths X to try for ``algorithm`` on ``p`` GPUs with ``g`` per host (by its layout)."""
    layout = registry_entry(algorithm).layout
    if layout == "world":
        return [p]
    if layout == "hosts":
        return [g] if p > g and p % g == 0 else []
    small = [x for x in range(2, int(math.isqrt(p)) + 1) if p % x == 0]
    divisors = sorted(set(small + [p // x for x in small]))
    return [x for x in divisors if g % x == 0 or x % g == 0]


def topology_columns(counts, algorithms, g, gpus=True):
    """Arrays (p, algorithm index, X) of every (GPU count, algorithm, grid) candidate; on
    ``gpus`` (the NCCL backend) without the algorithms that run on MPI only."""
    rows = [(p, a, x) for p in counts.tolist() for a, name in enumerate(ALGORITHMS)
            if name in algorithms and not (gpus and registry_entry(name).mpi_only)
            for x in grids(p, name, g)]
    return tuple(np.array(c, dtype=int) for c in zip(*rows))


class UnsplittableBatch(ValueError):
    """No candidate (GPU count, per-GPU batch, accumulation steps) gives the target global
    batch exactly. ``below`` / ``above``: the nearest feasible global batches (None: none on
    that side); ``nearest``: the closer of the two (the smaller on a tie)."""

    def __init__(self, batch, below, above, candidates):
        self.batch, self.below, self.above = batch, below, above
        self.nearest = min((b for b in (below, above) if b is not None),
                           key=lambda b: (abs(b - batch), b))
        near = " and ".join(str(b) for b in (below, above) if b is not None)
        super().__init__(f"global batch {batch} cannot be split as GPUs x per-GPU batch x "
                         f"accumulation steps over the candidates ({candidates}); the nearest "
                         f"feasible global batch{'es are' if ' and ' in near else ' is'} {near}")


def _values(name, values):
    """``"per-GPU batches 1,2,4"``, or ``"GPU counts 1..4352 (1091 values)"`` for long lists."""
    values = sorted(set(int(v) for v in values))
    if len(values) <= 8:
        return f"{name} {','.join(map(str, values))}"
    return f"{name} {values[0]}..{values[-1]} ({len(values)} values)"


def batch_columns(p, target_batch, local_batches, accum_steps, max_local):
    """Pair each topology with batches: every (b, s) combination, or those giving the target.

    With a target, only exact splits count (``p * b * s == target_batch``, ``b <= max_local``);
    when there is none, UnsplittableBatch names the nearest feasible global batches (the
    planner never plans another batch than the one asked for; the caller may ask again).
    """
    if target_batch is None:
        b, s = np.meshgrid(local_batches, accum_steps)
        b, s = b.ravel(), s.ravel()
        return np.repeat(np.arange(len(p)), len(b)), np.tile(b, len(p)), np.tile(s, len(p))
    fits = np.asarray(local_batches)[np.asarray(local_batches) <= max_local]
    rows = [(i, b, s) for i, pi in enumerate(p.tolist()) for b in fits.tolist()
            for s in accum_steps if pi * b * s == target_batch]
    if not rows:
        feasible = np.unique(np.multiply.outer(np.multiply.outer(np.unique(p), fits),
                                               np.asarray(accum_steps)))
        below, above = feasible[feasible < target_batch], feasible[feasible > target_batch]
        raise UnsplittableBatch(int(target_batch), int(below[-1]) if below.size else None,
                                int(above[0]) if above.size else None,
                                f"{_values('GPU counts', p)}, "
                                f"{_values('per-GPU batches', fits)} (at most {max_local}), "
                                f"{_values('accumulation steps', accum_steps)}")
    return tuple(np.array(c, dtype=int) for c in zip(*rows))
