"""Seconds nnabla adds to a data-parallel step beyond compute and the all-reduce.

A profile's compute (``a + b x batch``) is fitted to NVIDIA's MXNet runs (docs/fidelity.md);
nnabla's training step also pays, per optimizer step (:func:`.step.step_terms` adds both):

1. ``native`` runs through nnabla's ``all_reduce_callback``, overlapped with backward: the
   all-reduce hides behind up to ``BACKWARD_SHARE`` of the compute (``overlap_with_backward``,
   negative), and ``callback_sync``: the callback runs a blocking 1-byte ``MPI_Allreduce``
   (``MPI_C_BOOL``, ``MPI_LAND``: ``mpi_check_all``) of the world for every gradient array
   after its backward, before packing it (nnabla-ext-cuda v1.39.0
   ``multi_process_data_parallel_communicator.cu`` 325-331, 1027; ResNet-50: 161 arrays):
   ``grad_arrays`` x a 1-byte recursive doubling whose steps inside a host cost the host's
   shared-memory MPI latency (``host_mpi_latency_s``; 0: the intra link's) and across hosts
   the inter link's; counted in full (*assumed*: a host far enough ahead of the GPU would
   hide part of it).
2. ``finite_check``: the example reads one fused sum of every gradient once a step
   (``examples/imagenet/divergence.py``: ``gradient_abs_sum``), one host wait of the model's
   ``finite_check_s``, where nnabla's ``Solver.check_inf_or_nan_grad`` waits once per array
   (nnabla ``solver.cpp`` ~310-323, ext ``mixed_precision_training.cuh`` ~70-80).

The input pipeline runs beside the step: :func:`nnabla_torus.planning.fixed_costs.input_wait_s`.
Example (ABCI's network, 2,176 ranks: 161 one-byte all-reduces of 67 us each)::

    >>> from nnabla_torus.planning.machine_profile import load_profile
    >>> prof = load_profile("abci")
    >>> comp = prof.models["resnet50"]
    >>> round(float(callback_sync_s(prof.network, comp, 2176)) * 1e3, 1)
    10.8
    >>> round(finite_check_s(comp) * 1e3, 2)
    0.01
"""
import numpy as np

from .allreduce import allreduce_time
from .params import Link

BACKWARD_SHARE = 2.0 / 3.0   # backward / (forward + backward + update), *assumed*: backward
# costs about twice the forward and the update is small (Kaplan et al. 2020, arXiv 2001.08361,
# section 2.1)


def callback_sync_s(net, comp, ranks):
    """Seconds of nnabla's per-gradient 1-byte ``MPI_Allreduce`` per step (0 on one rank)."""
    p = np.asarray(ranks, int)
    host = Link(net.host_mpi_latency_s or net.intra.latency_s, net.intra.bandwidth_Bps)
    one_byte = allreduce_time(net._replace(intra=host), "native", np.maximum(p, 2), 1)
    return np.where(p > 1, comp.grad_arrays * one_byte, 0.0)


def finite_check_s(comp):
    """Seconds of the example's inf/NaN check per step: one host wait."""
    return comp.finite_check_s
