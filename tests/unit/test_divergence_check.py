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
from run_state import Progress  # noqa: E402


def run_with(grad, scaler=None):
    """A run whose one parameter has gradient ``grad`` (nnabla's own solver checks it)."""
    nn.clear_parameters()
    w = nn.parameter.get_parameter_or_create("w", (3,))
    w.g = np.asarray(grad, np.float32)
    solver = S.Momentum(0.1, 0.9)
    solver.set_parameters({"w": w})
    return SimpleNamespace(parallel=SimpleNamespace(scaler=scaler),
                           net=SimpleNamespace(solvers=solver))


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
