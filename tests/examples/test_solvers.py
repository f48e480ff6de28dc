"""The example's SolverGroup: the momentum buffers scaled at a batch change (both solvers,
Momentum and LARS), so the next update is that of a run at the new rate all along."""
import os
import sys
from types import SimpleNamespace

import nnabla as nn
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
from solvers import SolverGroup  # noqa: E402


@pytest.mark.parametrize("optimizer", ["momentum", "lars"])
def test_scale_momentum_scales_every_velocity(optimizer):
    nn.clear_parameters()
    params = {"conv/W": nn.Variable.from_numpy_array(np.ones((2, 3), np.float32), need_grad=True),
              "bn/beta": nn.Variable.from_numpy_array(np.ones(3, np.float32), need_grad=True)}
    cfg = SimpleNamespace(no_decay_bn_bias=True, optimizer=optimizer, base_lr=0.1,
                          momentum=0.9, lars_coefficient=0.001)
    solvers = SolverGroup(cfg, params)
    for v in params.values():
        v.g = np.full(v.shape, 0.5, np.float32)
    solvers.update()
    before, _ = solvers.state_arrays()
    solvers.scale_momentum(4.0)
    after, _ = solvers.state_arrays()
    assert set(after) == set(before) and len(after) == 2
    for name in before:
        assert np.abs(before[name]).sum() > 0
        np.testing.assert_allclose(after[name], 4.0 * before[name], rtol=1e-6)
