"""Cost model: predicted time of each all-reduce algorithm and of a data-parallel training step.

Pure numpy and vectorised: every function takes scalars or arrays for ranks, bytes, grid rows
and batches, and broadcasts them. Units: seconds, bytes, bytes per second, samples.

Network (two link levels, a reduction cost, ranks placed host by host)::

    rank r runs on host r // gpus_per_host (mpirun --map-by slot)
    one hop of m bytes over a link:   latency_s + m / bandwidth_Bps
    adding m received bytes:          m * reduce_s_per_byte

A ring phase of k members on a buffer of m bytes per member takes k - 1 steps of m/k bytes
each; all rings of a phase run at once and a phase is paced by its slowest link (*derived*)::

    step = max(intra hop, inter hop if the phase crosses hosts) + reduce + software
    intra hop = (intra.latency_s + (m/k) / B_intra) / share
    inter hop = inter.latency_s + (m/k) * flows / inter.bandwidth_Bps
    reduce    = (m/k) * reduce_s_per_byte / share          (reduce-scatter steps only)
    software  = (step_s + (m/k) * s_per_byte) / share      (the algorithm's implementation)
    share     = min(1, slots_per_host / ranks on a host)   (ranks sharing CPU cores or copy engines)
    flows     = ring edges leaving the busiest host at once (they share the host's NICs)
    1/B_intra = f / cache_bandwidth_Bps + (1 - f) / intra.bandwidth_Bps, with the fraction of
                the host's working set in cache f = min(1, cache_bytes / (2 n ranks on host))
                (f = 0 when cache_bytes = 0: GPUs, or no cache level modelled)

plus, once per call when a host has more ranks than slots (o = ranks on a host / slots > 1),
``oversubscribed_wait_s`` (ranks wait for descheduled peers: about one scheduler time slice,
fitted on one host) and, when the job also spans hosts, ``(o - 1) * oversubscribed_hosts_wait_s``
(fitted on emulated hosts: whatever its step count, a call waits ~1.8 ms, about a scheduler
time slice, for each other rank sharing a core; see :func:`call_waits`).

With a rack level (``hosts_per_rack`` > 0; ranks fill racks in order, rack of rank r =
r // (gpus_per_host * hosts_per_rack)) a ring phase whose rings leave a rack also pays the
rack's uplink to the spine, shared by every ring edge leaving the busiest rack at once::

    spine hop = spine.latency_s + (m/k) * rack_flows * oversubscription
                                   / (hosts_per_rack * spine.bandwidth_Bps)
    step      = max(intra hop, inter hop, spine hop if the phase crosses racks) + ...

(``spine.bandwidth_Bps``: per host, what full bisection would give; ABCI's rack has 1/3 of
it, ``oversubscription`` 3.) For an X x Y torus the row phase crosses racks only when a row
is longer than a rack; the columns cross as soon as the job spans racks, with min(X, ranks
per rack) flows out of a rack: long rows (X = a rack) make the columns' few bytes share one
uplink, short rows keep the uplink light but run more column steps. Not modelled across
racks: recursive doubling (native below ``native_switch_bytes``) and coll/han.

so with one link level (one host, share 1, no software cost) a reduce-scatter plus all-gather
ring costs 2(p-1)(a + n/(pB)) + (p-1)/p n c: bandwidth term 2(p-1)/p * n/B, the lower bound
of Patarasuk & Yuan 2009.

Algorithms (grid X x Y: Y rows of X consecutive ranks, p = X*Y, see topology.Grid):

- ``ring``: reduce-scatter then all-gather over all p ranks (= torus2d on p x 1 or 1 x p).
- ``torus2d``: row reduce-scatter (X members, n bytes), column reduce-scatter + all-gather
  (Y members, n/X bytes each), row all-gather. Rows cross hosts only when X > gpus_per_host;
  each host sends min(X, gpus_per_host) column flows at once. With ``torus_pipeline_bytes``
  (the MPI backend's pieces) and rows inside a host but columns across hosts, the buffer goes
  in K = ceil(n / pipeline) pieces whose row and column phases overlap, see
  :func:`torus_terms`.
- ``hierarchical``: torus2d with X = gpus_per_host whose column all-reduce is the MPI
  library's own (``native`` on n/X bytes), as our communicator implements it.
- ``native``: the library's algorithm, modelled on Open MPI's fixed decision (coll/tuned):
  recursive doubling below ``native_switch_bytes`` (floor(lg p) exchanges of all n bytes, plus
  2 when p is not a power of two), ring at and above it (as NCCL does for large messages).
  Its real choice is more detailed (Rabenseifner, segmented ring); calibration absorbs the
  difference in native's software cost per byte. With ``native_hierarchical`` (Open MPI 5 on
  CPUs) a job on several hosts runs coll/han's pipeline instead, see :func:`han_terms`.

Example::

    >>> net = Network(Link(5e-6, 150e9), Link(5e-6, 25e9), 0.0, 4, 4, 10000, {})
    >>> float(allreduce_time(net, "ring", 8, 1 << 20)) > 0
    True
"""
from collections import namedtuple

