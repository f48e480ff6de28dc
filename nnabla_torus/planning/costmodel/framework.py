"""Seconds nnabla adds to a data-parallel step beyond compute and the all-reduce.

A profile's compute (``a + b x batch``) is fitted to NVIDIA's MXNet runs (docs/fidelity.md);
nnabla's training step also pays, per optimizer step:

1. ``callback_sync``: nnabla's ``all_reduce_callback`` runs a blocking 1-byte
   ``MPI_Allreduce`` of the world for every gradient array after its backward, before packing
   it (nnabla-ext-cuda v1.39.0 ``multi_process_data_parallel_communicator.cu`` 1025-1030;
   ResNet-50: 161 arrays): ``grad_arrays`` x a 1-byte all-reduce of the cost model (``native``);
   counted in full (*assumed*: a host far enough ahead of the GPU would hide part of it).
2. ``finite_check``: ``Solver.check_inf_or_nan_grad`` loops over every parameter, each a
   blocking reduction (nnabla ``solver.cpp`` ~310-323, ext ``mixed_precision_training.cuh``
   ~70-80): ``grad_arrays`` x ``finite_check_s`` (seconds per array: a profile's figure).
3. ``input_wait``: the input pipeline runs beside the step (DALI prefetches), so it costs only
   what a host's ``local_batch x ranks on the host`` images take beyond the step at the
   pipeline's images/s per host (0: not modelled).

Example (ABCI's network, 2,176 ranks: 161 one-byte all-reduces of 76 us each)::

    >>> from nnabla_torus.planning.machine_profile import load_profile
    >>> prof = load_profile("abci")
    >>> t = framework_terms(prof.network, prof.models["resnet50"], 2176, 32, 0.031,
    ...                     finite_check_s=10e-6, loader_images_per_s=11222)
    >>> {k: round(v * 1e3, 1) for k, v in t.items()}
    {'callback_sync': 12.2, 'finite_check': 1.6, 'input_wait': 0.0}
"""
import numpy as np

from .allreduce import allreduce_time


def callback_sync_s(net, comp, ranks):
    """Seconds of nnabla's per-gradient 1-byte ``MPI_Allreduce`` per step (0 on one rank)."""
    p = np.asarray(ranks, int)
    one_byte = allreduce_time(net, "native", np.maximum(p, 2), 1)
    return np.where(p > 1, comp.grad_arrays * one_byte, 0.0)


def framework_terms(net, comp, ranks, local_batch, step_s, finite_check_s=0.0,
                    loader_images_per_s=0.0):
    """{term: seconds} nnabla adds to a step of ``step_s`` seconds (module doc); every
    argument broadcasts."""
    per_host = np.asarray(local_batch, float) * np.minimum(np.asarray(ranks), net.gpus_per_host)
    loader_s = per_host / loader_images_per_s if loader_images_per_s else 0.0 * per_host
    return {"callback_sync": callback_sync_s(net, comp, ranks),
            "finite_check": comp.grad_arrays * float(finite_check_s) + 0.0 * per_host,
            "input_wait": np.maximum(0.0, loader_s - np.asarray(step_s, float))}
