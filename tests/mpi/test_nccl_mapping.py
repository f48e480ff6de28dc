"""The NCCL backend's mapping onto nnabla-ext-cuda's communicator: against the fake at 2, 4 and
6 ranks, and against real NCCL when nnabla-ext-cuda and two GPUs are present (else skipped)."""
import re
import subprocess
import sys
import time

import pytest

from tests.mpirun import expect_passed_on_every_rank, run_mpi
from tests.slowdown import scaled

MAPPING = "tests/mpi/progs/check_nccl_mapping.py"


def test_fake_matches_nnabla_api():
    out = run_mpi(4, ["tests/mpi/progs/check_fake_nccl.py"], timeout=90)
    expect_passed_on_every_rank(out, "fake-nccl api", 4)


@pytest.mark.parametrize("ranks, grids, ranks_per_host", [
    (2, "2x1", 2), (4, "2x2", 2), (6, "3x2,2x3", 3)])
def test_mapping_on_fake(ranks, grids, ranks_per_host):
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": str(ranks_per_host)}
    out = run_mpi(ranks, [MAPPING, "--grids", grids], timeout=120, env=env)
    expect_passed_on_every_rank(out, "nccl mapping", ranks)


@pytest.mark.parametrize("default", ["float", "half"])
def test_finding1_mapping_does_not_depend_on_the_default_context(default):
    """The caller's default context is float or half on device 0, while the buffers live on
    each rank's own fake GPU: every copy must run in the buffer's own context."""
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": "1"}
    out = run_mpi(2, [MAPPING, "--grids", "2x1", "--default-type", default], timeout=120, env=env)
    expect_passed_on_every_rank(out, "nccl mapping", 2)


def test_findings4_7_one_device_number_and_a_lazy_half_communicator():
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": "1"}
    out = run_mpi(2, ["tests/mpi/progs/check_nccl_findings.py"], timeout=90, env=env)
    expect_passed_on_every_rank(out, "nccl findings", 2)


@pytest.mark.parametrize("backend, ranks, per_host, want", [
    ("fake-nccl", 2, None, "native 2x1"),       # one host: NCCL's own all-reduce
    ("fake-nccl", 4, "2", "torus2d 2x2"),       # 2 hosts x 2: rows inside hosts
    ("fake-nccl", 4, "1", "native 4x1"),        # one rank per host: no row to keep local
    ("mpi", 4, None, "auto 4x1"),               # MPI: auto (issue 22), its torus one row per host
])
def test_issue19_finding11_default_algorithm_per_backend(backend, ranks, per_host, want):
    env = {"NNABLA_TORUS_BACKEND": backend}
    if per_host:
        env["NNABLA_TORUS_RANKS_PER_HOST"] = per_host
    out = run_mpi(ranks, ["tests/mpi/progs/check_nccl_findings.py", "default-algorithm"],
                  timeout=90, env=env)
    said = re.findall(r"DEFAULT rank \d+: (\w+ \d+x\d+)", out)
    assert said == [want] * ranks, out


def test_finding3_a_hung_nccl_phase_ends_the_job_naming_it():
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_TIMEOUT": "3"}
    start = time.monotonic()
    out = run_mpi(3, ["tests/mpi/progs/check_nccl_findings.py", "hang"], timeout=90, env=env,
                  check=False)
    elapsed = time.monotonic() - start
    assert "RETURNED" not in out and "PASSED nccl findings" not in out, out
    assert re.search(r"rank [01]: NCCL reduce_scatter on group \[0, 1, 2\] \(rank [01] on .*\) "
                     r"did not finish within 3 s", out), out
    assert elapsed < scaled(40), elapsed


def test_bad_input_no_cuda_extension_is_one_message_on_every_rank():
    out = run_mpi(2, ["tests/mpi/progs/check_nccl_findings.py", "no-cuda"], timeout=90)
    said = re.findall(r"NO-CUDA rank (\d): loading the nccl backend failed on rank 0 \(2 rank\(s\) "
                      r"failed\): RuntimeError: the nccl backend needs nnabla-ext-cuda", out)
    assert sorted(said) == ["0", "1"], out


def cuda_gpus():
    """(GPUs nnabla-ext-cuda sees, why none), asked in a child so pytest keeps no CUDA state."""
    probe = "from nnabla_ext.cuda.init import get_device_count; print(get_device_count())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=scaled(120))
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return 0, f"nnabla-ext-cuda is not importable ({last})"
    return int(done.stdout.split()[-1]), "nnabla-ext-cuda sees fewer than 2 GPUs"


@pytest.mark.gpu
def test_mapping_on_real_nccl():
    gpus, why = cuda_gpus()
    if gpus < 2:
        pytest.skip(f"{why}: the NCCL mapping is tested against the fake only")
    ranks, grids = (4, "2x2") if gpus >= 4 else (2, "2x1")
    env = {"NNABLA_TORUS_BACKEND": "nccl", "NNABLA_TORUS_RANKS_PER_HOST": "2"}
    out = run_mpi(ranks, [MAPPING, "--grids", grids, "--ext", "cudnn"], timeout=300, env=env)
    expect_passed_on_every_rank(out, "nccl mapping", ranks)