import numpy as np

from ..comm.collectives import ALGORITHM_NAMES as ALGORITHMS  # in the planner's order
from ..comm.topology import default_grid

Link = namedtuple("Link", [
    "latency_s",       # a: seconds per hop, whatever its size
    "bandwidth_Bps",   # B: bytes per second; a hop of m bytes costs a + m / B
])

Network = namedtuple("Network", [
    "intra",                # Link between ranks of one host (NVLink, shared memory)
    "inter",                # Link between hosts; bandwidth = the host's total NIC bandwidth
    "reduce_s_per_byte",    # c: seconds to add one received byte into the local buffer
    "gpus_per_host",        # g: ranks per host; rank r lives on host r // g
    "slots_per_host",       # ranks of a host that move/add data at full speed at once (cores)
    "native_switch_bytes",  # native: recursive doubling below this size, ring at or above
    "software",             # {algorithm: Software}: implementation cost per step (default 0)
    "oversubscribed_wait_s",  # seconds per call when ranks on a host > slots (default 0)
    "cache_bytes",            # last-level cache shared by a host's ranks (default 0: none)
    "cache_bandwidth_Bps",    # intra-host bandwidth while the working set fits in cache
    "native_hierarchical",    # native on several hosts is Open MPI 5's coll/han (default False)
    "oversubscribed_hosts_wait_s",  # per call and extra rank per slot, job on 2+ hosts (default 0)
    "torus_pipeline_bytes",   # torus2d pieces whose phases overlap (default 0: no pieces)
    "hosts_per_rack",         # hosts under one leaf level (default 0: no rack level)
    "spine",                  # Link between racks; bandwidth per host before oversubscription
    "oversubscription",       # rack downlink / uplink bandwidth (ABCI: 3)
], defaults=[0.0, 0, 0.0, False, 0.0, 0, 0, None, 1.0])

Software = namedtuple("Software", [
    "step_s",       # seconds per ring or doubling step (calls, Python, synchronisation)
    "s_per_byte",   # seconds per byte sent in a step (copies, packing), on top of the link
])
NO_SOFTWARE = Software(0.0, 0.0)

Compute = namedtuple("Compute", [
    "a_s",                # fixed time of one forward+backward+update, seconds
    "b_s",                # seconds per sample: T_c(b) = a_s + b_s * b
    "gamma",              # overlap exponent: T = (T_c^gamma + T_n^gamma)^(1/gamma); 1 = none
    "max_local_batch",    # largest per-GPU batch that fits in memory (samples)
    "grad_bytes",         # bytes all-reduced per step (parameters x bytes per element)
    "slots_per_host",     # ranks of a host that compute at full speed at once (0: no sharing)
])


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


def ring_phase(net, members, nbytes, crosses, flows, share, reduce, sw, racks=(False, 0)):
    """Seconds of one ring reduce-scatter (``reduce``) or all-gather phase; see module doc.

    ``racks``: (crosses racks, flows out of the busiest rack), see :func:`rack_links`.
    """
    k = np.asarray(members, float)
    chunk = np.asarray(nbytes, float) / np.maximum(k, 1.0)
    intra = (net.intra.latency_s + chunk / net.intra.bandwidth_Bps) / share
    inter = net.inter.latency_s + chunk * np.maximum(flows, 1) / net.inter.bandwidth_Bps
    hop = np.where(crosses, np.maximum(intra, inter), intra)
    if net.hosts_per_rack:
        uplink = net.hosts_per_rack * net.spine.bandwidth_Bps / net.oversubscription
        spine = net.spine.latency_s + chunk * np.maximum(racks[1], 1) / uplink
        hop = np.where(racks[0], np.maximum(hop, spine), hop)
    add = chunk * net.reduce_s_per_byte / share if reduce else 0.0
    software = (sw.step_s + chunk * sw.s_per_byte) / share
    return (k - 1) * (hop + add + software)


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


