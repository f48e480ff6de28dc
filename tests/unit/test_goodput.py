"""Goodput objective: invariants over seeded random parameters, the confidence rule, and the
hysteresis that keeps a noisy estimate from flapping the batch (Pollux, arXiv:2008.12260)."""
import logging

import numpy as np
import pytest

from nnabla_torus.planning import goodput
from nnabla_torus.planning.controller import BatchSizeController
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator


def random_model(seed):
    rng = np.random.default_rng(seed)
    base = int(rng.integers(1, 4096))
    phi = float(10 ** rng.uniform(0, 6))
    batches = np.sort(rng.integers(base, base * 200, 37))
    return rng, base, phi, batches


@pytest.mark.parametrize("seed", range(30))
def test_efficiency_in_unit_interval_and_monotone(seed):
    rng, base, phi, batches = random_model(seed)
    eff = goodput.efficiency(batches, phi, base)
    assert np.all(eff > 0) and np.all(eff <= 1)
    assert np.all(np.diff(eff) <= 0)                       # larger batch: less per sample
    assert goodput.efficiency(base, phi, base) == 1.0
    # gain: steps at B0 a step at B is worth, in [1, B/B0] and increasing in B
    g = goodput.gain(batches, phi, base)
    assert np.all(g >= 1 - 1e-12) and np.all(g <= batches / base + 1e-9)
    assert np.all(np.diff(g) >= -1e-9)
    np.testing.assert_allclose(g, batches / base * eff)
    # more noise: closer to perfect scaling
    assert np.all(goodput.efficiency(batches, phi * 10, base) >= eff)


@pytest.mark.parametrize("seed", range(30))
def test_choice_respects_bounds_and_is_the_optimum_when_phi_is_exact(seed):
    rng, base, phi, batches = random_model(seed)
    # sublinear throughput: a + b*B per step (fixed cost amortised), like the cost model
    fixed, per_sample = rng.uniform(1e-3, 1.0), rng.uniform(1e-5, 1e-2)
    throughput = batches / (fixed + per_sample * batches)
    d = goodput.decide(batches, throughput, phi, 0.0, base, current=0, model_error=0.0)
    assert 0 <= d.best < len(batches) and batches[0] <= batches[d.best] <= batches[-1]
    assert d.gain == pytest.approx(d.goodput[d.best] / d.goodput[0])
    # phi known exactly: the optimum, moved to when it gains more than MIN_GAIN
    assert d.goodput[d.best] == d.goodput.max()
    assert d.change == (d.best != 0 and d.gain - 1 > goodput.MIN_GAIN)
    # flat throughput: no batch is worth more than the smallest
    flat = goodput.decide(batches, np.ones(len(batches)), phi, 0.0, base, 0, 0.0)
    assert flat.best == 0 and not flat.change


def test_hand_worked_machine_numbers():
    # This machine (cpu-2core, 4 ranks): 64 -> 390 images/s, 128 -> 444 (+14 %).
    assert float(goodput.efficiency(128, 300.0, 64)) == pytest.approx(364 / 428)
    d = goodput.decide([64, 128], [390.0, 444.0], 300.0, 0.2, 64, current=0, model_error=0.145)
    assert d.best == 0 and not d.change                   # 444/390 x 364/428 = 0.97
    d = goodput.decide([64, 128], [390.0, 444.0], 1e6, 0.2, 64, current=0, model_error=0.145)
    assert d.best == 1 and not d.change                   # +13.8 % < 14.5 % error: keep
    d = goodput.decide([64, 128], [390.0, 600.0], 1e6, 0.2, 64, current=0, model_error=0.145)
    assert d.change                                       # +54 % is outside the error


@pytest.mark.parametrize("seed", range(20))
def test_threshold_grows_with_errors_and_never_below_min_gain(seed):
    rng, base, phi, batches = random_model(seed)
    b, now = float(batches[-1]), float(batches[0])
    low = goodput.prediction_error(b, now, phi, 0.0, 0.0)
    assert low == goodput.MIN_GAIN
    rse, err = rng.uniform(0, 1), rng.uniform(0, 0.5)
    high = goodput.prediction_error(b, now, phi, rse, err)
    assert high >= max(goodput.MIN_GAIN, err)
    assert goodput.prediction_error(b, now, phi, 2 * rse, err) >= high


