"""nnabla-torus: 2D-torus all-reduce and batch-size planning for nnabla data-parallel training.

    import nnabla_torus as C   # instead of: import nnabla.communicators as C
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
"""
from .communicator import MultiProcessDataParallelCommunicator, TorusCommunicator  # noqa: F401
from .rendezvous import CollectiveTimeout, RankLost  # noqa: F401
from .topology import Grid  # noqa: F401

__version__ = "0.1.0"
