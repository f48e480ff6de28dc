"""One full ResNet-50 training step (1,000 classes, 64 px, batch 2) on CPU: builds, learns,
is fast."""
import os
import re
import sys
import time

import nnabla as nn
import nnabla.functions as F
import nnabla.solvers as S
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
from models import get_model  # noqa: E402


def test_resnet50_one_sgd_step_at_64_pixels():
    nn.clear_parameters()
    nn.seed(0)
    x, label = nn.Variable((2, 3, 64, 64)), nn.Variable((2, 1))
    with nn.parameter_scope("net"):
        loss = F.mean(F.softmax_cross_entropy(get_model("resnet50", 1000)(x, test=False), label))
    params = nn.get_parameters()
    solver = S.Momentum(lr=0.1, momentum=0.9)
    solver.set_parameters(params)
    x.d = np.random.default_rng(0).standard_normal(x.shape)
    label.d = [[3], [999]]
    before = {k: v.d.copy() for k, v in params.items()}

    start = time.perf_counter()
    loss.forward(clear_no_need_grad=True)
    solver.zero_grad()
    loss.backward(clear_buffer=True)
    solver.update()
    elapsed = time.perf_counter() - start

    assert np.isfinite(loss.d) and loss.d > 0
    changed = {k for k, v in params.items() if not np.array_equal(v.d, before[k])}
    # With the blocks' last gamma at 0, no gradient reaches the layers inside a residual
    # branch on the first step; everything on the identity path (and that gamma) moves.
    in_branch = {k for k in params if re.search(r"/block\d+/(conv1|conv2|conv3/conv)/", k)}
    assert changed == set(params) - in_branch and len(in_branch) == 16 * 7
    assert nn.get_parameters(grad_only=False)["net/conv1/bn/mean"].d.any()   # running stats
    assert elapsed < 60, f"one ResNet-50 step took {elapsed:.1f} s"
    nn.clear_parameters()
