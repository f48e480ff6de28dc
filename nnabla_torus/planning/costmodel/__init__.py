"""Cost model: predicted seconds of each all-reduce algorithm and of a data-parallel step.

Pure numpy and vectorised: every function takes scalars or arrays for ranks, bytes, grid rows
and batches, and broadcasts them. Units: seconds, bytes, bytes per second, samples. The planner
ranks its candidates with it, calibrate.py fits it to measurements, ``auto`` consults it. The
formulas, their derivation and the Open MPI sources behind ``native``: docs/costmodel.md.

Example::

    >>> net = Network(Link(5e-6, 150e9), Link(5e-6, 25e9), 0.0, 4, 4, 10000, {})
    >>> float(allreduce_time(net, "ring", 8, 1 << 20)) > 0
    True
"""
from .allreduce import allreduce_terms, allreduce_time, default_grid_x
from .framework import callback_sync_s, finite_check_s
from .han import CHAIN_FRAGMENT_BYTES, HAN_SEGMENT_BYTES, han_terms
from .links import call_waits, grid_links, intra_bandwidth, rack_links, rank_share, ring_links
from .params import ALGORITHMS, NO_SOFTWARE, Compute, Link, Network, Software, software_of
from .phases import doubling_phase, native_terms, ring_phase, torus_terms
from .step import compute_time, overlap, scaling_efficiency, step_terms, step_time

__all__ = ["ALGORITHMS", "CHAIN_FRAGMENT_BYTES", "Compute", "HAN_SEGMENT_BYTES", "Link",
           "NO_SOFTWARE", "Network", "Software", "allreduce_terms", "allreduce_time",
           "call_waits", "callback_sync_s", "compute_time", "default_grid_x", "doubling_phase",
           "finite_check_s", "grid_links", "han_terms", "intra_bandwidth", "native_terms",
           "overlap", "rack_links", "rank_share", "ring_links", "ring_phase",
           "scaling_efficiency", "software_of", "step_terms", "step_time", "torus_terms"]
