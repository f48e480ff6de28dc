"""The cost model's parameters as named tuples: links, the network, software costs, compute.

Each field's comment gives its meaning and unit; a cluster profile (machine_profile.py) fills
them, calibrate.py fits them.
"""
from collections import namedtuple

from ...comm.collectives import ALGORITHM_NAMES as ALGORITHMS  # noqa: F401 (re-exported; the planner's order)

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
    "host_mpi_latency_s",     # seconds per step of a small host MPI message between ranks of one
                              # host (shared memory): nnabla's callback checks (0: intra latency)
], defaults=[0.0, 0, 0.0, False, 0.0, 0, 0, None, 1.0, 0.0])

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
    "grad_arrays",        # gradient arrays per backward (parameter uses; ResNet-50: 161), each
                          # one blocking 1-byte MPI_Allreduce in nnabla's callback (default 0)
    "finite_check_s",     # seconds of the example's one fused inf/NaN check per step (default 0)
    "step_wait_s",        # seconds per step on more than one rank that a run measured beyond
                          # the model (rank skew, a busy scheduler): 0 in a profile; set from
                          # the run's steps (examples' TrainingPlanner.use_measured)
], defaults=[0, 0.0, 0.0])



def software_of(net, algorithm):
    """The Software cost of ``algorithm`` in ``net`` (zero when the profile gives none)."""
    return (net.software or {}).get(algorithm, NO_SOFTWARE)