def doubling_phase(net, ranks, nbytes, share, sw, per_host, flows):
    """Seconds of recursive doubling: floor(lg p) exchanges of n bytes (+2 if p not 2^k).

    Exchange j pairs members 2^j apart: inside a host while 2^j < ``per_host`` (members of
    the group per host), else across hosts with ``flows`` ranks of a host sending at once.
    """
    p = np.maximum(np.asarray(ranks, float), 1.0)
    n = np.asarray(nbytes, float)
    levels = np.floor(np.log2(p))
    extra = np.where(2.0 ** levels < p, 2.0, 0.0)
    local = np.minimum(levels, np.floor(np.log2(np.maximum(per_host, 1))))
    intra = (net.intra.latency_s + n / net.intra.bandwidth_Bps) / share
    inter = np.maximum(intra, net.inter.latency_s + n * flows / net.inter.bandwidth_Bps)
    extra_hop = np.where(p > per_host, inter, intra)
    add = n * net.reduce_s_per_byte / share
    return (local * intra + (levels - local) * inter + extra * extra_hop
            + (levels + extra) * (add + (sw.step_s + n * sw.s_per_byte) / share))


def software_of(net, algorithm):
    """The Software cost of ``algorithm`` in ``net`` (zero when the profile gives none)."""
    return (net.software or {}).get(algorithm, NO_SOFTWARE)


HAN_SEGMENT_BYTES = 64 << 10    # Open MPI 5 coll_han_allreduce_segsize (default)
CHAIN_FRAGMENT_BYTES = 8 << 10  # libnbc ibcast chain fragment for 64-512 KiB messages


def _han_leader_bytes(hosts):
    """Bytes per segment byte through the busiest leader's link in one direction (ur + ub).

    ur (libnbc ireduce to leader 0): reduce-scatter + gather (H > 2) sends (H-1)/H and
    receives 2(H-1)/H at the root; a chain (H = 2) receives 1 = 2(H-1)/H. ub (libnbc ibcast
    from leader 0): linear (H <= 4) sends H - 1 copies, a chain (H > 4) sends 1.
    """
    h = np.asarray(hosts, float)
    out = np.where(h > 2, (h - 1) / h, 0.0) + np.where(h <= 4, h - 1, 1.0)
    return np.maximum(out, 2 * (h - 1) / h)


