"""make gpu-check's fault case (tools/gpu_check_cases.fault_case) run here with the same argv
and check: the last rank SIGKILLs itself inside an all-reduce loop, and the job must end,
non-zero, naming it, within NNABLA_TORUS_TIMEOUT + 10 s of the kill. On the fake NCCL the
survivors' collectives spin as NCCL's kernels do (fake_cuda.complete); on MPI they block.
And a rank stopped or killed while the others train through nnabla's all_reduce_callback (the
NCCL backend's default path; tests/mpi/progs/stop_in_backward.py): the job ends within the
timeout, as a hung CPU rank's does."""
import os
import sys

import pytest

from tests.mpirun import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import gpu_check  # noqa: E402
import gpu_check_cases as cases  # noqa: E402


@pytest.mark.parametrize("backend, ranks", [("fake-nccl", 4), ("mpi", 4)])
def test_a_rank_killed_in_an_all_reduce_is_named_in_time(tmp_path, backend, ranks):
    case = cases.fault_case(ranks, size="1M")
    env = dict(os.environ, PYTHONPATH=REPO, NNABLA_TORUS_BACKEND=backend,
               NNABLA_TORUS_CACHE_DIR=str(tmp_path), **case.env)
    done = gpu_check.run(case.argv, env, cases.FAULT_TIMEOUT_S + 60)
    detail = case.check(done.stdout, done.returncode)
    assert detail.startswith(f"rank {ranks - 1} named"), detail


def test_the_fault_check_refuses_a_hang_a_wrong_name_and_a_late_end():
    out = ("KILL 3 100.0\nprocess rank 3 with PID 9 on node vm exited on signal 9\n"
           "gpu-check: ended at 105.0 (exit 137)\n")
    assert cases.check_fault(out, 137, 3) == "rank 3 named, job ended 5.0 s after the kill"
    for text, code, why in [(out, 124, "did not end by itself"),
                            (out.replace("rank 3 with", "rank 2 with"), 137,
                             r"named rank\(s\) \[2\]"),
                            (out.replace("105.0", "131.0"), 137, "31.0 s after the kill")]:
        with pytest.raises(cases.CaseFailed, match=why):
            cases.check_fault(text, code, 3)


def stop_run(tmp_path, case, ranks=3):
    """Run a case of tests/mpi/progs/stop_in_backward.py on the fake NCCL, one host (nnabla's
    callback path, native)."""
    env = dict(os.environ, PYTHONPATH=REPO, NNABLA_TORUS_BACKEND="fake-nccl",
               NNABLA_TORUS_RANKS_PER_HOST=str(ranks), NNABLA_TORUS_CACHE_DIR=str(tmp_path),
               **case.env)
    return gpu_check.run(case.argv, env, cases.FAULT_TIMEOUT_S + 60)


@pytest.mark.slow
@pytest.mark.parametrize("at", ["check", "nccl"])
def test_a_stopped_rank_on_nnablas_callback_path_ends_the_job_in_time(tmp_path, at):
    """gpu-check's stop case (tools/gpu_check_cases.stop_case) on the fake: SIGSTOP of a rank,
    its peers wait inside backward (nnabla's per-gradient MPI check, or the last pack's NCCL
    all-reduce); the watchdog ends the job past the timeout. The old code ran that backward
    with no watchdog: the job hung until the run's limit killed it."""
    case = cases.stop_case(3, "cpu", at)
    done = stop_run(tmp_path, case)
    detail = case.check(done.stdout, done.returncode)
    print(f"{case.name} ({at}): {detail}")


@pytest.mark.slow
def test_a_rank_killed_while_its_peers_wait_in_nccl_is_named(tmp_path):
    """SIGKILL of a rank after its last MPI check: its peers wait in the last pack's NCCL
    all-reduce, which cannot tell a dead peer; the job ends naming it (gpu-check's fault
    check: mpirun's line, or the watchdog's, which tests/mpirun.py's LOST reads)."""
    case = cases.stop_case(3, "cpu", "nccl")
    case = case._replace(argv=case.argv + ["--signal", "KILL"])
    done = stop_run(tmp_path, case)
    detail = cases.check_fault(done.stdout, done.returncode, 2)
    print(detail)


def test_the_stop_check_refuses_a_hang_a_silent_end_and_a_late_end():
    out = ("STOP 3 100.0\nnnabla_torus: rank 0: backward with nnabla's all_reduce_callback did "
           "not finish within 20 s (...)\ngpu-check: ended at 121.0 (exit 70)\n")
    assert cases.check_stop(out, 70, 3) == "rank 3 stopped, the watchdog ended the job 21.0 s later"
    for text, code, why in [(out, 124, "did not end by itself"),
                            (out.replace("did not finish", "x"), 70, "no watchdog line"),
                            (out.replace("121.0", "131.0"), 70, "31.0 s after the stop")]:
        with pytest.raises(cases.CaseFailed, match=why):
            cases.check_stop(text, code, 3)
