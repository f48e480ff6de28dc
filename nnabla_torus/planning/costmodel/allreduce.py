"""Seconds of one all-reduce, phase by phase, for each algorithm (ring, torus2d, hierarchical,
native) on a network; the sum is :func:`allreduce_time`.

``COSTS`` holds each algorithm's cost by its name in the communicator's registry
(``nnabla_torus.comm.collectives.REGISTRY``); importing this module fails when one has none.
"""
import numpy as np

from ...comm.topology import default_grid
from .han import with_han
from .links import call_waits, grid_links, intra_bandwidth, rack_links, rank_share
from .params import ALGORITHMS, Link, software_of
from .phases import native_terms, ring_phase, torus_terms


def default_grid_x(ranks, gpus_per_host):
    """Row length X of the communicator's default grid for each rank count (vectorised)."""
    p = np.asarray(ranks, int)
    unique, inverse = np.unique(p, return_inverse=True)
    xs = np.array([default_grid(int(n), gpus_per_host)[0].x for n in unique])
    return xs[inverse].reshape(p.shape)


def allreduce_terms(net, algorithm, ranks, nbytes, grid_x=None):
    """Seconds per phase of one all-reduce of ``nbytes`` over ``ranks``: {phase: array}.

    ``grid_x``: row length X for torus2d (default: the communicator's, topology.default_grid);
    ignored by ring and native, fixed to gpus_per_host by hierarchical. Raises ValueError for
    an unknown algorithm or an X that does not divide p.

    >>> from nnabla_torus.planning.costmodel import Network
    >>> net = Network(Link(1e-6, 1e9), Link(1e-6, 1e9), 0.0, 8, 8, 0, {})
    >>> t = allreduce_terms(net, "ring", 4, 4e6)   # 2 phases of 3 steps of (1us + 1ms)
    >>> round(float(sum(t.values())), 6)
    0.006006
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    p = np.asarray(ranks, int)
    g = net.gpus_per_host
    share = rank_share(p, g, net.slots_per_host)
    net = net._replace(intra=Link(net.intra.latency_s, intra_bandwidth(net, np.minimum(p, g),
                                                                      nbytes)))
    terms = _algorithm_terms(net, algorithm, p, nbytes, grid_x, share)
    zero = 0.0 * np.asarray(nbytes, float)
    terms.update({k: v + zero for k, v in call_waits(net, p, np.minimum(p, g), p > g).items()})
    return terms


def _algorithm_terms(net, algorithm, p, nbytes, grid_x, share):
    """allreduce_terms without the per-call oversubscription wait."""
    return COSTS[algorithm](net, p, nbytes, grid_x, share, software_of(net, algorithm))


def _world_ring_of(net, p):
    """(crosses hosts, flows out of a host, racks) of one ring or doubling over all p ranks."""
    return p > net.gpus_per_host, np.ones_like(p), rack_links(net, p, 1, rows=True)


def _grid_of(net, p, x, grid_x):
    """(X, Y, row (crosses, flows), column (crosses, flows), row racks, column racks) of a
    grid with rows of ``x``; ValueError unless x divides p (``grid_x``: the X asked for)."""
    g = net.gpus_per_host
    if np.any((x < 1) | (p % np.maximum(x, 1) != 0)):
        raise ValueError(f"grid row length X={grid_x} must divide the rank count {p}; "
                         f"pick X from the divisors of the rank count")
    y = p // x
    return (x, y, grid_links(x, y, g, rows=True), grid_links(x, y, g, rows=False),
            rack_links(net, x, y, rows=True), rack_links(net, x, y, rows=False))


def _torus_grid_of(net, p, grid_x):
    """_grid_of a grid of the torus layout: rows of ``grid_x`` (None: the communicator's
    default grid)."""
    x = default_grid_x(p, net.gpus_per_host) if grid_x is None else np.asarray(grid_x, int)
    return _grid_of(net, p, x, grid_x)


def ring_cost(net, p, nbytes, grid_x, share, sw):
    """ring: a reduce-scatter and an all-gather over all p ranks."""
    crosses, flows, racks = _world_ring_of(net, p)
    return {"reduce_scatter": ring_phase(net, p, nbytes, crosses, flows, share, True, sw,
                                         racks),
            "all_gather": ring_phase(net, p, nbytes, crosses, flows, share, False, sw,
                                     racks)}


def native_cost(net, p, nbytes, grid_x, share, sw):
    """native: the library's choice (Open MPI 5's coll/han where the net says so)."""
    g = net.gpus_per_host
    crosses, flows, racks = _world_ring_of(net, p)
    terms = native_terms(net, p, nbytes, crosses, flows, share, sw, g, g, racks)
    return with_han(net, p, nbytes, sw, terms) if net.native_hierarchical else terms


def torus2d_cost(net, p, nbytes, grid_x, share, sw):
    """torus2d on rows of ``grid_x`` (None: the communicator's default grid)."""
    x, y, rows, columns, row_racks, column_racks = _torus_grid_of(net, p, grid_x)
    return torus_terms(net, x, y, nbytes, share, sw, rows, columns, row_racks, column_racks)


def hierarchical_cost(net, p, nbytes, grid_x, share, sw):
    """hierarchical: rows = one host's ranks, the column phase by the library (native)."""
    x, y, (row_c, row_f), (col_c, col_f), row_r, col_r = _grid_of(
        net, p, np.minimum(p, net.gpus_per_host), grid_x)
    shard = np.asarray(nbytes, float) / x
    col = native_terms(net, y, shard, col_c, col_f, share, software_of(net, "native"),
                        np.where(col_c, 1, y), col_f, col_r)   # hierarchical: the library's
    col["recursive_doubling"] = np.where(y > 1, col["recursive_doubling"], 0.0)
    return {"row_reduce_scatter": ring_phase(net, x, nbytes, row_c, row_f, share, True, sw,
                                             row_r),
            **{"column_native_" + k: v for k, v in col.items()},
            "row_all_gather": ring_phase(net, x, nbytes, row_c, row_f, share, False, sw, row_r)}


# Each algorithm's cost, by its registry name (comm/collectives.py REGISTRY, which comm keeps:
# comm imports no planning): cost(net, p, nbytes, grid_x, share, software) -> {phase: seconds}.
COSTS = {"ring": ring_cost, "torus2d": torus2d_cost, "hierarchical": hierarchical_cost,
         "native": native_cost}
if set(ALGORITHMS) - set(COSTS):
    raise ImportError(f"no cost for algorithm(s) {sorted(set(ALGORITHMS) - set(COSTS))}: add "
                      f"each to COSTS in {__name__} (docs/contributing.md)")


def allreduce_time(net, algorithm, ranks, nbytes, grid_x=None):
    """Seconds of one all-reduce: the sum of :func:`allreduce_terms`."""
    return sum(allreduce_terms(net, algorithm, ranks, nbytes, grid_x).values())