def test_the_choice_is_the_best_batch_at_the_low_end_of_phi():
    # Seed 4 on the emulated cluster at step 10 (its logged refit: 4 ranks, step = accum x
    # (10.98 ms + 2.145 ms x local) + 359 ms; phi = 188 +- 40 %). At phi, 384 is the optimum
    # and 512 is within 4 % of it; at phi x 0.6, 256 is, and 512 is 10 % below it. Taking the
    # largest batch within 5 % at phi moved this seed to 512, which never reached 90 %.
    batches = np.array([64, 128, 256, 384, 512])
    local, accum = np.array([16, 32, 32, 32, 32]), np.array([1, 1, 2, 3, 4])
    speed = 4 * local * accum / (accum * (0.01098 + 0.002145 * local) + 0.359)
    error = np.where(batches == 64, 0.05, 0.145)
    low = goodput.goodput(speed, batches, 188.0 * 0.6, 64)
    assert np.argmax(low) == 2 and low[4] < 0.91 * low.max()
    d = goodput.decide(batches, speed, 188.0, 0.4, 64, current=0, model_error=error)
    assert batches[d.best] == 256 and d.change
    assert d.gain == pytest.approx(d.goodput[2] / d.goodput[0])
    assert d.threshold == pytest.approx(goodput.prediction_error(256, 64, 188.0, 0.4, 0.145))
    # phi known exactly: the optimum at phi
    assert batches[goodput.decide(batches, speed, 188.0, 0.0, 64, 0, error).best] == 384
    # at 384 already, 256 is better only if phi is low: inside the error, keep
    d = goodput.decide(batches, speed, 188.0, 0.4, 64, current=3, model_error=error)
    assert batches[d.best] == 256 and d.gain < 1 and not d.change


def test_threshold_is_exact_at_the_pessimistic_end_of_phi():
    # a move up must pay at phi x (1 - rse), a move down at phi x (1 + rse)
    phi, rse, err = 150.0, 0.4, 0.06
    up = goodput.prediction_error(256, 64, phi, rse, err)
    low = phi * (1 - rse)
    assert 1 + up == pytest.approx(
        (1 + err) * (phi + 64) / (phi + 256) / ((low + 64) / (low + 256)))
    high = phi * (1 + rse)
    down = goodput.prediction_error(64, 256, phi, rse, err)
    assert 1 + down == pytest.approx(
        (1 + err) * (phi + 256) / (phi + 64) / ((high + 256) / (high + 64)))
    # small rse: the first-order term |d ln(E(B)/E(B_now)) / d ln phi| x rse
    linear = err + (phi / (phi + 64) - phi / (phi + 256)) * 0.01
    assert goodput.prediction_error(256, 64, phi, 0.01, err) == pytest.approx(linear, rel=1e-2)
    # large rse: beyond the linear term, and a move that pays only at phi itself is held
    assert up > err + (phi / (phi + 64) - phi / (phi + 256)) * rse
    # +22 %: linear error 19 %, exact 26 %
    speed = [148.0, 1.22 * 148.0 * (phi + 256) / (phi + 64)]
    d = goodput.decide([64, 256], speed, phi, rse, 64, current=0, model_error=err)
    assert d.best == 1 and d.gain == pytest.approx(1.22) and not d.change
    assert goodput.decide([64, 256], speed, phi, 0.05, 64, current=0, model_error=err).change


def test_confidence_rule_blocks_early_decisions():
    assert not goodput.confidence(5, 0.01, 20, 0.25).ok
    assert not goodput.confidence(50, 0.4, 20, 0.25).ok
    assert not goodput.confidence(50, float("nan"), 20, 0.25).ok
    assert goodput.confidence(20, 0.25, 20, 0.25).ok


def feed(est, phi, rng, noise=0.0):
    """One observation whose tr(S)/|G|^2 is ``phi`` (times a lognormal error)."""
    g2, b, big_b = 1.0, 8, 64
    trace = phi * g2 * float(np.exp(rng.normal(0, noise)))
    est.update(g2 + trace / b, b, g2 + trace / big_b, big_b)



def controller(throughput=None, **kw):
    est = NoiseScaleEstimator(smoothing=0.9)
    ctrl = BatchSizeController(4, 64, noise_scale=est, base_batch=32, lr_scaling="linear",
                               min_batch=32, max_batch=4096, throughput=throughput, **kw)
    return est, ctrl


def scaling_throughput(local, accum):
    """1 ms per micro-batch whatever its size: 4 ranks x local images per ms, accumulation
    buys nothing (a bigger per-rank batch is proportionally faster up to the memory limit)."""
    return 4.0 * local * accum / (0.001 * accum)


def test_no_decision_before_the_estimate_is_trustworthy(caplog):
    est, ctrl = controller(scaling_throughput, min_samples=20, max_rse=0.25)
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.INFO, logger="nnabla_torus.planning.controller"):
        assert ctrl.plan(0.0).global_batch == 32
        for step in range(19):
            feed(est, 2000.0, rng)                         # a huge noise scale, measured early
            assert ctrl.plan(step * 0.01).global_batch == 32, step
        assert ctrl.decisions == 0
        feed(est, 2000.0, rng)                             # the 20th sample: now it may act
        plan = ctrl.plan(0.3)
    assert plan.changed and plan.global_batch > 32
    assert "phi = 2000" in plan.reason and "20 samples" in plan.reason
    assert "goodput 32000 -> 230582" in plan.reason              # the numbers that drove it


