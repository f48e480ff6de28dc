"""Per run on NCCL across hosts: the torus after backward, or NCCL's own all-reduce overlapped
with backward through nnabla's ``all_reduce_callback``, whichever the cost model predicts faster.

Only ``native`` overlaps on the device (nnabla's Python API enqueues the torus phases on the
compute stream: docs/gpu.md, "Defaults on the NCCL backend"), so per step, with T_c the
compute time (forward + backward + update), T_b its backward part and T_n an algorithm's
all-reduce time (``costmodel.allreduce_time``):

1. torus after backward: T_c + T_n(torus2d);
2. native overlapped:    T_c + T_n(native) - min(T_b, T_n(native)), the overlap hiding the
   shorter of backward and the all-reduce.

T_b = BACKWARD_SHARE x T_c (*assumed*: backward costs about twice the forward, and the update
is small; Kaplan et al. 2020, arXiv 2001.08361, section 2.1). Example::

    >>> from nnabla_torus.planning.costmodel import Compute, Link, Network
    >>> net = Network(Link(2e-6, 150e9), Link(5e-6, 12.5e9), 0.0, 4, 4, 0, {})
    >>> comp = Compute(0.02, 0.002, 1.0, 64, 102_228_128, 0)
    >>> choose(net, comp, 16, 32).algorithm
    'native'
"""
from collections import namedtuple

from .costmodel import allreduce_time, compute_time

BACKWARD_SHARE = 2.0 / 3.0   # backward / (forward + backward + update), *assumed* (module doc)

OverlapChoice = namedtuple("OverlapChoice", [
    "algorithm",        # "torus2d" (after backward) or "native" (overlapped)
    "compute_s",        # T_c: forward + backward + update of the local batch, seconds
    "backward_s",       # T_b = BACKWARD_SHARE x T_c, seconds
    "torus_s",          # T_n(torus2d): one all-reduce of the gradients, seconds
    "native_s",         # T_n(native), seconds
    "torus_step_s",     # T_c + T_n(torus2d), seconds
    "native_step_s",    # T_c + T_n(native) - min(T_b, T_n(native)), seconds
])


def choose(net, comp, ranks, local_batch, grid_x=None):
    """The faster of torus after backward and native overlapped for one run (module doc)."""
    t_c = float(compute_time(comp, ranks, local_batch, net.gpus_per_host))
    t_b = BACKWARD_SHARE * t_c
    torus = float(allreduce_time(net, "torus2d", ranks, comp.grad_bytes, grid_x))
    native = float(allreduce_time(net, "native", ranks, comp.grad_bytes))
    torus_step = t_c + torus
    native_step = t_c + native - min(t_b, native)
    algorithm = "native" if native_step < torus_step else "torus2d"
    return OverlapChoice(algorithm, t_c, t_b, torus, native, torus_step, native_step)


def describe(choice, profile_name):
    """One log line with the numbers behind ``choice``."""
    ms = {k: f"{1e3 * v:.1f} ms" for k, v in choice._asdict().items() if k != "algorithm"}
    what = ("native overlapped with backward (nnabla's all_reduce_callback)"
            if choice.algorithm == "native" else "torus2d after backward")
    return (f"overlap across hosts: {what}, from the cost model of profile {profile_name!r}: "
            f"compute {ms['compute_s']} (backward {ms['backward_s']}, assumed "
            f"{BACKWARD_SHARE:.2f} of it); all-reduce torus2d {ms['torus_s']}, native "
            f"{ms['native_s']}; step torus2d after backward {ms['torus_step_s']}, native "
            f"overlapped {ms['native_step_s']}")

