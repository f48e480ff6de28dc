"""Which grid and which groups (a ``collectives.Route``) one rank uses for each algorithm.

Each algorithm names its layout (``collectives.REGISTRY``): "world", "hosts" or "torus".
Shared by the communicator and the simulator's virtual ranks (``nnabla_torus.sim.virtual``), so
a simulated all-reduce is routed exactly as a real one. ``hosts`` is a ``topology.HostLayout``.
"""
from . import topology
from .collectives import DEFAULT_ALGORITHM, Route, registry_entry
from .job_log import WARNING, note


def grid_for(algorithm, request, hosts, size, quiet=False):
    """The grid of ``algorithm`` over ``size`` ranks; ``request``: a Grid, "XxY" or None (torus2d's
    default: rows of ranks per host when hosts hold consecutive ranks, else the squarest)."""
    layout = registry_entry(algorithm).layout
    if layout == "hosts":
        per_host = hosts.ranks_per_host
        if not per_host:
            counts = [len(h) for h in hosts.hosts]
            raise ValueError(f"hierarchical all-reduce needs the same number of ranks on "
                             f"every host; hosts hold {counts} ranks. Use torus2d with a grid.")
        return topology.Grid(per_host, len(hosts.hosts))
    if layout != "torus":
        return topology.Grid(size, 1)
    if request:
        grid = request if isinstance(request, topology.Grid) else topology.parse_grid(request)
        topology.check_grid(grid, size)
        return grid
    # Rows of X = ranks per host stay inside a host only when hosts hold consecutive ranks.
    per_host = hosts.ranks_per_host if hosts.is_blocked() else 0
    grid, text = topology.default_grid(size, per_host)
    if per_host == 0 and len(hosts.hosts) > 1:
        text = (f"ranks are not placed host by host ({hosts.hosts}): the default grid "
                f"{grid} ignores hosts; launch with --map-by slot or set NNABLA_TORUS_GRID")
    if text and not quiet:   # auto's torus2d candidate is no torus the user asked for
        note(text, WARNING)
    return grid


def share_memory(backend, hosts, group):
    """Map shared memory for ``group`` when its ranks run on one host (collective over its
    members; the MPI backend only). True when the group now shares memory."""
    share = getattr(backend, "share", None)
    return bool(share and not hosts.spans_hosts(group.ranks) and share(group))


def make_route(backend, hosts, rank, algorithm, grid):
    """The Route of ``rank`` for ``algorithm`` on ``grid`` (from ``grid_for``); creates the
    backend groups it needs (collective over their members)."""
    world = backend.world_group
    entry = registry_entry(algorithm)   # its layout, and whether it pipelines or shares memory
    layout = entry.layout
    if layout == "hosts":
        host = hosts.host_of(rank)
        local = host.index(rank)
        column = [h[local] for h in hosts.hosts]
        row = backend.group(host)
        return Route(world, row, backend.group(column),
                    shared=entry.shares_memory and share_memory(backend, hosts, row))
    if layout == "torus":
        row, column = grid.row_of(rank), grid.column_of(rank)
        # Overlapping pays when rows and columns use different links (in-host, inter-host);
        # only backends with run_lanes (MPI) can overlap.
        pipelined = (entry.pipelined and hasattr(backend, "run_lanes") and len(row) > 1
                     and len(column) > 1 and hosts.spans_hosts(column)
                     and not hosts.spans_hosts(row))
        row, column = backend.group(row), backend.group(column)
        # Pipelined routes overlap the row with the column over messages; else the row
        # goes through shared memory when its ranks share a host.
        return Route(world, row, column, pipelined, shared=not pipelined
                    and entry.shares_memory and share_memory(backend, hosts, row))
    return Route(world, world, None)


def host_rows(hosts, size):
    """auto's torus grid: one row per host (the row phase all in shared memory) when hosts
    hold the same number of consecutive ranks, else None (the default grid)."""
    per_host = hosts.ranks_per_host if hosts.is_blocked() else 0
    return topology.Grid(per_host, size // per_host) if per_host > 1 else None


def default_algorithm(backend, hosts, grid_request=None):
    """The algorithm when none was asked for: ``auto`` on MPI (never slower than the library's
    own all-reduce: native is one of its candidates), torus2d when a grid was asked for; on
    NCCL the torus only where it pays, over several hosts that hold consecutive ranks (rows
    inside a host on NVLink, columns across hosts), else NCCL's own all-reduce: on one host
    torus2d would be NCCL's reduce-scatter + all-gather over the world, with ~6n extra
    device bytes of nnabla's list copies, never faster than its all-reduce."""
    if grid_request:
        return "torus2d"
    if backend == "mpi":
        return DEFAULT_ALGORITHM
    several = len(hosts.hosts) > 1 and hosts.is_blocked() and (hosts.ranks_per_host or 0) > 1
    return "torus2d" if several else "native"
