"""Seconds of the phases every algorithm is made of: a ring reduce-scatter or all-gather,
recursive doubling, the library's (native) choice between them, and torus2d's four phases
with its pipelined pieces. The step formula is derived in docs/costmodel.md.
"""
import numpy as np


def ring_phase(net, members, nbytes, crosses, flows, share, reduce, sw, racks=(False, 0)):
    """Seconds of one ring reduce-scatter (``reduce``) or all-gather phase (docs/costmodel.md).

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


def native_terms(net, ranks, nbytes, crosses, flows, share, sw, per_host, pair_flows,
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

    >>> from nnabla_torus.planning.costmodel import Link, Network, allreduce_terms
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
