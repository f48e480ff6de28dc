"""Noise-scale estimator on synthetic gradients with a known answer."""
import logging

import numpy as np
import pytest

from nnabla_torus.planning.noise_scale import NoiseScaleEstimator


def sample_grads(rng, true_grad, sigma, batch, count):
    """Mean of ``batch`` per-sample gradients G + N(0, sigma^2 I), ``count`` times."""
    noise = rng.normal(0.0, sigma / np.sqrt(batch), (count, true_grad.size))
    return true_grad + noise


def test_exact_expectations_give_exact_answer():
    # E|G_b|^2 = |G|^2 + tr(S)/b: with |G|^2 = 2, tr(S) = 400 -> B_simple = 200
    est = NoiseScaleEstimator(smoothing=0.0)
    est.update(2 + 400 / 8, 8, 2 + 400 / 64, 64)
    assert est.grad_sqnorm == pytest.approx(2.0)
    assert est.trace_cov == pytest.approx(400.0)
    assert est.b_simple == pytest.approx(200.0)


def test_data_parallel_estimate_within_15_percent():
    rng = np.random.default_rng(0)
    dim, sigma, ranks, b = 200, 3.0, 4, 16
    true_grad = rng.normal(0, 0.2, dim)
    truth = dim * sigma ** 2 / (true_grad @ true_grad)
    est = NoiseScaleEstimator(smoothing=0.99)
    for _ in range(2000):
        local = sample_grads(rng, true_grad, sigma, b, ranks)
        mean = local.mean(axis=0)
        est.update(np.mean(np.sum(local ** 2, axis=1)), b, mean @ mean, b * ranks)
    assert est.b_simple == pytest.approx(truth, rel=0.15)


def test_single_rank_successive_steps_within_15_percent():
    rng = np.random.default_rng(1)
    dim, sigma, b = 100, 2.0, 8
    true_grad = rng.normal(0, 0.3, dim)
    truth = dim * sigma ** 2 / (true_grad @ true_grad)
    est = NoiseScaleEstimator(smoothing=0.995)
    for grad in sample_grads(rng, true_grad, sigma, b, 3000):
        est.update_successive(grad, b)
    assert est.updates == 2999
    assert est.b_simple == pytest.approx(truth, rel=0.15)


def test_none_until_positive_and_bad_input():
    est = NoiseScaleEstimator()
    assert est.b_simple is None and est.grad_sqnorm is None
    est.update(1.0, 8, 2.0, 16)   # |G_B| > |G_b|: negative trace so far
    assert est.b_simple is None
    with pytest.raises(ValueError, match="local_batch"):
        est.update(1.0, 16, 1.0, 16)
    with pytest.raises(ValueError, match="smoothing"):
        NoiseScaleEstimator(smoothing=1.0)


def test_non_finite_norms_are_skipped_counted_and_logged(caplog):
    est = NoiseScaleEstimator(smoothing=0.0)
    assert est.update(2 + 400 / 8, 8, 2 + 400 / 64, 64)
    with caplog.at_level(logging.INFO, logger="nnabla_torus.planning.controller"):
        for bad in (float("nan"), float("inf")):
            assert not est.update(bad, 8, 1.0, 64)
            est.update(1.0, 8, bad, 64)
    assert est.skipped == 4 and est.updates == 1
    # the 1st, 2nd and 4th skip are said (before: nothing, the series repeated its last value)
    assert [r.getMessage()[:78] for r in caplog.records] == [
        "noise scale: observation skipped, a squared gradient norm is not finite (local"] * 3
    assert "(local 1, global inf); 4 skipped and 1 used so far" in caplog.records[2].getMessage()
    assert est.b_simple == pytest.approx(200.0)
    est._sums = np.array([np.inf, np.inf])       # inf / inf: NaN, not a batch size
    assert est.b_simple is None


def observe(est, trace, big_b):
    """One step at global batch ``big_b`` (4 ranks of big_b / 4) with |G|^2 = 2 exactly."""
    est.update(2 + trace / (big_b / 4), big_b / 4, 2 + trace / big_b, big_b)


def test_memory_is_in_samples_not_steps():
    # phi moves from 100 to 400 (tr(S) 200 -> 800, |G|^2 = 2). Two steps at batch 64 and one
    # step at batch 128 see the same samples, so they move the estimate alike; numpy reference:
    # the EMA's weights (1 - m_i) prod_{j > i} m_j with m_i = 0.9 ** (B_i / 64).
    small, big = NoiseScaleEstimator(smoothing=0.9), NoiseScaleEstimator(smoothing=0.9)
    for est in (small, big):
        for _ in range(30):
            observe(est, 200.0, 64)
    for _ in range(2):
        observe(small, 800.0, 64)
    observe(big, 800.0, 128)
    assert big.trace_cov == pytest.approx(small.trace_cov, rel=1e-12)
    batches = [64] * 30 + [128]
    traces = np.array([200.0] * 30 + [800.0])
    m = 0.9 ** (np.array(batches) / 64)
    w = (1 - m) * np.append(np.cumprod(m[::-1])[::-1][1:], 1.0)
    assert big.trace_cov == pytest.approx(w @ traces / w.sum(), rel=1e-12)
    assert big.b_simple == pytest.approx(big.trace_cov / 2.0)
    with pytest.raises(ValueError, match="reference_batch=0 must be > 0"):
        NoiseScaleEstimator(reference_batch=0)
    with pytest.raises(ValueError, match="min_memory_steps=0.5 must be >= 1"):
        NoiseScaleEstimator(min_memory_steps=0.5)


@pytest.mark.parametrize("big_b", [256, 1024])
def test_a_large_batch_step_keeps_at_least_min_memory_steps(big_b):
    # At 16x B0 the samples alone decay by 0.95 ** 16 = 0.44 a step; the floor keeps 0.8
    # (min_memory_steps 5): numpy reference with m = max(0.95 ** (B / 64), 0.8). At 4x B0
    # (0.95 ** 4 = 0.81) the floor does not bind and the memory is in samples.
    est = NoiseScaleEstimator(smoothing=0.95, reference_batch=64)
    unfloored = NoiseScaleEstimator(smoothing=0.95, reference_batch=64, min_memory_steps=1)
    traces = [200.0] * 20 + [800.0, 100.0, 800.0]
    batches = [64] * 20 + [big_b] * 3
    for trace, b in zip(traces, batches):
        observe(est, trace, b)
        observe(unfloored, trace, b)
    m = np.maximum(0.95 ** (np.array(batches) / 64), 0.8)
    w = (1 - m) * np.append(np.cumprod(m[::-1])[::-1][1:], 1.0)
    assert est.trace_cov == pytest.approx(w @ np.array(traces) / w.sum(), rel=1e-12)
    if big_b == 256:
        assert est.trace_cov == pytest.approx(unfloored.trace_cov, rel=1e-12)
    else:   # the last step alone weighs 0.56 without the floor, 0.2 with it
        assert unfloored.trace_cov > 1.3 * est.trace_cov
        assert NoiseScaleEstimator(smoothing=0.0).decay_floor == 0.0   # 0 still means none


def test_a_squared_norm_beyond_float32_is_finite():
    """Before: a float32 dot of gradients ~1e20 overflowed to inf and the noise scale skipped
    every observation of a run whose gradients were finite."""
    from nnabla_torus.comm.backends.mpi import MPIBackend
    big = np.full(17, 1e20, np.float32)
    assert MPIBackend.sqnorm(big) == pytest.approx(17 * float(np.float32(1e20)) ** 2)
    assert MPIBackend.sqnorm(np.array([1, np.inf], np.float32)) == np.inf
