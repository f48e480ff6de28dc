"""Issue 47 finding 4: a default (fp32) training step waits on the device twice, not once per
parameter: its loss and error read together, and the finiteness of its gradients read as one
fused sum (divergence.gradient_abs_sum), where nnabla's check_inf_or_nan_grad waited once per
gradient (161 for ResNet-50). Counted by the fake device (tests/examples/progs/
count_host_syncs.py), step by step, on the NCCL fake."""
import re

import pytest

from tests.mpirun import run_mpi

PROG = "tests/examples/progs/count_host_syncs.py"
HOST_SYNCS = re.compile(r"^HOST_SYNCS step (\d+): (\d+) \((.*)\)$", re.M)


def small_run(tmp_path):
    return ["--train-images", "48", "--image-size", "16", "--local-batch", "4",
            "--batch-schedule", "0:8", "--epochs", "1", "--warmup-epochs", "0",
            "--progress", "0", "--output-dir", str(tmp_path)]


@pytest.mark.slow
def test_a_default_step_reads_the_device_twice(tmp_path):
    out = run_mpi(2, [PROG] + small_run(tmp_path), timeout=300,
                  env={"NNABLA_TORUS_BACKEND": "fake-nccl"})
    steps = HOST_SYNCS.findall(out)
    assert len(steps) == 6, out
    for step, total, what in steps:
        assert (total, what) == ("2", "host_read: 2"), (step, total, what)


@pytest.mark.slow
def test_issue66_an_fp16_step_reads_the_device_twice(tmp_path):
    """FP16: the overflow check is one fused inf/NaN count (loss_scaling.NonfiniteCount), its
    wait under the watchdog (an event) and one read, where nnabla's check_inf_or_nan_grad
    waited once per parameter: 63 waits a step for this ResNet-18 (62 parameters)."""
    out = run_mpi(2, [PROG] + small_run(tmp_path) + ["--type-config", "half"], timeout=300,
                  env={"NNABLA_TORUS_BACKEND": "fake-nccl"})
    steps = HOST_SYNCS.findall(out)
    assert len(steps) == 6, out
    for step, total, what in steps:
        assert (total, what) == ("2", "event: 1, host_read: 1"), (step, total, what)
