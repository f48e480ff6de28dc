"""One property suite for every backend (issue 33): the same seeded random sequences of
collectives and list mutations (tests/mpi/progs/property_cases.py) on ``mpi`` and
``fake-nccl`` at 2, 3 and 4 ranks, and on ``nccl`` when nnabla-ext-cuda sees the GPUs (else
skipped, with the reason), each result checked against numpy. A failure shows the seed, the
operations up to the failing call and the command that replays them.

Size: SEQUENCES x CALLS calls per launch, the same seeds on every backend and rank count.
"""
import pytest

from tests.mpi.test_communicator import nccl_cases
from tests.mpirun import expect_passed, run_mpi

PROG = "tests/mpi/progs/property_cases.py"
SEQUENCES, CALLS = 6, 40


def backend_ranks():
    cases = [pytest.param(b, r, id=f"{b}-{r}") for b in ("mpi", "fake-nccl") for r in (2, 3, 4)]
    return cases + nccl_cases((2, 4))


@pytest.mark.slow
@pytest.mark.parametrize("backend, ranks", backend_ranks())
def test_same_answer_on_every_backend(backend, ranks):
    env = {"NNABLA_TORUS_BACKEND": backend, "NNABLA_TORUS_TIMEOUT": "30"}
    out = run_mpi(ranks, [PROG, "--sequences", str(SEQUENCES), "--calls", str(CALLS)],
                  timeout=180, env=env)
    expect_passed(out, "property_cases")
