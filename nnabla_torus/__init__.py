"""nnabla-torus: 2D-torus all-reduce and batch-size planning for nnabla data-parallel training.

    import nnabla_torus as C   # instead of: import nnabla.communicators as C
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()

Importing the package starts nothing: the communicator (and with it mpi4py.MPI, which starts
MPI) is imported on first use of its names, so the planner and ``--help`` never start MPI.
It only installs an import hook: when anything later imports ``nnabla_ext.cuda`` (e.g.
``get_extension_context("cudnn")``), Open MPI, NCCL and the CUDA wheels' libraries are
prepared first, so that nnabla registers its NCCL communicators
(:mod:`nnabla_torus.comm.backends.cuda_env`). Import nnabla_torus before making a CUDA context.
"""
import importlib

from . import testing  # noqa: F401  (registers the test double backend fake-nccl)
from .comm import auto
from .comm.backends import cuda_env

cuda_env.install_import_hook()


def _auto_profile(name):
    """NNABLA_TORUS_AUTO_PROFILE's profile for the communicator (comm does not import planning)."""
    from .planning.auto_profile import AutoProfile
    return AutoProfile(name)


auto.register_profile_loader(_auto_profile)

__version__ = "0.1.0"
auto.register_package_version(__version__)   # auto's cache key holds it (comm does not import us)

_LAZY = {"MultiProcessDataParallelCommunicator": "comm.communicator",
         # nnabla's other names for the same factory (nnabla communicator.pyx:667-671)
         "MultiProcessDataParalellCommunicator": "comm.communicator",
         "MultiProcessCommunicator": "comm.communicator", "Comm": "comm.communicator",
         "Dist": "comm.communicator", "DataParallelCommunicator": "comm.communicator",
         "TorusCommunicator": "comm.communicator", "CollectiveTimeout": "comm.errors",
         "RankGone": "comm.errors", "RankLost": "comm.errors", "Grid": "comm.topology"}
__all__ = list(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'nnabla_torus' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