def han_terms(net, ranks, nbytes, sw):
    """native on several hosts as Open MPI 5's coll/han runs it: {han phase: seconds}.

    han (``mca_coll_han_allreduce_intra``, the default when a communicator spans hosts and
    some host has 2+ ranks) cuts the n bytes into segments of m = 64 KiB; each segment goes
    through 4 stages, g ranks per host, H = ceil(p/g) hosts, one leader per host:

    1. lr: in-host reduce to the leader (coll/tuned: linear below 4 ranks, binomial from 4:
       r = g-1 or ceil(lg g) rounds of one hop + one add);
    2. ur: leaders' reduce to leader 0 (libnbc ireduce: chain for H = 2, else reduce-scatter
       + gather: 2 ceil(lg H) rounds, 2(H-1)/H m bytes into leader 0);
    3. ub: leaders' bcast from leader 0 (libnbc ibcast: linear for H <= 4, leader 0 sends
       H-1 copies; above, binomial below 64 KiB, else a chain of 8 KiB fragments, H-1 hops);
    4. lb: in-host bcast from the leader (coll/tuned: the leader sends g-1 copies).

    Iteration k issues ub(k+1) and ur(k+2) (non-blocking), runs lr(k+3), waits, then lb(k)
    ([Open MPI v5.0.10, ompi/mca/coll/han/coll_han_allreduce.c]), so::

        T = fill + (n - m)/m * (max(lr, up) + lb)           (segments after the first)
        fill = lr(m1) + ur(m1) + ub(m1) + lb(m1)              (m1 = min(n, 64 KiB))
        up   = b(H) m / inter.B + rounds * inter.latency     (ur and ub at once)
        b(H) = max(ur + ub bytes out of, into leader 0) / m  (:func:`_han_leader_bytes`)

    The fill's hops are the flat native's (intra: (latency + bytes/B) / share). In the
    pipeline the in-host stages cost their copies and adds only (no hop latency: 100 MiB on
    2 emulated hosts x 4 ranks took 0.57 ms per segment, 0.52 ms of it on the link), done by
    one rank of the host at a time (the others wait in MPI), at speed min(1, slots_per_host).
    Not modelled: Rabenseifner's extra step for H not a power of two, uneven hosts (han
    assumes even ones), the CPU that TCP itself takes on emulated hosts.

    >>> net = Network(Link(0.0, 1e9), Link(0.0, 1e8), 0.0, 2, 2, 0, {}, native_hierarchical=True)
    >>> t = han_terms(net, 4, 1 << 20, NO_SOFTWARE)   # 2 hosts x 2 ranks, 16 segments
    >>> round(float(t["han_pipeline"]), 5)   # 15 x (64 KiB over the link + a 64 KiB copy)
    0.01081
    """
    p = np.asarray(ranks, float)
    g = float(net.gpus_per_host)
    h = np.ceil(p / g)
    n = np.asarray(nbytes, float)
    share = rank_share(p, net.gpus_per_host, net.slots_per_host)
    speed = min(1.0, net.slots_per_host) if net.slots_per_host else 1.0
    c, b_in, b_out = net.reduce_s_per_byte, net.intra.bandwidth_Bps, net.inter.bandwidth_Bps
    lat_in, lat_out = net.intra.latency_s, net.inter.latency_s

    def soft(m):
        return sw.step_s + m * sw.s_per_byte

    reduce_rounds = g - 1 if g < 4 else np.ceil(np.log2(g))
    lg_h = np.ceil(np.log2(np.maximum(h, 2)))
    ur_rounds = np.where(h > 2, 2 * lg_h, 1.0)
    ur_adds = np.where(h > 2, (h - 1) / h, 1.0)

    def ub_time(m):
        chain = (h - 1) * lat_out + (m + (h - 2) * CHAIN_FRAGMENT_BYTES) / b_out
        binomial = lg_h * (lat_out + m / b_out)
        linear = lat_out + (h - 1) * m / b_out
        return np.where(h <= 4, linear, np.where(m < HAN_SEGMENT_BYTES, binomial, chain))

    m1 = np.minimum(n, HAN_SEGMENT_BYTES)
    fill = {"han_in_host_reduce": reduce_rounds * (lat_in + m1 / b_in + m1 * c + soft(m1)) / share,
            "han_leaders_reduce": (ur_rounds * lat_out + 2 * (h - 1) / h * m1 / b_out
                                   + ur_adds * m1 * c / speed),
            "han_leaders_bcast": ub_time(m1),
            "han_in_host_bcast": (lat_in + (g - 1) * m1 / b_in + soft(m1)) / share}
    m = float(HAN_SEGMENT_BYTES)
    lr = reduce_rounds * (m / b_in + m * c + soft(m)) / speed
    lb = ((g - 1) * m / b_in + soft(m)) / speed
    ub_rounds = np.where(h <= 4, 1.0, h - 1)   # linear: one round; chain: H - 1 hops
    up = (_han_leader_bytes(h) * m / b_out + np.maximum(ur_rounds, ub_rounds) * lat_out
          + ur_adds * m * c / speed)
    fill["han_pipeline"] = np.maximum(n - m, 0.0) / m * (np.maximum(lr, up) + lb)
    return fill


def _native_terms(net, ranks, nbytes, crosses, flows, share, sw, per_host, pair_flows,
                  racks=(False, 0)):
    """native: {recursive_doubling, reduce_scatter, all_gather}, zeros where unused.

    ``flows``: ring flows per host; ``per_host``, ``pair_flows``: see :func:`doubling_phase`;
    ``racks``: the ring's, see :func:`ring_phase`.
    """
    small = np.asarray(nbytes) < net.native_switch_bytes
    doubling = doubling_phase(net, ranks, nbytes, share, sw, per_host, pair_flows)
    rs = ring_phase(net, ranks, nbytes, crosses, flows, share, True, sw, racks)
    ag = ring_phase(net, ranks, nbytes, crosses, flows, share, False, sw, racks)
    return {"recursive_doubling": np.where(small, doubling, 0.0),
            "reduce_scatter": np.where(small, 0.0, rs),
            "all_gather": np.where(small, 0.0, ag)}


