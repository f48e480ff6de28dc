"""native across hosts as Open MPI 5's coll/han runs it: 64 KiB segments through an in-host
reduce, the leaders' reduce and bcast, and an in-host bcast, pipelined.

The stages and their costs, with the Open MPI source they come from, are in docs/costmodel.md
("native across hosts: coll/han").
"""
from collections import namedtuple

import numpy as np

from .links import rank_share


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


_HanJob = namedtuple("_HanJob", [
    "g", "h",            # ranks per host, hosts (H = ceil(p/g))
    "share", "speed",    # a rank's share of its host (flat hops); one rank's speed (pipeline)
    "reduce_rounds",     # lr: g-1 rounds below 4 ranks a host (linear), else ceil(lg g)
    "lg_h",              # ceil(lg H), at least 1
    "ur_rounds",         # ur: 2 ceil(lg H) rounds (reduce-scatter + gather), 1 for a chain
    "ur_adds",           # ur: bytes added at leader 0 per segment byte
])


def _han_job(net, p):
    """The per-job quantities of han's stages for ``p`` ranks (array)."""
    g = float(net.gpus_per_host)
    h = np.ceil(p / g)
    lg_h = np.ceil(np.log2(np.maximum(h, 2)))
    return _HanJob(g, h, rank_share(p, net.gpus_per_host, net.slots_per_host),
                   min(1.0, net.slots_per_host) if net.slots_per_host else 1.0,
                   g - 1 if g < 4 else np.ceil(np.log2(g)), lg_h,
                   np.where(h > 2, 2 * lg_h, 1.0), np.where(h > 2, (h - 1) / h, 1.0))


def _leaders_bcast(net, job, m):
    """Seconds of ub on ``m`` bytes: linear (H <= 4), binomial below a segment, else a chain."""
    h, lat_out, b_out = job.h, net.inter.latency_s, net.inter.bandwidth_Bps
    chain = (h - 1) * lat_out + (m + (h - 2) * CHAIN_FRAGMENT_BYTES) / b_out
    binomial = job.lg_h * (lat_out + m / b_out)
    linear = lat_out + (h - 1) * m / b_out
    return np.where(h <= 4, linear, np.where(m < HAN_SEGMENT_BYTES, binomial, chain))


def _han_fill(net, job, m1, soft):
    """The first segment's four stages {term: seconds}, with the flat native's hops."""
    c, b_in, b_out = net.reduce_s_per_byte, net.intra.bandwidth_Bps, net.inter.bandwidth_Bps
    lat_in, lat_out = net.intra.latency_s, net.inter.latency_s
    g, h = job.g, job.h
    return {"han_in_host_reduce": job.reduce_rounds * (lat_in + m1 / b_in + m1 * c + soft(m1))
            / job.share,
            "han_leaders_reduce": (job.ur_rounds * lat_out + 2 * (h - 1) / h * m1 / b_out
                                   + job.ur_adds * m1 * c / job.speed),
            "han_leaders_bcast": _leaders_bcast(net, job, m1),
            "han_in_host_bcast": (lat_in + (g - 1) * m1 / b_in + soft(m1)) / job.share}


def _han_pipeline(net, job, n, soft):
    """Seconds of the segments after the first: (n - m)/m * (max(lr, up) + lb)."""
    c, b_in, b_out = net.reduce_s_per_byte, net.intra.bandwidth_Bps, net.inter.bandwidth_Bps
    m = float(HAN_SEGMENT_BYTES)
    lr = job.reduce_rounds * (m / b_in + m * c + soft(m)) / job.speed
    lb = ((job.g - 1) * m / b_in + soft(m)) / job.speed
    ub_rounds = np.where(job.h <= 4, 1.0, job.h - 1)   # linear: one round; chain: H - 1 hops
    up = (_han_leader_bytes(job.h) * m / b_out
          + np.maximum(job.ur_rounds, ub_rounds) * net.inter.latency_s
          + job.ur_adds * m * c / job.speed)
    return np.maximum(n - m, 0.0) / m * (np.maximum(lr, up) + lb)


def han_terms(net, ranks, nbytes, sw):
    """native on several hosts as Open MPI 5's coll/han runs it: {han phase: seconds}.

    The first 64 KiB segment's four stages (in-host reduce, leaders' reduce, leaders' bcast,
    in-host bcast), then ``han_pipeline``: the other segments, the leaders' links busy while
    the hosts reduce and broadcast. Derivation: docs/costmodel.md.

    >>> from nnabla_torus.planning.costmodel import NO_SOFTWARE, Link, Network
    >>> net = Network(Link(0.0, 1e9), Link(0.0, 1e8), 0.0, 2, 2, 0, {}, native_hierarchical=True)
    >>> t = han_terms(net, 4, 1 << 20, NO_SOFTWARE)   # 2 hosts x 2 ranks, 16 segments
    >>> round(float(t["han_pipeline"]), 5)   # 15 x (64 KiB over the link + a 64 KiB copy)
    0.01081
    """
    p = np.asarray(ranks, float)
    n = np.asarray(nbytes, float)
    job = _han_job(net, p)

    def soft(m):
        return sw.step_s + m * sw.s_per_byte

    terms = _han_fill(net, job, np.minimum(n, HAN_SEGMENT_BYTES), soft)
    terms["han_pipeline"] = _han_pipeline(net, job, n, soft)
    return terms


def with_han(net, ranks, nbytes, sw, flat):
    """Flat native terms where the job fits one host (or hosts have one rank), han's elsewhere.

    Open MPI disables han on a communicator inside one host or with one rank per host
    (coll_han_module.c, coll_han_subcomms.c), so those keep coll/tuned's flat algorithm.
    """
    on_han = (np.asarray(ranks) > net.gpus_per_host) & (net.gpus_per_host > 1)
    han = han_terms(net, ranks, nbytes, sw)
    return {**{k: np.where(on_han, 0.0, v) for k, v in flat.items()},
            **{k: np.where(on_han, v, 0.0) for k, v in han.items()}}
