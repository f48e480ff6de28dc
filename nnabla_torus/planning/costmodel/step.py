"""Seconds of one data-parallel training step: compute (a + b x batch) overlapped with the
gradient all-reduce by Pollux's exponent, with gradient accumulation.
"""
import numpy as np

from .allreduce import allreduce_terms
from .framework import BACKWARD_SHARE, callback_sync_s, finite_check_s
from .links import rank_share


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
    """Seconds of one optimizer step, by term: compute, each all-reduce phase, what nnabla
    adds (``costmodel.framework``), total.

    With s accumulation micro-batches only the last overlaps the all-reduce:
    total = (s-1) T_c + (T_c^gamma + T_n^gamma)^(1/gamma) + finite_check + measured_wait (+
    for ``native`` with ``grad_arrays``, nnabla's all_reduce_callback: callback_sync minus the
    all-reduce hidden behind backward); one rank does no all-reduce and no measured_wait
    (``Compute.step_wait_s``: what a run measured beyond the model on several ranks).
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
    nnabla = {"finite_check": finite_check_s(comp) + 0.0 * t_c}
    if comp.step_wait_s:
        nnabla["measured_wait"] = np.where(p > 1, comp.step_wait_s, 0.0) + 0.0 * t_c
    if algorithm == "native" and comp.grad_arrays:   # nnabla's callback, during backward
        nnabla["overlap_with_backward"] = -np.minimum(BACKWARD_SHARE * t_c, t_n)
        nnabla["callback_sync"] = callback_sync_s(net, comp, p) + 0.0 * t_c
    total = (s - 1) * t_c + overlap(t_c, t_n, comp.gamma) + sum(nnabla.values())
    return dict(compute=t_c, **comm, allreduce=t_n, **nnabla, total=total)


def step_time(net, comp, algorithm, ranks, local_batch, accum_steps=1, grid_x=None):
    """Seconds of one optimizer step (see :func:`step_terms`)."""
    return step_terms(net, comp, algorithm, ranks, local_batch, accum_steps, grid_x)["total"]


def scaling_efficiency(net, comp, algorithm, ranks, local_batch, accum_steps=1, grid_x=None):
    """Weak-scaling efficiency: per-GPU throughput at p ranks over that of one GPU, in (0, 1]."""
    one = step_time(net, comp, algorithm, 1, local_batch, accum_steps)
    return one / step_time(net, comp, algorithm, ranks, local_batch, accum_steps, grid_x)
