"""Where a ring phase runs: the ranks' share of a host, the links a phase crosses, the flows
that share them, and the waits of oversubscribed hosts.

Ranks are placed host by host (rank r on host r // gpus_per_host, mpirun --map-by slot); the
closed forms here are checked against the explicit :func:`ring_links` by the tests. Formulas:
docs/costmodel.md.
"""
import numpy as np


def rank_share(ranks, gpus_per_host, slots_per_host):
    """Fraction of full speed each rank gets: min(1, slots / ranks on its host); 1 if slots = 0."""
    on_host = np.minimum(np.asarray(ranks, float), gpus_per_host)
    if not slots_per_host:
        return np.ones_like(on_host)
    return np.minimum(1.0, slots_per_host / np.maximum(on_host, 1.0))


def ring_links(groups, host_of_rank):
    """Return (crosses hosts, flows out of the busiest host) for rings run at once.

    ``groups``: int array (rings, members), each row a ring in order; ``host_of_rank``: host id
    per rank. Reference implementation for any rank->host mapping (the vectorised model uses
    its closed form for the block mapping).

    >>> ring_links(np.arange(8).reshape(1, 8), np.arange(8) // 4)
    (True, 1)
    """
    groups = np.asarray(groups)
    hosts = np.asarray(host_of_rank)[groups]
    leaving = hosts != np.roll(hosts, -1, axis=1)
    if not leaving.any():
        return False, 0
    return True, int(np.bincount(hosts[leaving]).max())


def _explicit_links(x, y, g, rows):
    """ring_links of the rows (or columns) of an x-by-y grid under the block mapping."""
    grid = np.arange(x * y).reshape(y, x)
    return ring_links(grid if rows else grid.T, np.arange(x * y) // g)


def grid_links(x, y, g, rows):
    """Vectorised (crosses, flows) of the row or column phase of X x Y grids, block mapping.

    ``g``: ranks per unit (a host, or a rack: gpus_per_host x hosts_per_rack). When X divides
    g or g divides X: rows cross iff X > g with one flow, columns cross iff p > g with
    min(X, g) flows. Otherwise (p > g) rows straddle unit boundaries: a unit meets at most
    two straddling rows (one at each end), two when X > g and Y > 1, or X < g, p > 2g and
    m = X / gcd(X, g) >= 3 (the boundaries g and 2g both fall inside rows); else one.
    Columns keep min(X, g) flows while every column spans units (p - X >= g); shorter grids
    fall back to :func:`ring_links` (tests check every form against it).
    """
    shape = np.broadcast(np.asarray(x), np.asarray(y)).shape
    x, y = (np.broadcast_to(v, shape).astype(int).ravel() for v in (x, y))
    p = x * y
    odd = (p > g) & (x % g != 0) & (g % x != 0)
    if rows:
        m = x // np.gcd(x, g)
        two = np.where(x > g, y > 1, (m >= 3) & (p > 2 * g))
        crosses, flows = (x > g) | odd, np.where(odd & two, 2, 1)
        odd = np.zeros_like(odd)
    else:
        crosses, flows = (p > g) & (y > 1), np.minimum(x, g)
        odd &= p - x < g
    for i in np.flatnonzero(odd):
        crosses[i], flows[i] = _explicit_links(int(x[i]), int(y[i]), g, rows)
    return crosses.reshape(shape), flows.reshape(shape)


def rack_links(net, x, y, rows):
    """(crosses racks, flows out of the busiest rack) of the row or column phase of X x Y grids.

    :func:`grid_links` with racks for hosts; (False, 0) when the net has no rack level.
    """
    if not net.hosts_per_rack:
        return False, 0
    return grid_links(x, y, net.gpus_per_host * net.hosts_per_rack, rows)


def intra_bandwidth(net, on_host, nbytes):
    """Effective intra-host bytes/s for an all-reduce of ``nbytes`` with ``on_host`` ranks a host.

    Blends cache and link bandwidth by the fraction of the working set (2 n per rank: buffer
    and received chunks) that fits in ``cache_bytes``.
    """
    if not net.cache_bytes:
        return net.intra.bandwidth_Bps
    working = 2.0 * np.asarray(on_host, float) * np.maximum(np.asarray(nbytes, float), 1.0)
    f = np.minimum(1.0, net.cache_bytes / working)
    return 1.0 / (f / net.cache_bandwidth_Bps + (1.0 - f) / net.intra.bandwidth_Bps)


def call_waits(net, ranks, on_host, spans_hosts):
    """Per-call waits of oversubscribed hosts: {term: seconds}, only the terms the net has.

    With o = ``on_host`` / slots_per_host > 1 (ranks share cores) and p > 1:
    ``oversubscription_wait`` = oversubscribed_wait_s, and where ``spans_hosts``
    ``oversubscription_hosts_wait`` = (o - 1) * oversubscribed_hosts_wait_s. The second is
    per call, not per step: on the emulated cluster (2 cores for 8 or 16 ranks) 4-64 KiB
    all-reduces exceeded the model by about the same time whatever their step count (ring 30
    steps, hierarchical 5, native ~10): 3-4 ms at o = 4, ~20 ms at o = 8. Fitted there
    (78 records, least squares on log time, with o - 1: 1.79 ms; a per-step o * w fitted
    worse, median error 24 % against 13 % on ring, torus2d and hierarchical); o^2 or
    o(o - 1) fit as well, the data has only o = 4 and 8.

    >>> from nnabla_torus.planning.costmodel import Link, Network
    >>> net = Network(Link(0, 1e9), Link(0, 1e9), 0, 4, 1, 0, {}, oversubscribed_hosts_wait_s=1e-3)
    >>> {k: float(v) for k, v in call_waits(net, 8, 4, True).items()}
    {'oversubscription_hosts_wait': 0.003}
    """
    p = np.asarray(ranks)
    crowded = (net.slots_per_host > 0) & (np.asarray(on_host) > net.slots_per_host) & (p > 1)
    waits = {}
    if net.oversubscribed_wait_s:
        waits["oversubscription_wait"] = np.where(crowded, net.oversubscribed_wait_s, 0.0)
    if net.oversubscribed_hosts_wait_s:
        extra = np.asarray(on_host, float) / (net.slots_per_host or 1) - 1.0
        waits["oversubscription_hosts_wait"] = np.where(
            crowded & np.asarray(spans_hosts), extra * net.oversubscribed_hosts_wait_s, 0.0)
    return waits
