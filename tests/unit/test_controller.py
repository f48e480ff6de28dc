"""Batch-size controller: invariants, LR scaling, hysteresis, logging."""
import logging

import numpy as np
import pytest

from nnabla_torus.planning.controller import BatchSizeController
from nnabla_torus.planning.splits import split_batch
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from nnabla_torus.planning.schedules import BatchSchedule


@pytest.mark.parametrize("seed", range(20))
def test_plan_invariant(seed):
    rng = np.random.default_rng(seed)
    world, max_local = int(rng.integers(1, 300)), int(rng.integers(1, 512))
    batches = sorted(set(int(b) for b in rng.integers(1, 100000, 3)))
    sched = BatchSchedule([(i * 3, b) for i, b in enumerate(batches)])
    ctrl = BatchSizeController(world, max_local, schedule=sched, base_batch=256)
    for epoch in np.linspace(0, 10, 23):
        plan = ctrl.plan(float(epoch))
        assert plan.global_batch == world * plan.local_batch * plan.accum_steps
        assert 1 <= plan.local_batch <= max_local
        assert plan.lr_factor == pytest.approx(plan.global_batch / 256)


def test_paper_schedule_on_fixed_world(caplog):
    sched = BatchSchedule.parse("0:34816,5:69632")
    ctrl = BatchSizeController(1088, 32, schedule=sched, base_batch=256, lr_scaling="sqrt")
    with caplog.at_level(logging.INFO, logger="nnabla_torus.planning.controller"):
        first, same, later = ctrl.plan(0), ctrl.plan(4.9), ctrl.plan(5.0)
    assert (first.local_batch, first.accum_steps, first.changed) == (32, 1, True)
    assert not same.changed
    assert (later.global_batch, later.accum_steps, later.changed) == (69632, 2, True)
    assert later.lr_factor == pytest.approx((69632 / 256) ** 0.5)
    assert len(caplog.records) == 2 and "epoch 5.00" in caplog.records[1].message


def test_noise_scale_drives_the_batch_through_goodput():
    # Flat throughput (no cost model): a bigger batch only loses efficiency, so goodput keeps
    # B0 whatever phi; with throughput proportional to the batch it follows phi upwards.
    est = NoiseScaleEstimator(smoothing=0.5)
    flat = BatchSizeController(4, 64, noise_scale=est, base_batch=32, lr_scaling="none",
                               min_batch=32, max_batch=4096, min_samples=2, max_rse=10.0)
    scaling = BatchSizeController(4, 64, noise_scale=est, base_batch=32, lr_scaling="none",
                                  min_batch=32, max_batch=4096, min_samples=2, max_rse=10.0,
                                  throughput=lambda local, accum: 1000.0 * local)
    assert flat.plan(0).global_batch == 32 == scaling.plan(0).global_batch  # nothing measured
    for _ in range(3):
        est.update(2 + 8000 / 8, 8, 2 + 8000 / 64, 64)    # B_simple = 4000
    assert flat.plan(0.3).global_batch == 32
    plan = scaling.plan(0.3)                              # 64 per rank is the fastest split
    assert (plan.local_batch, plan.accum_steps, plan.global_batch) == (64, 1, 256)
    assert plan.changed and "phi = 4000" in plan.reason


@pytest.mark.parametrize("shrink", [False, True])
def test_after_the_first_own_decision_the_batch_only_grows_unless_shrink(shrink, caplog):
    # phi = 4000 moves 32 -> 256; then phi falls to 20 (its best batch is B0 = 32): refused
    # and noted unless shrink. A checkpoint's state keeps the count of own decisions.
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 64, noise_scale=est, base_batch=32, lr_scaling="none",
                               min_batch=32, max_batch=4096, min_samples=2, max_rse=10.0,
                               throughput=lambda local, accum: 1000.0 * local / (local + 8),
                               shrink=shrink)
    assert ctrl.plan(0).global_batch == 32
    for _ in range(3):
        est.update(2 + 8000 / 8, 8, 2 + 8000 / 64, 64)     # B_simple = 4000
    assert ctrl.plan(0.3).global_batch == 256 and ctrl.own_decisions == 1
    for _ in range(40):
        est.update(2 + 40 / 64, 64, 2 + 40 / 256, 256)     # B_simple -> 20
    with caplog.at_level(logging.INFO, logger="nnabla_torus.planning.controller"):
        low = ctrl.plan(0.6)
    assert low.global_batch == (32 if shrink else 256)
    held = [r.message for r in caplog.records if "only grows" in r.message]
    assert len(held) == (0 if shrink else 1) and all("-> 32" in m for m in held)
    resumed = BatchSizeController(4, 64, noise_scale=est, base_batch=32, min_batch=32,
                                  max_batch=4096, min_samples=2, max_rse=10.0)
    resumed.load_state(ctrl.state())
    assert resumed.own_decisions == ctrl.own_decisions >= 2
    older = {k: v for k, v in ctrl.state().items() if k != "own_decisions"}
    resumed.load_state(older)                              # a checkpoint from before the count
    assert resumed.own_decisions == ctrl.decisions