def _with_han(net, ranks, nbytes, sw, flat):
    """Flat native terms where the job fits one host (or hosts have one rank), han's elsewhere.

    Open MPI disables han on a communicator inside one host or with one rank per host
    (coll_han_module.c, coll_han_subcomms.c), so those keep coll/tuned's flat algorithm.
    """
    on_han = (np.asarray(ranks) > net.gpus_per_host) & (net.gpus_per_host > 1)
    han = han_terms(net, ranks, nbytes, sw)
    return {**{k: np.where(on_han, 0.0, v) for k, v in flat.items()},
            **{k: np.where(on_han, v, 0.0) for k, v in han.items()}}


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


def _algorithm_terms(net, algorithm, p, nbytes, grid_x, share):
    """allreduce_terms without the per-call oversubscription wait."""
    g = net.gpus_per_host
    sw = software_of(net, algorithm)
    if algorithm in ("ring", "native"):
        crosses, flows = p > g, np.ones_like(p)
        racks = rack_links(net, p, 1, rows=True)
        if algorithm == "native":
            terms = _native_terms(net, p, nbytes, crosses, flows, share, sw, g, g, racks)
            return _with_han(net, p, nbytes, sw, terms) if net.native_hierarchical else terms
        return {"reduce_scatter": ring_phase(net, p, nbytes, crosses, flows, share, True, sw,
                                             racks),
                "all_gather": ring_phase(net, p, nbytes, crosses, flows, share, False, sw,
                                         racks)}
    if algorithm == "hierarchical":
        x = np.minimum(p, g)
    elif grid_x is None:
        x = default_grid_x(p, g)
    else:
        x = np.asarray(grid_x, int)
    if np.any((x < 1) | (p % np.maximum(x, 1) != 0)):
        raise ValueError(f"grid row length X={grid_x} must divide the rank count {p}; "
                         f"pick X from the divisors of the rank count")
    y = p // x
    shard = np.asarray(nbytes, float) / x
    row_c, row_f = grid_links(x, y, g, rows=True)
    col_c, col_f = grid_links(x, y, g, rows=False)
    row_r, col_r = rack_links(net, x, y, rows=True), rack_links(net, x, y, rows=False)
    if algorithm == "torus2d":
        return torus_terms(net, x, y, nbytes, share, sw, (row_c, row_f), (col_c, col_f),
                           row_r, col_r)
    col = _native_terms(net, y, shard, col_c, col_f, share, software_of(net, "native"),
                        np.where(col_c, 1, y), col_f, col_r)   # hierarchical: the library's
    col["recursive_doubling"] = np.where(y > 1, col["recursive_doubling"], 0.0)
    return {"row_reduce_scatter": ring_phase(net, x, nbytes, row_c, row_f, share, True, sw,
                                             row_r),
            **{"column_native_" + k: v for k, v in col.items()},
            "row_all_gather": ring_phase(net, x, nbytes, row_c, row_f, share, False, sw, row_r)}


def torus_terms(net, x, y, nbytes, share, sw, row_links, col_links, row_racks=(False, 0),
                col_racks=(False, 0)):
    """torus2d terms: the four ring phases of one piece, then the pipeline's steady state.

    ``row_links``, ``col_links``: (crosses, flows) of the row and column phases; ``row_racks``,
    ``col_racks``: the same for racks (:func:`rack_links`). Pieces
    overlap only where ``torus_pipeline_bytes`` > 0 and rows (X > 1) stay inside a host while
    columns (Y > 1) cross hosts (different links; the communicator pipelines only there),
    K = ceil(n / torus_pipeline_bytes), else K = 1 (the four phases on the whole buffer)::

        T = row_rs(n/K) + column(n/K) + row_ag(n/K)
            + (K - 1) * max(row_rs(n/K) + row_ag(n/K), column(n/K))

    (``pipeline_overlap``, present when the net has pieces, is the last line: while the column
    links carry piece k, the rows reduce-scatter piece k+1 and all-gather piece k-1.)

    >>> net = Network(Link(0.0, 1e9), Link(0.0, 1e8), 0.0, 2, 2, 0, {}, torus_pipeline_bytes=1e6)
    >>> t = allreduce_terms(net, "torus2d", 4, 4e6, grid_x=2)   # K = 4 pieces of 1 MB
    >>> {k: round(float(v) * 1e3, 3) for k, v in t.items()}  # column: 0.25 MB x 2 flows a host
    ... # doctest: +NORMALIZE_WHITESPACE
    {'row_reduce_scatter': 0.5, 'column_reduce_scatter': 5.0, 'column_all_gather': 5.0,
     'row_all_gather': 0.5, 'pipeline_overlap': 30.0}
    """
    (row_c, row_f), (col_c, col_f) = row_links, col_links
    n = np.asarray(nbytes, float)
    overlaps = (np.asarray(col_c, bool) & ~np.asarray(row_c, bool) & (np.asarray(x) > 1)
                & (np.asarray(y) > 1) & (net.torus_pipeline_bytes > 0))
    pieces = np.where(overlaps, np.maximum(1.0, np.ceil(n / max(net.torus_pipeline_bytes, 1))),
                      1.0)
    piece = n / pieces
    terms = {"row_reduce_scatter": ring_phase(net, x, piece, row_c, row_f, share, True, sw,
                                              row_racks),
             "column_reduce_scatter": ring_phase(net, y, piece / x, col_c, col_f, share, True,
                                                 sw, col_racks),
             "column_all_gather": ring_phase(net, y, piece / x, col_c, col_f, share, False, sw,
                                             col_racks),
             "row_all_gather": ring_phase(net, x, piece, row_c, row_f, share, False, sw,
                                          row_racks)}
    if net.torus_pipeline_bytes:
        rows = terms["row_reduce_scatter"] + terms["row_all_gather"]
        column = terms["column_reduce_scatter"] + terms["column_all_gather"]
        terms["pipeline_overlap"] = (pieces - 1) * np.maximum(rows, column)
    return terms


