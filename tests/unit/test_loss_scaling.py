"""DynamicLossScaling's control flow against nnabla's own DynamicLossScalingUpdater.

Both drive the same recording fake solver and loss through a seeded pattern of overflowing
batches; the backward seeds (loss scales), unscale factors and updates must be identical.
The numerical comparison with real gradients and all-reduce is tests/mpi/test_loss_scaling_mpi.py.
"""
import numpy as np
import pytest
from nnabla.experimental.mixed_precision_training import DynamicLossScalingUpdater

from nnabla_torus.loss_scaling import DynamicLossScaling


class RecordingSolver:
    """Overflows on the batches marked in ``overflow``; logs what the loss scaling asks of it."""

    def __init__(self, overflow):
        self.overflow, self.batch, self.log = overflow, -1, []

    def feed(self):
        self.batch += 1

    def zero_grad(self):
        pass

    def check_inf_or_nan_grad(self):
        return bool(self.overflow[self.batch])

    def scale_grad(self, factor):
        self.log.append(("scale_grad", self.batch, factor))

    def weight_decay(self, rate):
        self.log.append(("weight_decay", self.batch, rate))

    def update(self):
        self.log.append(("update", self.batch))


class RecordingLoss:
    def __init__(self):
        self.seeds = []

    def forward(self, clear_no_need_grad=False):
        pass

    def backward(self, grad=1, clear_buffer=False, function_post_hook=None):
        self.seeds.append(grad)


def run_nnabla(overflow, scale, N):
    solver, loss = RecordingSolver(overflow), RecordingLoss()
    updater = DynamicLossScalingUpdater(solver, loss, solver.feed, scale=scale, N=N,
                                        weight_decay=1e-4)
    while solver.batch < len(overflow) - 1:      # it retries an overflowed step on the next batch
        updater.update()
    return loss.seeds, solver.log, updater.scale


def run_ours(overflow, scale, N):
    solver, loss = RecordingSolver(overflow), RecordingLoss()
    scaler = DynamicLossScaling(scale=scale, N=N)
    for _ in overflow:                           # one batch per step; an overflow skips it
        solver.zero_grad()
        solver.feed()
        loss.forward(clear_no_need_grad=True)
        scaler.backward(loss, clear_buffer=True)
        if scaler.unscale(solver):
            solver.weight_decay(1e-4)
            solver.update()
    assert scaler.skipped == int(np.sum(overflow))
    return loss.seeds, solver.log, scaler.scale


@pytest.mark.parametrize("N", [0, 1, 3, 7])
@pytest.mark.parametrize("seed", range(4))
def test_same_scales_and_updates_as_nnabla(N, seed):
    overflow = np.random.default_rng(seed).random(80) < 0.15
    overflow[:3] = True                           # a cascade at the start, as from a large scale
    overflow[-1] = False                          # the updater would fetch a batch past the end
    ours, theirs = run_ours(overflow, 1024.0, N), run_nnabla(overflow, 1024.0, N)
    assert ours[0] == theirs[0]                   # backward seeds: the scale of every batch
    assert ours[1] == theirs[1]                   # unscale factors, weight decay, updates
    assert ours[2] == theirs[2]


def test_growth_and_overflow_by_hand():
    # N = 1: growth on the 3rd good step, then every 2nd; an overflow halves and restarts it.
    overflow = [False] * 5 + [True] + [False] * 4
    seeds, log, scale = run_ours(overflow, 8.0, 1)
    assert seeds == [8, 8, 8, 16, 16, 32, 16, 16, 16, 32]
    assert ("update", 5) not in log and ("scale_grad", 6, 1 / 16) in log
    assert scale == 32


def test_backward_through_the_reducer_seeds_the_scale():
    class Reducer:
        def backward(self, loss, **kwargs):
            self.kwargs = kwargs

    reducer = Reducer()
    DynamicLossScaling(scale=64.0).backward("loss", reducer, clear_buffer=True)
    assert reducer.kwargs == {"grad": 64.0, "clear_buffer": True}


@pytest.mark.parametrize("kwargs, word", [({"scale": 0}, "scale"),
                                          ({"scaling_factor": 1}, "factor"), ({"N": -1}, "N")])
def test_bad_arguments_are_refused(kwargs, word):
    with pytest.raises(ValueError, match=word):
        DynamicLossScaling(**kwargs)


@pytest.mark.parametrize("type_config", ["float", "half"])
def test_issue66_the_fused_count_sees_what_check_inf_or_nan_grad_sees(type_config):
    """NonfiniteCount over several gradients (zeroing ones left out) finds an inf or a NaN
    exactly when nnabla's own check does, gradients written in place and the set of zeroing
    ones changing; and none in finite gradients whose sum of |g| passes float16's 65504
    (a sum of magnitudes in float16 would call them an overflow)."""
    import math

    import nnabla as nn
    import nnabla.solvers as S
    from nnabla.ext_utils import get_extension_context

    from nnabla_torus.loss_scaling import NonfiniteCount
    rng = np.random.default_rng(0)
    dtype = np.float16 if type_config == "half" else np.float32
    nn.clear_parameters()
    with nn.context_scope(get_extension_context("cpu", type_config=type_config)):
        params = {f"w{k}": nn.parameter.get_parameter_or_create(f"w{k}", (int(n),))
                  for k, n in enumerate(rng.integers(1, 50, 5))}
        count = NonfiniteCount([v.grad for v in params.values()])
        solver = S.Momentum(0.1, 0.9)
        solver.set_parameters(params)
        for trial in range(20):
            for v in params.values():
                v.grad.cast(dtype)[...] = rng.uniform(-6e4, 6e4, v.shape)    # in place
            if trial % 3:
                bad = params[f"w{rng.integers(5)}"]
                bad.grad.cast(dtype)[rng.integers(bad.shape[0])] = (
                    [math.inf, -math.inf, math.nan][trial % 3])
            zeroing = f"w{trial % 5}" if trial % 2 else None
            if zeroing:
                params[zeroing].grad.zero()        # zeroing: skipped by both, left zeroing
            before = {k: v.g.copy() for k, v in params.items() if k != zeroing}
            assert count.found() == solver.check_inf_or_nan_grad(), trial
            for k, g in before.items():      # the graph reads the gradients, leaves them be
                np.testing.assert_array_equal(params[k].g, g)
            if zeroing:
                assert params[zeroing].grad.zeroing
    nn.clear_parameters()


def test_issue66_given_grads_the_scaler_checks_them_not_the_solver():
    """With ``grads`` the overflow decision is the fused count's (the solver's per-parameter
    check is not called); the scale follows the same rules."""
    import nnabla as nn

    grad = nn.NdArray.from_numpy_array(np.ones(7, np.float32))
    solver = RecordingSolver([True, False])       # would say overflow on batch 0
    solver.feed()
    scaler = DynamicLossScaling(scale=8.0, grads=[grad])
    assert scaler.unscale(solver) and scaler.scale == 8.0
    grad.data[3] = np.nan
    assert not scaler.unscale(solver) and scaler.scale == 4.0 and scaler.skipped == 1
