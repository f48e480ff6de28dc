"""train.py on the NCCL fake with an algorithm that cannot overlap on the device logs the cost
model's choice between it after backward and native overlapped once, with its numbers."""
import pytest

from tests.mpirun import run_mpi

PROG = "tests/examples/progs/train_check.py"
SMALL = ["--train-images", "64", "--image-size", "16", "--local-batch", "16", "--epochs", "1",
         "--warmup-epochs", "0",
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


@pytest.mark.slow
def test_issue33_the_overlap_choice_is_re_made_from_the_run_s_step_times(tmp_path):
    """--algorithm planned across (emulated) hosts: the model's choice runs first, then the
    other configuration, and the run logs the choice made from both measured step times
    (examples/imagenet/overlap_trial.py); the ranks stay bitwise equal through the switches."""
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": "1",
           "NNABLA_TORUS_GRID": "1x2"}
    args = ["--train-images", "64", "--image-size", "16", "--local-batch", "4",
            "--batch-schedule", "0:8", "--epochs", "2", "--warmup-epochs", "0", "--progress",
            "0", "--seed", "5", "--overlap", "1", "--algorithm", "planned"]
    out = run_mpi(2, [PROG] + args + ["--output-dir", str(tmp_path)], timeout=300, env=env)
    assert "from the cost model of profile 'cpu-2core'" in out and "timing both" in out, out
    assert out.count("from the run's measured step times") == 1, out
    assert "PARAMS_EQUAL" in out, out
