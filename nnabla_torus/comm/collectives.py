"""All-reduce algorithms built from a backend's three primitives, and their registry.

``REGISTRY`` (at the end) is the one place that names each algorithm's parts: its function,
its layout (which grid and groups, grid_layouts.py), where ``auto`` may pick it, whether it is
ours (the simulator runs it, calibrate fits it) and cuts pieces. The layers above read an
entry by name (the planner's grids, the simulator, the plan CLI); the cost model, in planning,
which this layer may not import, keys each cost by the same name (``COSTS`` in
planning/costmodel/allreduce.py, checked complete at import). So a new algorithm is a function
and an entry here plus a cost there: docs/contributing.md#add-an-all-reduce-algorithm.

Every algorithm sums a 1-D buffer in place over the ranks of a ``Route`` (which groups to use).
A backend supplies ``reduce_scatter(group, buf)`` (returns our reduced chunk, a view),
``all_reduce(group, buf)``, ``all_gather(group, buf)`` and ``library_all_reduce(group, buf)``.
The algorithms: ``ring``, ``torus2d`` (Mikami et al. 2018: reduce-scatter along the row,
all-reduce the shard along the column, all-gather along the row), ``hierarchical`` (rows = one
host's ranks, the column by the library) and ``native``; the README's algorithms table gives
their steps and bytes. A ``pipelined`` route overlaps the row phases of one piece with the column
phase of another (``torus2d_lanes``), a ``shared`` one runs the row phases through shared memory
(``shared_all_reduce``): docs/communicator.md#algorithms-in-detail. Averages
(``division=True``) divide the complete sum: floating types multiply by 1/p, integer types take
the floor of sum / p (docs/communicator.md#data-types).
"""
from dataclasses import dataclass

import numpy as np


PIPELINE_BYTES = 8 << 20  # default size of the pieces of a pipelined torus2d (bytes)
AUTO = "auto"  # not a function: the communicator picks one of ALGORITHMS per call (auto.py)
# The algorithm when none is asked for, on the MPI backend (grid_layouts.default_algorithm).
DEFAULT_ALGORITHM = AUTO


@dataclass
class Route:
    """The route of one rank's all-reduce: the groups it uses, ``world`` and its ``row`` and
    ``column`` of the grid (grid_layouts.make_route), and how the buffer moves through them.

    ``pipelined``: torus2d overlaps its row and column phases on pieces of the buffer.
    ``shared``: the row's members share memory (the backend's ``shared_all_reduce``).
    """
    world: object
    row: object
    column: object
    pipelined: bool = False
    shared: bool = False


def mpi_sum_dtype(dtype):
    """The dtype in which the MPI library must sum ``dtype``: int64 for 8- and 16-bit integers,
    else ``dtype`` itself. Open MPI 5's vectorised reductions (its op/avx component) add them
    with saturating instructions: 200 + 100 + 50 as uint8 gave 255 from ``MPI_Allreduce`` of 64
    elements (mpi4py 4.1, Open MPI 5.0 from the registry; 94 for 3 elements, and with
    ``OMPI_MCA_op=^avx``), where numpy and our own reductions wrap to 94. Summed in int64 and
    written back with numpy's cast, they wrap on every backend and algorithm."""
    dtype = np.dtype(dtype)
    return np.dtype(np.int64) if dtype.kind in "iu" and dtype.itemsize < 4 else dtype


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


def ring(backend, route, buf):
    backend.all_reduce(route.world, buf, "ring all_reduce")


def torus2d(backend, route, buf):
    if route.shared:
        column = None if route.column.size == 1 else (lambda shard: backend.all_reduce(
            route.column, shard, "torus2d column all_reduce"))
        backend.shared_all_reduce(route.row, buf, "torus2d row", column)
        return
    pieces = backend.pieces(buf) if route.pipelined else [buf]
    if len(pieces) > 1:
        backend.run_lanes(torus2d_lanes(backend, route, pieces))
        return
    shard = backend.reduce_scatter(route.row, buf, "torus2d row reduce-scatter")
    backend.all_reduce(route.column, shard, "torus2d column all_reduce")
    backend.all_gather(route.row, buf, "torus2d row all-gather")


def torus2d_lanes(backend, route, pieces):
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
                route.row, piece, f"torus2d row reduce-scatter (piece {k + 1}/{count})")

    def column_all_reduce():
        for k in range(count):
            if shards[k] is None:
                yield (lambda k=k: shards[k] is not None), "", []
            yield from backend.all_reduce_steps(
                route.column, shards[k], f"torus2d column all_reduce (piece {k + 1}/{count})")
            summed[0] = k + 1

    def row_all_gather():
        for k, piece in enumerate(pieces):
            if summed[0] <= k:
                yield (lambda k=k: summed[0] > k), "", []
            yield from backend.all_gather_steps(
                route.row, piece, f"torus2d row all-gather (piece {k + 1}/{count})")

    return [column_all_reduce(), row_reduce_scatter(), row_all_gather()]


