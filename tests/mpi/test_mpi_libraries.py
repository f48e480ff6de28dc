"""The communicator's MPI cases under MPICH 5, Intel MPI 2021 and the system's MPI (the rest
of the suite runs under the default, Open MPI 5 from the registry).

Each library runs from a venv of its own (one MPI library per venv; docs/mpi-libraries.md):
``$NNABLA_TORUS_TEST_VENV_<LIBRARY>`` when set, else ``.venv-mpich`` / ``.venv-impi`` /
``.venv-system`` in the repository, made on first use by ``tests.mpirun.library_python``
(0.5-1.5 min here with pip's cache warm; 5 min more when mpi4py must be built for the system
MPI; once) and skipped, with the reason, when that set-up fails (no registry, no wheel for
this machine, no mpirun on PATH outside the venvs). The cases are a subset of
tests/mpi/test_communicator.py and test_failfast_mpi.py: the correctness cases on 4 ranks
(without the 25.6 M-value ResNet-50 case), bad input, and a killed rank, an unhandled
exception and an early exit each ending the job in seconds (~50-70 s per library here).
"""
import re
import time

import pytest

from tests.mpi.test_communicator import BAD_INPUT, bad_input_lines
from tests.mpirun import expect_passed, library_python, run_mpi

PROG = "tests/mpi/progs/comm_cases.py"
LIBRARIES = ("mpich", "impi", "system")


@pytest.fixture(scope="module", params=LIBRARIES)
def python(request):
    return library_python(request.param)


def failed_run(python, argv, env=None, timeout=60):
    """Output of a job that must exit non-zero (not by run_mpi's timeout)."""
    with pytest.raises(AssertionError) as failed:       # run_mpi raises on a non-zero exit
        run_mpi(4, argv, timeout=timeout, env=env, python=python)
    out = str(failed.value).replace("\0", "")
    assert re.match(r"exit [1-9]\d*: ", out), out[:3000]   # not "timeout after": no hang
    return out


@pytest.mark.slow
def test_collectives_are_exact(python):
    out = run_mpi(4, [PROG, "correctness"], timeout=300, env={"SKIP_RESNET50": "1"},
                  python=python)
    expect_passed(out, "comm_cases correctness on 4 ranks")
    ok = re.findall(r"^OK (.*) \(", out, re.M)
    for case in ("torus2d: layout", "ring: fused and in-place lists", "native: integers",
                 "hierarchical: shared pieces", "auto: same choice on every rank",
                 "torus2d hosts-of-2 pipelined: division=True inplace=False",
                 "torus2d: loss_scaling"):
        assert case in ok, (case, out)
    assert "shared-memory path off" not in out, out   # the library's shared windows work


@pytest.mark.slow
def test_bad_input_raises_on_every_rank(python):
    out = run_mpi(4, [PROG, "bad-input"], timeout=120, python=python)
    for case, text in BAD_INPUT.items():
        for rank, line in bad_input_lines(out, 4, case).items():
            assert text in line, f"rank {rank}, {case}: {line}"
    assert out.count("still works") == 4, out


@pytest.mark.slow
def test_a_killed_rank_ends_the_job(python):
    timeout = 20
    out = failed_run(python, ["tests/mpi/progs/emu_fault.py", "--size", "1M", "--victim", "3",
                              "--kill-at", "3"], env={"NNABLA_TORUS_TIMEOUT": str(timeout)})
    ended = time.time()
    killed = re.search(r"^KILL 3 ([\d.]+)$", out, re.M)
    assert killed and "DONE" not in out, out
    # From the kill, not the launch: start-up (auto's measurement) took 30 s on a loaded machine.
    assert ended - float(killed.group(1)) < timeout, out


@pytest.mark.slow
@pytest.mark.parametrize("how, named", [
    ("raise", r"^nnabla_torus: rank 3 on host \S+: unhandled RuntimeError: boom on rank 3; "
              r"aborting the job"),
    ("exit-message", r"^nnabla_torus: rank \d+: rank\(s\) \[3\] left the script .*they will "
                     r"not arrive")])
def test_a_rank_leaving_early_ends_the_job_in_seconds(python, how, named):
    out = failed_run(python, ["tests/mpi/progs/failfast_loop.py", "--victim", "3", "--how", how,
                              "--at", "3"], env={"NNABLA_TORUS_TIMEOUT": ""}, timeout=120)
    ended = time.time()
    left = re.search(r"^LEAVE 3 ([\d.]+)$", out, re.M)
    assert left and "DONE" not in out, out
    assert re.search(named, out, re.M), out
    assert ended - float(left.group(1)) < 5.0, out
