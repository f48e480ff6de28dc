"""Backends that move the bytes: ``mpi`` (mpi4py, host memory), ``nccl`` (nnabla-ext-cuda's
NCCL communicator) and ``fake-nccl`` (the NCCL mapping on a numpy fake, for tests)."""


def synchronize(comm):
    """Wait until the device work ``comm``'s collectives enqueued is done (a no-op on host
    backends). Stop a clock only after this: NCCL calls return before their kernels finish."""
    sync = getattr(getattr(comm, "backend", None), "synchronize", None)
    if sync is not None:
        sync()


def make_backend(name, ctx, timeout, **knobs):
    """The backend called ``name`` (mpi | nccl | fake-nccl); ``knobs`` go to the MPI backend."""
    if name == "mpi":
        from .mpi import MPIBackend
        return MPIBackend(timeout=timeout, **knobs)
    if name in ("nccl", "fake-nccl"):
        from .nccl import NCCLBackend
        return NCCLBackend(ctx, timeout=timeout, fake=(name == "fake-nccl"))
    raise ValueError(f"unknown backend {name!r}; choose mpi, nccl or fake-nccl "
                     f"(NNABLA_TORUS_BACKEND or backend=)")