def hierarchical(backend, route, buf):
    if route.shared:
        column = None if route.column.size == 1 else (lambda shard: backend.library_all_reduce(
            route.column, shard, "hierarchical cross-host all_reduce"))
        backend.shared_all_reduce(route.row, buf, "hierarchical host", column)
        return
    shard = backend.reduce_scatter(route.row, buf, "hierarchical host reduce-scatter")
    backend.library_all_reduce(route.column, shard, "hierarchical cross-host all_reduce")
    backend.all_gather(route.row, buf, "hierarchical host all-gather")


def native(backend, route, buf):
    backend.library_all_reduce(route.world, buf, "native all_reduce")


def everywhere(hosts):
    """auto may pick the algorithm on any hosts."""
    return True


def across_hosts(hosts):
    """auto may pick the algorithm on several hosts that hold the same number of ranks each."""
    return bool(len(hosts.hosts) > 1 and hosts.ranks_per_host)


@dataclass(frozen=True)
class Algorithm:
    """One all-reduce algorithm's parts in this layer, read by name by the layers above too.

    ``function(backend, route, buf)``: its steps (above). ``layout``: its grid and groups
    (grid_layouts.py), the planner's candidate grids (planner.grids): "world" (p x 1, every
    rank in one group), "hosts" (rows = one host's ranks, columns across hosts) or "torus"
    (any X x Y: asked for, else the default grid). ``auto(hosts)``: True where auto may pick
    it over native, auto's baseline (None: never; comm/auto/routing.py). ``ours``: built here
    from the backend's primitives, not the library's own: the simulator runs it (sim/), and
    tools/calibrate.py fits its software term. ``pipelined``: its routes may cut large buffers
    into pieces whose phases overlap (``Route.pipelined``, NNABLA_TORUS_PIPELINE_BYTES); the
    simulator sizes its buffers so. ``shares_memory``: its routes may run the row phases through
    shared memory (``Route.shared``: ``backend.shared_all_reduce``). ``mpi_only``: it needs the
    MPI backend's own methods (e.g. ``run_lanes``, ``*_steps``): refused on other backends
    (``check_backend``), left out of auto's candidates there and of plans for GPU profiles.
    """
    function: object
    layout: str
    auto: object = None
    ours: bool = True
    pipelined: bool = False
    shares_memory: bool = False
    mpi_only: bool = False

    @property
    def takes_grid(self):
        """It runs on the X x Y grid a user asks for (NNABLA_TORUS_GRID, grid=, --grid)."""
        return self.layout == "torus"


# Every algorithm, the one list of them: its parts in one entry; its cost, by the same name, in
# planning/costmodel/allreduce.py (COSTS); docs/contributing.md#add-an-all-reduce-algorithm. In
# this order the planner (planning/costmodel/, planner.py) numbers them and breaks ties towards
# the earlier one; train.py broadcasts an index: a new algorithm goes last.
REGISTRY = {
    "ring": Algorithm(ring, "world"),
    "torus2d": Algorithm(torus2d, "torus", auto=everywhere, pipelined=True,
                         shares_memory=True),
    "hierarchical": Algorithm(hierarchical, "hosts", auto=across_hosts, shares_memory=True),
    "native": Algorithm(native, "world", ours=False),
}
ALGORITHM_NAMES = tuple(REGISTRY)
OURS = tuple(name for name, algorithm in REGISTRY.items() if algorithm.ours)
# name -> function, the torus first: the order that messages, choices and help texts list them in.
ALGORITHMS = {name: REGISTRY[name].function
              for name in sorted(ALGORITHM_NAMES, key=lambda name: name != "torus2d")}


def get_algorithm(name, allow_auto=False):
    """The all-reduce function registered as ``name`` (None for "auto" when ``allow_auto``);
    ValueError lists the known ones."""
    entry = registry_entry(name, allow_auto)
    return entry and entry.function


def run_algorithm(backend, name, route, buf, checking=""):
    """Run algorithm ``name`` on ``buf`` with ``route``. The argument check of the call
    ``checking`` still pending (``guarded_calls.collective``, ``fold``) goes first, unless the
    algorithm's first synchronisation is the group's own shared arrival (a shared row over the
    whole group), which carries it."""
    if getattr(route.world, "check_value", 0) and not (route.shared and route.row is route.world):
        backend.check_arrival(route.world, checking)
    get_algorithm(name)(backend, route, buf)


def registry_entry(name, allow_auto=False):
    """The ``Algorithm`` registered as ``name`` (None for "auto" when ``allow_auto``);
    ValueError lists the known ones."""
    if allow_auto and name == AUTO:
        return None
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(list(ALGORITHMS) + [AUTO] * allow_auto)
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose one of {known} "
                         f"(NNABLA_TORUS_ALGORITHM or algorithm=)") from None


def check_backend(name, backend):
    """ValueError, one line, when algorithm ``name`` cannot run on ``backend`` (its name)."""
    entry = registry_entry(name, allow_auto=True)
    if entry is not None and entry.mpi_only and backend != "mpi":
        usable = ", ".join(n for n in ALGORITHMS if not REGISTRY[n].mpi_only)
        raise ValueError(f"all-reduce algorithm {name!r} runs on the MPI backend only, not on "
                         f"{backend!r}; choose one of {usable} or NNABLA_TORUS_BACKEND=mpi")
