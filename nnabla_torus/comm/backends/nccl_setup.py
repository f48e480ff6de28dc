"""Starting the NCCL backend: the extension loaded on every rank (one error on all of them if it
fails anywhere), and nnabla's own watchdog left warning-only before a communicator is made.
"""
import logging
import math
import os

from ..job_log import note


def agree(world, step, what):
    """Run ``step()`` on every rank; if it raised anywhere, raise on every rank naming the
    first failing rank and its message (set-up errors must not leave the others waiting)."""
    try:
        step()
        mine = None
    except Exception as e:  # noqa: BLE001  (re-raised below, on every rank)
        mine = f"{type(e).__name__}: {e}"
    errors = world.allgather(mine)
    bad = [(r, m) for r, m in enumerate(errors) if m]
    if bad:
        r, message = bad[0]
        raise RuntimeError(f"{what} failed on rank {r} ({len(bad)} rank(s) failed): {message}")


def nnabla_watchdog(timeout):
    """Leave nnabla's own watchdog warning-only, timed like ours. Enabled
    (``NNABLA_MPI_WATCH_DOG_ENABLE`` not 0), it raises in its own std::thread when a guarded
    host-side call (``init()``, every ``all_reduce``'s enqueue, which includes a blocking 1-byte
    MPI_Allreduce that waits for the slowest rank) outlives its timeout: std::terminate, the
    rank dies by SIGABRT and no peer is named (nnabla-ext-cuda v1.39.0
    ``src/nbla/cuda/communicator/watch_dog.cpp`` 40-51; armed in ext .cu 381-382, 720, 764).
    Disabled, it prints one warning and stops watching (watch_dog.cpp 42-46). This library's
    failure handling covers the same calls: the arrival check before ``init()`` and
    ``new_group``, ``gil_held_deadline`` inside them, its watchdog around every NCCL phase."""
    os.environ.setdefault("NNABLA_MPI_WATCH_DOG_TIMEOUT", str(math.ceil(timeout)))
    enabled = os.environ.get("NNABLA_MPI_WATCH_DOG_ENABLE", "0")
    if enabled and enabled != "0":
        note(f"NNABLA_MPI_WATCH_DOG_ENABLE={enabled}: nnabla's watchdog will end a rank by "
             f"SIGABRT (std::terminate, no peer named) when a call of its communicator takes "
             f"longer than NNABLA_MPI_WATCH_DOG_TIMEOUT="
             f"{os.environ['NNABLA_MPI_WATCH_DOG_TIMEOUT']} s, e.g. an all-reduce waiting for a "
             f"rank that saves a checkpoint. nnabla_torus ends a hung job itself, naming the "
             f"rank and host (NNABLA_TORUS_TIMEOUT); unset it to leave that to nnabla_torus",
             logging.WARNING)


def load_extension(ctx, fake_device):
    """The module that makes and synchronises the device: ``fake_device``, or nnabla_ext.cuda."""
    if fake_device is not None:
        return fake_device
    if ctx is not None and not ctx.backend[0].startswith(("cuda", "cudnn")):  # None: cudnn
        raise ValueError(f"the nccl backend needs a CUDA context, e.g. get_extension_context("
                         f"'cudnn'), got backends {list(ctx.backend)}; or use "
                         f"NNABLA_TORUS_BACKEND=mpi (CPU) or fake-nccl (test)")
    from . import cuda_env
    return cuda_env.import_cuda_extension()