def allreduce_time(net, algorithm, ranks, nbytes, grid_x=None):
    """Seconds of one all-reduce: the sum of :func:`allreduce_terms`."""
    return sum(allreduce_terms(net, algorithm, ranks, nbytes, grid_x).values())


def compute_time(comp, ranks, local_batch, gpus_per_host):
    """Seconds of forward+backward+update on ``local_batch`` samples: (a + b*batch) / share."""
    share = rank_share(ranks, gpus_per_host, comp.slots_per_host)
    return (comp.a_s + comp.b_s * np.asarray(local_batch, float)) / share


def overlap(t_compute, t_comm, gamma):
    """Pollux overlap: (T_c^gamma + T_n^gamma)^(1/gamma); gamma=1 sums, gamma->inf is the max."""
    t_c, t_n = np.asarray(t_compute, float), np.asarray(t_comm, float)
    top = np.maximum(np.maximum(t_c, t_n), 1e-30)
    return top * ((t_c / top) ** gamma + (t_n / top) ** gamma) ** (1.0 / gamma)


def step_terms(net, comp, algorithm, ranks, local_batch, accum_steps=1, grid_x=None):
    """Seconds of one optimizer step, by term: compute, each all-reduce phase, total.

    With s accumulation micro-batches only the last overlaps the all-reduce:
    total = (s-1) T_c + (T_c^gamma + T_n^gamma)^(1/gamma); one rank does no all-reduce.
    Raises ValueError if ``local_batch`` exceeds the memory limit ``max_local_batch``.
    """
    local_batch = np.asarray(local_batch)
    if np.any(local_batch > comp.max_local_batch) or np.any(local_batch < 1):
        raise ValueError(f"local batch {local_batch.max()} outside 1..{comp.max_local_batch} "
                         f"(memory limit); use gradient accumulation for larger batches")
    p = np.asarray(ranks, int)
    t_c = compute_time(comp, p, local_batch, net.gpus_per_host)
    comm = allreduce_terms(net, algorithm, p, comp.grad_bytes, grid_x)
    comm = {k: np.where(p > 1, v, 0.0) for k, v in comm.items()}
    t_n = sum(comm.values())
    s = np.asarray(accum_steps, float)
    total = (s - 1) * t_c + overlap(t_c, t_n, comp.gamma)
    return dict(compute=t_c, **comm, allreduce=t_n, total=total)


def step_time(net, comp, algorithm, ranks, local_batch, accum_steps=1, grid_x=None):
    """Seconds of one optimizer step (see :func:`step_terms`)."""
    return step_terms(net, comp, algorithm, ranks, local_batch, accum_steps, grid_x)["total"]


def scaling_efficiency(net, comp, algorithm, ranks, local_batch, accum_steps=1, grid_x=None):
    """Weak-scaling efficiency: per-GPU throughput at p ranks over that of one GPU, in (0, 1]."""
    one = step_time(net, comp, algorithm, 1, local_batch, accum_steps)
    return one / step_time(net, comp, algorithm, ranks, local_batch, accum_steps, grid_x)