def test_non_finite_gradient_norm_keeps_the_batch():
    # An fp16 overflow gives an inf/NaN norm; it used to crash split_batch with a NaN target.
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 64, noise_scale=est, min_batch=32, max_batch=4096,
                               min_samples=2, max_rse=10.0)
    est.update(float("nan"), 8, float("inf"), 64)
    assert ctrl.plan(0).global_batch == 32 and est.skipped == 1
    est.update(2 + 400 / 8, 8, 2 + 400 / 64, 64)    # B_simple = 200
    est.update(float("inf"), 8, float("nan"), 64)
    est.update(2 + 400 / 8, 8, 2 + 400 / 64, 64)
    assert ctrl.plan(0.1).global_batch == 32 and est.b_simple == 200.0


def test_split_batch_and_errors():
    assert split_batch(100, 3, 1000) == (33, 1)
    assert split_batch(10, 64, 8) == (1, 1)
    with pytest.raises(ValueError, match="exactly one"):
        BatchSizeController(4, 8)
    with pytest.raises(ValueError, match="lr_scaling"):
        BatchSizeController(4, 8, schedule=BatchSchedule([(0, 8)]), lr_scaling="cube")


def test_keep_holds_the_starting_batch_lr_through_batch_changes():
    # The paper's 34K -> 68K: linear doubles the LR factor at epoch 5 (136 -> 272); keep
    # stays at 34,816 / 256 = 136 (Smith et al.: raise the batch instead of moving the LR).
    sched = BatchSchedule.parse("0:34816,5:69632")
    for rule, after in (("linear", 272.0), ("keep", 136.0)):
        ctrl = BatchSizeController(2176, 32, schedule=sched, lr_at_change=rule)
        assert ctrl.plan(0.0).lr_factor == 136.0 and ctrl.plan(5.0).lr_factor == after
    ctrl = BatchSizeController(2176, 32, schedule=sched, lr_at_change="keep")
    assert ctrl.plan(7.0).lr_factor == 136.0          # stateless: same from a resume point
    assert "kept at batch changes" in ctrl.current.reason
    with pytest.raises(ValueError, match=r"unknown lr_at_change 'double'"):
        BatchSizeController(8, 32, schedule=sched, lr_at_change="double")


@pytest.mark.parametrize("rule", ["gain", "scaling"])
def test_adaptive_lr_rule(rule):
    # phi = 4000, B0 = 32, the move to 256: gain = 8 x 4032 / 4256 (Pollux/AdaScale); scaling =
    # linear from the reference batch 32, as the fixed policies: 256 / 32 = 8.
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 64, noise_scale=est, base_batch=32, min_batch=32,
                               max_batch=4096, min_samples=2, max_rse=10.0, adaptive_lr=rule,
                               throughput=lambda local, accum: 1000.0 * local)
    assert ctrl.plan(0).lr_factor == 1.0
    for _ in range(3):
        est.update(2 + 8000 / 8, 8, 2 + 8000 / 64, 64)
    plan = ctrl.plan(0.3)
    assert plan.global_batch == 256
    want = {"gain": 8 * 4032 / 4256, "scaling": 8.0}[rule]
    assert plan.lr_factor == pytest.approx(want, rel=1e-3)
    with pytest.raises(ValueError, match=r"unknown adaptive_lr 'sqrt'"):
        BatchSizeController(4, 64, noise_scale=est, adaptive_lr="sqrt")


def test_steps_after_a_batch_change_move_as_a_fixed_runs():
    """nnabla's Momentum keeps the rate inside its buffer. A run switched from 64 to 256 (rate
    x 4) after warm-up must step as a fixed 256 run from the first step after the change: with
    the buffer scaled by momentum_scale it does (constant gradient: exactly); without it (the
    rule before) its first step is 0.326 of the fixed run's and it lags for ~20 steps."""
    import nnabla as nn
    import nnabla.solvers as S

    from nnabla_torus.planning.controller import momentum_scale

    def steps(schedule, scaled, n=60):
        ctrl = BatchSizeController(1, 256, schedule=BatchSchedule.parse(schedule), base_batch=64)
        w = nn.Variable.from_numpy_array(np.zeros(3, np.float32), need_grad=True)
        solver = S.Momentum(0.1, 0.9)
        solver.set_parameters({"w": w})
        before, moves = None, []
        for step in range(n):
            plan = ctrl.plan(step / 20)                       # 20 steps an epoch
            if plan.changed and scaled:
                states = solver.get_states()
                for state in states.values():
                    state.pstate["m"].d *= momentum_scale(before, plan)
                solver.set_states(states)
            before = plan
            solver.set_learning_rate(0.1 * plan.lr_factor)
            w.g = np.ones(3, np.float32)                      # the same gradient every step
            old = w.d.copy()
            solver.update()
            moves.append(float(old[0] - w.d[0]))
        return np.array(moves)

    fixed = steps("0:256", scaled=True)
    for scaled in (True, False):
        switched = steps("0:64,2:256", scaled)
        after = switched[40:45] / fixed[40:45]            # the first steps at 256
        if scaled:
            assert after == pytest.approx(1.0, rel=1e-5)
        else:
            assert after[0] == pytest.approx(0.326, rel=1e-3)   # the rule before
