"""The divergence check needs no collective of its own: it reads the all-reduced gradients,
the same on every rank (before: one 8-byte all-reduce of the loss every step); FP16 overflows
count only at a loss scale of 1 or below."""
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import nnabla as nn
import nnabla.solvers as S

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import train  # noqa: E402
from nnabla_torus.loss_scaling import DynamicLossScaling  # noqa: E402
from divergence import GradientAbsSum  # noqa: E402
from run_state import Progress  # noqa: E402


def run_with(grad, scaler=None):
    """A run whose one parameter has gradient ``grad``."""
    nn.clear_parameters()
    w = nn.parameter.get_parameter_or_create("w", (3,))
    w.g = np.asarray(grad, np.float32)
    solver = S.Momentum(0.1, 0.9)
    solver.set_parameters({"w": w})
    # issue 47: the check reads the gradients (one fused sum), not the solver's per-parameter
    # check_inf_or_nan_grad; the scaler still asks the solver
    return SimpleNamespace(parallel=SimpleNamespace(scaler=scaler, comm=None),
                           net=SimpleNamespace(solvers=solver, grads=[w.grad],
                                               grad_abs_sum=GradientAbsSum([w.grad])))


def test_non_finite_all_reduced_gradients_are_seen_without_a_collective():
    assert train.gradients_finite(run_with([1.0, 2.0, 3.0]), None, True)
    assert not train.gradients_finite(run_with([1.0, math.nan, 3.0]), None, True)
    assert not train.gradients_finite(run_with([1.0, 2.0, math.inf]), None, True)
    # adaptive runs: the noise scale's squared norm of the same all-reduced gradients
    assert not train.gradients_finite(run_with([1.0, 2.0, 3.0]), math.inf, True)
    assert train.gradients_finite(run_with([1.0, math.nan, 3.0]), 14.0, True)
    nn.clear_parameters()


def test_fp16_overflows_count_only_at_a_loss_scale_of_one_or_below():
    scaler = DynamicLossScaling(scale=8.0)
    run = run_with([1.0, math.nan, 3.0], scaler)
    skipped = []
    for _ in range(5):
        updated = scaler.unscale(run.net.solvers)   # skipped at scales 8, 4, 2, 1, 0.5
        skipped.append(train.gradients_finite(run, None, updated))
    assert skipped == [True, True, True, False, False], (skipped, scaler.scale)
    nn.clear_parameters()


def test_non_finite_steps_are_counted_in_a_row_from_the_first():
    progress = Progress()
    for step, finite in enumerate([True, False, False, True, False], start=1):
        progress.step = step
        train.count_nonfinite(progress, finite)
        if step == 3:
            assert (progress.nonfinite_steps, progress.first_nonfinite) == (2, 2)
    assert (progress.nonfinite_steps, progress.first_nonfinite) == (1, 5)


def test_issue47_the_fused_sum_sees_what_check_inf_or_nan_grad_sees():
    """GradientAbsSum over several gradients (zeroing ones left out) is finite exactly when
    nnabla's own check finds no inf or NaN in any of them; one instance follows the gradients
    as they are written in place, and as the set of zeroing ones changes."""
    rng = np.random.default_rng(0)
    nn.clear_parameters()
    params = {f"w{k}": nn.parameter.get_parameter_or_create(f"w{k}", (int(n),))
              for k, n in enumerate(rng.integers(1, 50, 5))}
    abs_sum = GradientAbsSum([v.grad for v in params.values()])
    solver = S.Momentum(0.1, 0.9)
    solver.set_parameters(params)
    for trial in range(20):
        for v in params.values():
            v.grad.cast(np.float32)[...] = rng.standard_normal(v.shape)   # in place
        if trial % 3:
            bad = params[f"w{rng.integers(5)}"]
            bad.grad.cast(np.float32)[rng.integers(bad.shape[0])] = (
                [math.inf, -math.inf, math.nan][trial % 3])
        zeroing = f"w{trial % 5}" if trial % 2 else None
        if zeroing:
            params[zeroing].grad.zero()            # zeroing: skipped by both, left zeroing
        before = {k: v.g.copy() for k, v in params.items() if k != zeroing}
        total = abs_sum()
        for k, g in before.items():          # the graph reads the gradients, leaves them be
            np.testing.assert_array_equal(params[k].g, g)
        assert total.shape == (1,)
        assert math.isfinite(float(total.data[0])) == (not solver.check_inf_or_nan_grad())
        if zeroing:
            assert params[zeroing].grad.zeroing
        want = sum(np.abs(v.g).sum() for k, v in params.items() if k != zeroing)
        if math.isfinite(want):
            np.testing.assert_allclose(total.data[0], want, rtol=1e-5)
    nn.clear_parameters()
