"""Backends that move the bytes: ``mpi`` (mpi4py, host memory) and ``nccl`` (nnabla-ext-cuda's
NCCL communicator), by name. Other names are registered from above: importing
:mod:`nnabla_torus.testing` (the package root does) adds the test double ``fake-nccl`` (the
NCCL mapping on a numpy fake)."""


def synchronize(comm, what="waiting for the device"):
    """Wait until the device work ``comm``'s collectives enqueued is done (a no-op on host
    backends), under the backend's watchdog: a wait for a hung peer ends the job, naming
    ``what``. Stop a clock only after this: NCCL calls return before their kernels finish.
    Before reading a device value: the read itself waits holding the GIL, no watchdog runs."""
    backend = getattr(comm, "backend", None)
    if hasattr(backend, "watch"):
        with backend.watch(what, sync=True):
            pass
    elif hasattr(backend, "synchronize"):     # a device without a watchdog of ours
        backend.synchronize()


def _mpi(ctx, timeout, **knobs):
    from .mpi import MPIBackend
    return MPIBackend(timeout=timeout, **knobs)


def _nccl(ctx, timeout, **knobs):
    from .nccl import NCCLBackend
    return NCCLBackend(ctx, timeout=timeout)


# backend name -> factory(ctx, timeout, **mpi_knobs), in the order errors list them
_FACTORIES = {"mpi": _mpi, "nccl": _nccl}


def register(name, factory):
    """Add the backend ``name``: ``factory(ctx, timeout, **mpi_knobs)`` makes it."""
    _FACTORIES[name] = factory


def names():
    """The backend names ``NNABLA_TORUS_BACKEND`` (``backend=``) accepts."""
    return tuple(_FACTORIES)


def make_backend(name, ctx, timeout, **knobs):
    """The backend called ``name`` (one of ``names()``); ``knobs`` go to the MPI backend."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(names())} "
                         f"(NNABLA_TORUS_BACKEND or backend=)")
    return _FACTORIES[name](ctx, timeout, **knobs)
