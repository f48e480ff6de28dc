"""train.py's FP16 path (dynamic loss scaling around the overlapped all-reduce) at 2 ranks on CPU.

nnabla's CPU build has no FP16 kernels, so ``--type-config half`` on CPU computes in fp32 but
runs the loss scaling: with power-of-two scales the unscaled gradients, and so the parameters,
equal the fp32 run's bitwise; an initial scale above float32's range overflows the first step,
which every rank skips.
"""
import numpy as np
import pytest

from tests.mpirun import run_mpi

PROG = "tests/examples/progs/train_check.py"
SMALL = ["--train-images", "128", "--image-size", "16", "--local-batch", "16", "--epochs", "2",
         "--progress", "0", "--seed", "5", "--overlap", "1"]


@pytest.mark.slow
def test_fp16_path_with_overlap_equals_fp32(tmp_path):
    params = {}
    for type_config in ("float", "half"):
        out = run_mpi(2, [PROG, "--save-params", str(tmp_path / f"{type_config}.npz")] + SMALL +
                      ["--type-config", type_config, "--output-dir", str(tmp_path / type_config)],
                      timeout=240)
        assert "PARAMS_EQUAL" in out and "overlap off" not in out, out
        params[type_config] = np.load(tmp_path / f"{type_config}.npz")
    assert "with the FP16 dynamic loss scaling" in out, out
    for name in params["float"].files:
        np.testing.assert_array_equal(params["half"][name], params["float"][name], err_msg=name)


@pytest.mark.slow
def test_overflowed_step_is_skipped_on_every_rank(tmp_path):
    out = run_mpi(2, [PROG] + SMALL + ["--type-config", "half", "--loss-scale", "6.8e38",
                                       "--output-dir", str(tmp_path)], timeout=240)
    assert "step 0: FP16 gradients overflowed, update skipped; loss scale now 3.4e+38" in out, out
    assert "PARAMS_EQUAL" in out, out


@pytest.mark.slow
def test_issue19_fp16_overlap_on_the_nccl_fake_equals_overlap_off(tmp_path):
    """fake-nccl, one host, --algorithm native: overlap goes through nnabla's
    all_reduce_callback (seeded with the loss scale, then unscaled) and gives the parameters of
    the run that all-reduces after backward, bitwise. The old code turned overlap off here."""
    env = {"NNABLA_TORUS_BACKEND": "fake-nccl", "NNABLA_TORUS_RANKS_PER_HOST": "2"}
    params = {}
    for overlap in ("1", "0"):
        args = SMALL[:-1] + [overlap]                  # SMALL ends with "--overlap", "1"
        out = run_mpi(2, [PROG, "--save-params", str(tmp_path / f"{overlap}.npz")] + args +
                      ["--type-config", "half", "--algorithm", "native",
                       "--output-dir", str(tmp_path / overlap)], timeout=240, env=env)
        assert "PARAMS_EQUAL" in out and "overlap off" not in out, out
        params[overlap] = np.load(tmp_path / f"{overlap}.npz")
    for name in params["0"].files:
        np.testing.assert_array_equal(params["1"][name], params["0"][name], err_msg=name)
