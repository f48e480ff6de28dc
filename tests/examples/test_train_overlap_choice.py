"""train.py on the NCCL fake with an algorithm that cannot overlap on the device logs the cost
model's choice between it after backward and native overlapped once, with its numbers."""
import pytest

from tests.mpirun import run_mpi

PROG = "tests/examples/progs/train_check.py"
SMALL = ["--train-images", "64", "--image-size", "16", "--local-batch", "16", "--epochs", "1", "--warmup-epochs", "0",
         "--progress", "0", "--seed", "5", "--overlap", "1"]


@pytest.mark.slow
def test_issue19_overlap_choice_is_logged_once_and_an_asked_algorithm_kept(tmp_path):
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": "1"}
    out = run_mpi(2, [PROG] + SMALL + ["--algorithm", "torus2d", "--output-dir", str(tmp_path)],
                  timeout=240, env=env)
    assert out.count("overlap across hosts: ") == 1, out
    assert "all-reduce torus2d " in out and " ms; step torus2d after backward " in out, out
    assert "(kept torus2d: --algorithm torus2d was asked for)" in out, out
    assert "overlap off: " in out and "PARAMS_EQUAL" in out, out
