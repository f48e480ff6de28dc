"""The run's device context and communicator: TF32 set before the CUDA extension loads, the
device by the rank's local index, and the all-reduce train.py starts on (``--algorithm
planned`` starts on ring, which the planner's cost model prices, torus2d with ``--plan off``).
Example::

    ctx, comm, type_config = make_context_and_comm(cfg, log)   # collective: comm.init()
"""
import os

import nnabla as nn
from nnabla.ext_utils import get_extension_context

import nnabla_torus as C

import config_checks
import knob_table
import resize


def cuda_environment(cfg):
    """Variables nnabla-ext-cuda reads once, when get_extension_context imports it: TF32.

    nnabla sets NVIDIA_TF32_OVERRIDE=0 (full FP32 convolutions even on A100/H100) unless
    NNABLA_CUDA_ALLOW_TF32 is set and not "0" (ext ``src/nbla/cuda/init.cpp.tmpl`` ~76-83),
    so the recipe key must be turned into that variable before the context is made."""
    return {"NNABLA_CUDA_ALLOW_TF32": "1" if cfg.allow_tf32 else "0"}


def make_context_and_comm(cfg, log_all):
    """Return (ctx, comm, type_config) with the device chosen by the rank's local index."""
    type_config = cfg.type_config
    if cfg.context == "cpu" and type_config == "half":
        type_config = "float"          # nnabla's CPU extension has no FP16 kernels
        log_all("type_config half needs a CUDA context; this CPU run trains in fp32 (with "
                "the FP16 dynamic loss scaling, so that code path runs)")
    # here, not at parse: recipes name cudnn on any machine
    config_checks.check_context(cfg.context)
    os.environ.update(cuda_environment(cfg))
    ctx = get_extension_context(cfg.context, device_id="0", type_config=type_config)
    if cfg.elastic:
        from mpi4py import MPI
        cfg.grid, note = resize.fit_grid(cfg.grid, MPI.COMM_WORLD.size)
        if note:
            log_all(note)
    # planned starts on an algorithm the planner's cost model prices (not auto, the
    # communicator's default, whose per-size table it cannot, and which would measure at init):
    # ring, which the planner replaces before the first step (a torus2d start would note
    # "world size N is prime" on prime worlds that never run a torus); torus2d with --plan off.
    planned = "torus2d" if cfg.plan == "off" else "ring"
    algorithm = planned if cfg.algorithm == "planned" else cfg.algorithm
    comm = C.MultiProcessDataParallelCommunicator(ctx, algorithm=algorithm, grid=cfg.grid or None,
                                                  bind_gpu_numa=cfg.bind_gpu_numa)
    comm.init()
    for line in comm.init_notes:       # the GPU binding, the MPI transport (rank 0)
        log_all(line)
    agree_on_config(cfg, comm)
    ctx.device_id = str(comm.local_rank)
    nn.set_default_context(ctx)
    return ctx, comm, type_config


def agree_on_config(cfg, comm):
    """ValueError on every rank unless all ranks resolved the same knobs (flags, NNABLA_TORUS_*
    variables and recipe; ``knob_table.PER_HOST`` excepted): a variable set on one host only
    would otherwise train the ranks with different learning rates or batches, with no error."""
    # imported here, not at the top: MPI must start in the communicator's module (its osc note)
    from mpi4py import MPI
    from nnabla_torus.comm.rendezvous import check_same_call
    from nnabla_torus.comm.settings import differences

    def describe(calls):
        return ("ranks resolved different settings (give every rank the same flags "
                "and NNABLA_TORUS_* variables, e.g. mpirun -x NAME=value):\n" +
                "\n".join(differences(calls)))
    check_same_call(MPI.COMM_WORLD, list(range(comm.size)), knob_table.agreement(cfg),
                    comm.timeout, "train.py settings", describe)