def test_a_noisy_estimate_does_not_flap_the_batch():
    # throughput gains 10 % from 32 to 256 (inside the 14.5 % model error): never move,
    # whatever the noisy estimate says; with a 1 % model error it may move, but only once
    # or twice, not at every step.
    def mild(local, accum):
        batch = 4.0 * local * accum
        return batch / (0.01 * batch / 32 * (1 - 0.1 * np.minimum(batch, 256) / 256))
    est, ctrl = controller(mild, model_error=0.145)
    rng = np.random.default_rng(1)
    batches = []
    for step in range(400):
        feed(est, 500.0, rng, noise=1.0)
        batches.append(ctrl.plan(step / 40).global_batch)
    assert set(batches) == {32}
    est, ctrl = controller(mild, model_error=0.01, max_rse=10.0)
    changes = 0
    for step in range(400):
        feed(est, 500.0, rng, noise=1.0)
        changes += ctrl.plan(step / 40).changed
    assert changes <= 4, changes


def test_learning_rate_follows_the_gain():
    est, ctrl = controller(scaling_throughput, min_samples=2, max_rse=1.0, adaptive_lr="gain")
    rng = np.random.default_rng(2)
    for _ in range(5):
        feed(est, 1000.0, rng)
    plan = ctrl.plan(1.0)
    phi = est.b_simple
    assert plan.lr_factor == pytest.approx(float(goodput.gain(plan.global_batch, phi, 32)))
    assert 1 < plan.lr_factor < plan.global_batch / 32      # below linear scaling
    keep_est, keep = controller(scaling_throughput, min_samples=2, max_rse=1.0,
                                lr_at_change="keep")
    for _ in range(5):
        feed(keep_est, 1000.0, rng)
    assert keep.plan(1.0).lr_factor == 1.0                  # the starting batch's rate


def test_noise_scale_relative_error_shrinks_with_samples():
    rng = np.random.default_rng(3)
    est = NoiseScaleEstimator(smoothing=0.95)
    assert est.rse == float("inf")
    errors = []
    for n in range(1, 201):
        feed(est, 300.0, rng, noise=0.5)
        if n in (5, 200):
            errors.append(est.rse)
    assert errors[1] < errors[0] and 0 < errors[1] < 0.2
    assert est.b_simple == pytest.approx(300.0 * np.exp(0.125), rel=0.3)


# -- the batch that trains is the batch every line, series and lr factor uses (issue 34) -----
def adaptive(world, min_batch, max_batch=None, max_local=32):
    return BatchSizeController(world, max_local, noise_scale=NoiseScaleEstimator(), base_batch=64,
                               min_batch=min_batch, max_batch=max_batch)


def test_a_bound_no_world_realises_moves_onto_the_nearest_realisable_batch():
    """Before: 3 ranks trained at 63 (21 x 3) while every decision said 66 -> 66."""
    ctrl = adaptive(3, 64)
    plan = ctrl.plan(0.0)
    assert (plan.global_batch, plan.local_batch, ctrl.min_batch) == (66, 22, 66)
    assert plan.lr_factor == pytest.approx(66 / 64)
    assert "min_batch 64 is not realisable on 3 ranks: B0 = 66" in ctrl.pop_notes()[0]


def test_min_batch_1_on_4_ranks_trains_at_4_with_the_lr_of_4():
    """Before: batch 4 trained with the learning-rate factor of batch 1 (1/64 instead of 4/64)."""
    plan = adaptive(4, 1).plan(0.0)
    assert (plan.global_batch, plan.lr_factor) == (4, pytest.approx(4 / 64))


@pytest.mark.parametrize("bounds, moved", [((16, 32), 32), ((256, 512), 256)])
def test_a_resumed_batch_outside_the_bounds_moves_inside_at_once(bounds, moved):
    """Before: resumed at 64, --min-batch 16 --max-batch 32 logged "batch 32 -> 32: the best
    batch is the one in use" and trained at 64; 256..512 logged 256 and trained at 64."""
    from nnabla_torus.planning.controller import BatchPlan
    ctrl = adaptive(2, *bounds)
    ctrl.current = BatchPlan(64, 32, 1, 1.0, False, "saved")          # the checkpoint's plan
    plan = ctrl.plan(1.0)
    assert (plan.global_batch, plan.changed) == (moved, True)
    assert plan.global_batch == 2 * plan.local_batch * plan.accum_steps
    assert plan.lr_factor == pytest.approx(moved / 64)
    assert f"the batch in use 64 is outside [{bounds[0]}, {bounds[1]}]" in plan.reason


def test_bounds_no_world_can_realise_are_refused_at_start():
    with pytest.raises(ValueError, match=r"no global batch in \[1, 2\] is realisable on 4 ranks"):
        adaptive(4, 1, 2)
