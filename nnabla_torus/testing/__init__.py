"""Test doubles shipped for the test suite and gpu-check (not used by training).

Importing this package (the package root does) registers the backend ``fake-nccl``: the NCCL
backend's mapping (:mod:`nnabla_torus.comm.backends.nccl`) run end to end on :mod:`.fake_nccl`,
numpy on CPU with mpi4py between ranks, in place of nnabla-ext-cuda."""
from ..comm import backends


def _fake_nccl(ctx, timeout, **_mpi_knobs):
    from ..comm.backends.nccl import NCCLBackend
    from . import fake_nccl
    return NCCLBackend(ctx, timeout=timeout, fake_device=fake_nccl)


backends.register("fake-nccl", _fake_nccl)
