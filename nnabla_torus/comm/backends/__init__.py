"""Backends that move the bytes: ``mpi`` (mpi4py, host memory), ``nccl`` (nnabla-ext-cuda's
NCCL communicator) and ``fake-nccl`` (the NCCL mapping on a numpy fake, for tests)."""


def synchronize(comm):
    """Wait until the device work ``comm``'s collectives enqueued is done (a no-op on host
    backends). Stop a clock only after this: NCCL calls return before their kernels finish."""
    sync = getattr(getattr(comm, "backend", None), "synchronize", None)
    if sync is not None:
        sync()
