"""All-reduce algorithms built from a backend's three primitives, and their registry.

Every algorithm sums a 1-D buffer in place over the ranks of a ``Plan`` (which groups to use).
A backend supplies ``reduce_scatter(group, buf)`` (returns our reduced chunk, a view),
``all_reduce(group, buf)``, ``all_gather(group, buf)`` and ``library_all_reduce(group, buf)``.

- ``ring``: reduce-scatter then all-gather over all p ranks: 2(p-1) steps, 2(p-1)/p * n bytes
  sent per rank.
- ``torus2d`` (Mikami et al. 2018), on an X x Y grid:
    1. reduce-scatter along the row (X ranks): each rank holds 1/X of the row's sum;
    2. all-reduce that shard along the column (Y ranks, ring);
    3. all-gather along the row.
  2(X-1) + 2(Y-1) steps instead of 2(p-1); the same bytes as the ring in total, but only
  2(Y-1)/(XY) * n of them cross the column links. A torus on Nx1 or 1xN is the ring.
  When the plan says ``pipelined`` (the column crosses hosts, the row does not; the backend
  has ``pieces`` and ``run_lanes``, as MPI does), large buffers are cut into pieces and the
  row phases of one piece overlap the column phase of another (``torus2d_lanes``). Inside one
  host both phases share the same cores and copies, so there is nothing to overlap.
  When the plan says ``shared`` (the row's ranks share one host's memory and the backend
  mapped it, ``MPIBackend.share``), the row phases go through shared memory instead
  (``shared_all_reduce``) with the column all-reduce in between; on one host with the
  default grid (X = p) that is the whole all-reduce. Pipelined plans keep messages.
- ``hierarchical``: the torus with rows = the ranks of one host and the column phase done by
  the library's own all-reduce (Horovod's hierarchical all-reduce); rows shared as above.
- ``native``: the library's own all-reduce over the world (``MPI_Allreduce`` or NCCL's).

Averages (``division=True``) divide the sum after it is complete: floating types multiply by
1/p; integer types take the floor of sum / p (numpy's ``//``: -7 // 2 == -4), and their sums
wrap on overflow as numpy's integer add does.
"""
from dataclasses import dataclass

import numpy as np


PIPELINE_BYTES = 8 << 20  # default size of the pieces of a pipelined torus2d (bytes)
# The algorithms' names, the one list of them. In this order the planner (planning/costmodel.py,
# planner.py) numbers them and breaks ties towards the earlier one; train.py broadcasts an index.
ALGORITHM_NAMES = ("ring", "torus2d", "hierarchical", "native")
AUTO = "auto"  # not a function: the communicator picks one of ALGORITHMS per call (auto.py)
# The algorithm when none is asked for, on the MPI backend (plans.default_algorithm).
DEFAULT_ALGORITHM = AUTO


@dataclass
class Plan:
    """The groups one rank uses: ``world``, and its ``row`` and ``column`` of the grid.

    ``pipelined``: torus2d overlaps its row and column phases on pieces of the buffer.
    ``shared``: the row's members share memory (the backend's ``shared_all_reduce``).
    """
    world: object
    row: object
    column: object
    pipelined: bool = False
    shared: bool = False


def scale_numpy(data, factor):
    """``data *= factor`` in place on a numpy array. Integer dtypes accept only factors 1/p (an
    average over p ranks): ``data //= p``, the floor, exact by that rule; anything else raises
    ValueError rather than truncating the factor to 0."""
    if not np.issubdtype(data.dtype, np.integer):
        np.multiply(data, data.dtype.type(factor), out=data)
        return
    divisor = round(1.0 / factor) if factor else 0
    if divisor < 1 or abs(divisor * factor - 1.0) > 1e-9:
        raise ValueError(f"cannot scale {data.dtype} data by {factor!r}: integer arrays are only "
                         f"averaged (factor 1/p, floor division by p)")
    np.floor_divide(data, divisor, out=data)


def ring(backend, plan, buf):
    backend.all_reduce(plan.world, buf, "ring all_reduce")


def torus2d(backend, plan, buf):
    if plan.shared:
        column = None if plan.column.size == 1 else (lambda shard: backend.all_reduce(
            plan.column, shard, "torus2d column all_reduce"))
        backend.shared_all_reduce(plan.row, buf, "torus2d row", column)
        return
    pieces = backend.pieces(buf) if plan.pipelined else [buf]
    if len(pieces) > 1:
        backend.run_lanes(torus2d_lanes(backend, plan, pieces))
        return
    shard = backend.reduce_scatter(plan.row, buf, "torus2d row reduce-scatter")
    backend.all_reduce(plan.column, shard, "torus2d column all_reduce")
    backend.all_gather(plan.row, buf, "torus2d row all-gather")


def torus2d_lanes(backend, plan, pieces):
    """The pipelined torus: three lanes that a backend's ``run_lanes`` advances together.

    Piece k goes through row reduce-scatter, column all-reduce and row all-gather in turn, but
    while the column (slow, inter-host) links carry piece k, the rows reduce-scatter piece k+1
    and all-gather piece k-1. With K pieces the time approaches
    row(n/K) + K * max(row, column)(n/K) + row(n/K) instead of the sum of the three phases.
    """
    count = len(pieces)
    shards = [None] * count   # piece k's row shard, once its reduce-scatter has finished
    summed = [0]              # pieces whose column all-reduce has finished

    def row_reduce_scatter():
        for k, piece in enumerate(pieces):
            shards[k] = yield from backend.reduce_scatter_steps(
                plan.row, piece, f"torus2d row reduce-scatter (piece {k + 1}/{count})")

    def column_all_reduce():
        for k in range(count):
            if shards[k] is None:
                yield (lambda k=k: shards[k] is not None), "", []
            yield from backend.all_reduce_steps(
                plan.column, shards[k], f"torus2d column all_reduce (piece {k + 1}/{count})")
            summed[0] = k + 1

    def row_all_gather():
        for k, piece in enumerate(pieces):
            if summed[0] <= k:
                yield (lambda k=k: summed[0] > k), "", []
            yield from backend.all_gather_steps(
                plan.row, piece, f"torus2d row all-gather (piece {k + 1}/{count})")

    return [column_all_reduce(), row_reduce_scatter(), row_all_gather()]


def hierarchical(backend, plan, buf):
    if plan.shared:
        column = None if plan.column.size == 1 else (lambda shard: backend.library_all_reduce(
            plan.column, shard, "hierarchical cross-host all_reduce"))
        backend.shared_all_reduce(plan.row, buf, "hierarchical host", column)
        return
    shard = backend.reduce_scatter(plan.row, buf, "hierarchical host reduce-scatter")
    backend.library_all_reduce(plan.column, shard, "hierarchical cross-host all_reduce")
    backend.all_gather(plan.row, buf, "hierarchical host all-gather")


def native(backend, plan, buf):
    backend.library_all_reduce(plan.world, buf, "native all_reduce")


# name -> function (each is defined above under its name), the torus first: the order that
# messages, choices and help texts list them in.
ALGORITHMS = {name: globals()[name]
              for name in sorted(ALGORITHM_NAMES, key=lambda name: name != "torus2d")}


def get_algorithm(name, allow_auto=False):
    """The all-reduce function registered as ``name`` (None for "auto" when ``allow_auto``);
    ValueError lists the known ones."""
    if allow_auto and name == AUTO:
        return None
    try:
        return ALGORITHMS[name]
    except KeyError:
        known = ", ".join(list(ALGORITHMS) + [AUTO] * allow_auto)
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose one of {known} "
                         f"(NNABLA_TORUS_ALGORITHM or algorithm=)") from None
