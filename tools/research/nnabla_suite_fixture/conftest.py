"""The fixture nnabla's communicator tests ask for (``comm_nccl_opts``), handing them an
nnabla_torus communicator on CPU instead of nnabla's CUDA one.

nnabla v1.39.0 ``python/test/communicator/conftest.py`` makes ``comm_nccl_opts`` from
``nnabla.communicators.MultiProcessCommunicator`` on a CUDA context (GPUs only), with
``comm, ctx, device_id, devices, mpi_rank, mpi_local_rank``; this one has the same fields
(``device_id`` is the rank, as on one host with one GPU per rank).
``tools/research/nnabla_suite.py`` puts it beside nnabla's tests in place of theirs.
"""
from types import SimpleNamespace

import pytest


def pytest_addoption(parser):
    parser.addoption("--test-communicator", action="store_true", default=False,
                     help="run the communicator tests (nnabla's option)")
    parser.addoption("--communicator-gpus", type=str, default=None, help="unused on CPU")
    parser.addoption("--type-config", type=str, default="float", help="float (CPU)")


@pytest.fixture(scope="session")
def comm_nccl_opts(request):
    if not request.config.getoption("--test-communicator"):
        return None
    import nnabla_torus as C
    from nnabla.ext_utils import get_extension_context
    ctx = get_extension_context("cpu", type_config=request.config.getoption("--type-config"))
    comm = C.MultiProcessCommunicator(ctx)
    comm.init()
    device_id = str(comm.rank)
    ctx.device_id = device_id
    return SimpleNamespace(comm=comm, ctx=ctx, device_id=device_id,
                           devices=[str(r) for r in range(comm.size)], mpi_rank=comm.rank,
                           mpi_local_rank=comm.local_rank)
