"""What only a GPU run proves (tests/mpi/progs/gpu_cases.py): overlap on vs off equal, fp16
through nnabla's callback, the noise-scale norms on the device, SyncBN against the CPU
reference. Here on the fake NCCL; with the ``gpu`` marker on real NCCL, one GPU per rank
(skipped without nnabla-ext-cuda and 2 GPUs; ``make gpu-check`` runs ``pytest -m gpu``)."""
import warnings

import pytest

from tests.mpi.test_communicator import cuda_devices
from tests.mpirun import expect_passed_on_every_rank, run_mpi

PROG = "tests/mpi/progs/gpu_cases.py"
CASES = ["overlap", "fp16", "norms", "sync-bn"]


def expect_cases(out, ranks):
    for case in CASES:
        expect_passed_on_every_rank(out, f"gpu_cases {case}", ranks)


@pytest.mark.parametrize("ranks", [2, 3, 8])    # 8: a DGX node's ranks (issue 47)
def test_gpu_cases_on_the_fake(ranks):
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": str(ranks)}
    expect_cases(run_mpi(ranks, [PROG, *CASES], timeout=600, env=env), ranks)


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_gpu_cases_on_nccl(ranks):
    gpus = cuda_devices()
    if gpus < ranks:
        pytest.skip(f"needs nnabla-ext-cuda and {ranks} GPUs; {gpus} visible")
    env = {"NNABLA_TORUS_BACKEND": "nccl"}
    out = run_mpi(ranks, [PROG, *CASES], timeout=600, env=env)
    expect_cases(out, ranks)
    unchecked = [line for line in out.splitlines() if "GPU placement unchecked" in line]
    if unchecked:   # a container's PID namespace: nvidia-smi lists the host's PIDs only
        warnings.warn(f"{len(unchecked)} rank(s): {unchecked[0]}")
