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


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2], ids=["torus2d-4x2", "torus2d-2x4", "float16"])
def test_gpu_checks_8_rank_runs_pass_on_the_fake(tmp_path, index):
    """make gpu-check's property runs at 8 ranks (tools/gpu_check_cases.property_cases: torus2d
    on 4x2 and 2x4, float16 buffers only), same argv and check, on the fake NCCL (issue 47)."""
    import os
    import sys
    from tests.mpirun import REPO
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import gpu_check
    import gpu_check_cases
    case = gpu_check_cases.property_cases(8)[index]
    env = dict(os.environ, PYTHONPATH=REPO, NNABLA_TORUS_BACKEND="fake-nccl",
               NNABLA_TORUS_TIMEOUT="60", NNABLA_TORUS_CACHE_DIR=str(tmp_path), **case.env)
    done = gpu_check.run(case.argv, env, 900)
    assert case.check(done.stdout, done.returncode) == "every result equals numpy's"
