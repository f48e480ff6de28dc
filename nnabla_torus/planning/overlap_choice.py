"""Per run on NCCL across hosts: the torus after backward, or NCCL's own all-reduce overlapped
with backward through nnabla's ``all_reduce_callback``, whichever is faster: first from the cost
model, then from the run's own measured step times.

Only ``native`` overlaps on the device (nnabla's Python API enqueues the torus phases on the
compute stream: docs/gpu.md, "Defaults on the NCCL backend"), so per step, with T_c the
compute time (forward + backward + update), T_b its backward part, T_n an algorithm's
all-reduce time (``costmodel.allreduce_time``) and T_k one 1-byte MPI all-reduce of the world:

1. torus after backward: T_c + T_n(torus2d);
2. native overlapped:    T_c + T_n(native) - min(T_b, T_n(native)) + A x T_k, the overlap
   hiding the shorter of backward and the all-reduce. A = ``comp.grad_arrays``: nnabla's
   callback runs a blocking 1-byte ``MPI_Allreduce`` on the world for every gradient it finds
   after each function's backward, before packing it (``costmodel.callback_sync_s``;
   ``mpi_check_all`` 324-331). Each one holds backward's host thread until every rank reaches
   it.

T_b = BACKWARD_SHARE x T_c (``costmodel.framework``). ``with_measured re-makes the
choice once the run has timed its steps: a measured configuration's median step time replaces
its prediction. While only one has run, the other's prediction is scaled by the model's error
on the one that ran, which keeps the order: the choice changes only once both were timed (a
run times a few steps of each). Example::

    >>> from nnabla_torus.planning.costmodel import Compute, Link, Network
    >>> net = Network(Link(2e-6, 150e9), Link(5e-6, 12.5e9), 0.0, 4, 4, 0, {})
    >>> comp = Compute(0.02, 0.002, 1.0, 64, 102_228_128, 0)
    >>> choose(net, comp, 16, 32).algorithm
    'native'
    >>> with_measured(choose(net, comp, 16, 32), {"native": 0.150, "torus2d": 0.120}).algorithm
    'torus2d'
"""
from collections import namedtuple

from .costmodel import allreduce_time, callback_sync_s, compute_time
from .costmodel.framework import BACKWARD_SHARE

OverlapChoice = namedtuple("OverlapChoice", [
    "algorithm",        # "torus2d" (after backward) or "native" (overlapped)
    "compute_s",        # T_c: forward + backward + update of the local batch, seconds
    "backward_s",       # T_b = BACKWARD_SHARE x T_c, seconds
    "torus_s",          # T_n(torus2d): one all-reduce of the gradients, seconds
    "native_s",         # T_n(native), seconds
    "torus_step_s",     # T_c + T_n(torus2d), seconds (measured, once the run timed it)
    "native_step_s",    # T_c + T_n(native) - min(T_b, T_n(native)) + A x T_k, seconds (idem)
    "checks_s",         # A x T_k: nnabla's per-gradient 1-byte MPI_Allreduce, seconds
    "measured",         # the configurations whose step time was measured, e.g. ("native",)
], defaults=[0.0, ()])


def choose(net, comp, ranks, local_batch, grid_x=None):
    """The faster of torus after backward and native overlapped for one run (module doc)."""
    t_c = float(compute_time(comp, ranks, local_batch, net.gpus_per_host))
    t_b = BACKWARD_SHARE * t_c
    torus = float(allreduce_time(net, "torus2d", ranks, comp.grad_bytes, grid_x))
    native = float(allreduce_time(net, "native", ranks, comp.grad_bytes))
    checks = float(callback_sync_s(net, comp, ranks))
    torus_step = t_c + torus
    native_step = t_c + native - min(t_b, native) + checks
    algorithm = "native" if native_step < torus_step else "torus2d"
    return OverlapChoice(algorithm, t_c, t_b, torus, native, torus_step, native_step, checks)


def with_measured(choice, step_s):
    """``choice`` re-made from the run's median step times ``step_s`` = {"torus2d": s,
    "native": s} (either may be missing): a measured time replaces the prediction; with one
    measured, the other prediction is multiplied by measured / predicted of the one that ran
    (the model's error there, *assumed* to apply to both)."""
    predicted = {"torus2d": choice.torus_step_s, "native": choice.native_step_s}
    unknown = set(step_s) - set(predicted)
    if unknown or any(not v > 0 for v in step_s.values()):
        raise ValueError(f"measured step times must be > 0 seconds for 'torus2d' and/or "
                         f"'native', got {step_s!r}")
    steps = dict(predicted)
    if len(step_s) == 1:
        (ran, seconds), = step_s.items()
        other = "native" if ran == "torus2d" else "torus2d"
        steps[other] *= seconds / predicted[ran]
    steps.update(step_s)
    algorithm = "native" if steps["native"] < steps["torus2d"] else "torus2d"
    return choice._replace(algorithm=algorithm, torus_step_s=steps["torus2d"],
                           native_step_s=steps["native"], measured=tuple(sorted(step_s)))


def describe(choice, profile_name):
    """One log line with the numbers behind ``choice``."""
    ms = {k: f"{1e3 * v:.1f} ms" for k, v in choice._asdict().items()
          if k not in ("algorithm", "measured")}
    what = ("native overlapped with backward (nnabla's all_reduce_callback)"
            if choice.algorithm == "native" else "torus2d after backward")
    source = (f"the run's measured step times ({', '.join(choice.measured)}; the other scaled "
              f"by the model's error)" if len(choice.measured) == 1 else
              "the run's measured step times" if choice.measured else
              f"the cost model of profile {profile_name!r}")
    return (f"overlap across hosts: {what}, from {source}: compute {ms['compute_s']} (backward "
            f"{ms['backward_s']}, assumed {BACKWARD_SHARE:.2f} of it); all-reduce torus2d "
            f"{ms['torus_s']}, native {ms['native_s']} + its per-gradient MPI checks "
            f"{ms['checks_s']}; step torus2d after backward {ms['torus_step_s']}, native "
            f"overlapped {ms['native_step_s']}")
