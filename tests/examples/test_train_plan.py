"""The planner in the ImageNet example under mpirun: it chooses, logs and reports.

With ``--plan on`` (the default; spelled ``auto`` here, its old name, which still works) rank 0
logs the plan for the launched ranks at each global batch and the best rank count of the
profile, the run switches to the planned algorithm and the JSON summary reports it; an
explicit ``--algorithm`` is only advised; a bad profile is a one-line error on every rank.
"""
import re

import pytest

from tests.examples.train_output import summary_of
from tests.mpirun import run_mpi

TRAIN = "examples/imagenet/train.py"
TINY = ["--train-images", "128", "--epochs", "2", "--image-size", "16", "--local-batch", "16",
        "--batch-schedule", "0:32,1:64", "--reference-batch", "32", "--warmup-epochs", "0.5",
        "--progress", "0", "--checkpoint-every", "0"]


@pytest.mark.slow
def test_plan_auto_logs_applies_and_reports(tmp_path):
    out = run_mpi(2, ["tests/examples/progs/train_check.py"] + TINY +
                  ["--plan", "auto", "--output-dir", str(tmp_path)], timeout=120)
    assert "PARAMS_EQUAL" in out, out
    for batch in (32, 64):                             # planned again after the batch change
        assert f"planner (cpu-2core): global batch {batch} on 2 ranks" in out, out
        assert f"planner: at global batch {batch} " in out, out
    assert out.count("planner (cpu-2core)") == 2, out  # rank 0 only
    summary = summary_of(out)
    plan = summary["plan"]
    assert plan["profile"] == "cpu-2core" and plan["global_batch"] == 64
    assert (summary["algorithm"], summary["grid"]) == (plan["in_use"]["algorithm"],
                                                       plan["in_use"]["grid"])
    assert plan["recommended"]["global_batch"] == 64 and plan["speedup"] > 0


@pytest.mark.slow
def test_explicit_algorithm_is_kept_and_bad_profile_is_an_error(tmp_path):
    out = run_mpi(2, [TRAIN] + TINY + ["--algorithm", "native", "--max-steps", "2",
                                       "--output-dir", str(tmp_path)], timeout=120)
    assert "keeping native as set" in out, out
    assert summary_of(out)["algorithm"] == "native"
    # The config line says what runs, and nnabla's import banner is not printed.
    assert re.search(r"; 2 ranks, all-reduce native on grid \S+$", out, re.M), out
    assert "Initializing CPU extension" not in out, out
    out = run_mpi(2, [TRAIN] + TINY + ["--profile", "no-such-cluster", "--output-dir",
                                       str(tmp_path)], timeout=120, check=False)
    error = "train.py: error: no profile file or shipped profile 'no-such-cluster'"
    # Every rank finds the error; the first to print it ends the job (failfast.abort_job).
    assert out.count(error) >= 1 and "Traceback" not in out, out
