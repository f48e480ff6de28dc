"""make gpu-check's fault case (tools/gpu_check_cases.fault_case) run here with the same argv
and check: the last rank SIGKILLs itself inside an all-reduce loop, and the job must end,
non-zero, naming it, within NNABLA_TORUS_TIMEOUT + 10 s of the kill. On the fake NCCL the
survivors' collectives spin as NCCL's kernels do (fake_cuda.complete); on MPI they block."""
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
