"""tools/time_to_accuracy.py: its log parsing and the abci prediction's invariants."""
import numpy as np
import pytest

from nnabla_torus.planning.machine_profile import load_profile
from tools import time_to_accuracy as tool

LOG = """resnet18 x0.125: 176,402 parameters, 1438 training / 359 validation images, 10 classes; 4
epoch 1.00 step 23: train loss 2.2873, val top-1 0.2535 top-5 0.7103, 322 images/s
epoch 2.00 step 46: train loss 2.1, val top-1 0.91 top-5 0.99, 466 images/s
epoch 3.00 step 69: train loss 2.0, val top-1 0.95 top-5 0.99, 466 images/s
{"val_top1": 0.95, "steps": 69, "batch_schedule": "0:64"}
""".splitlines(keepends=True)


def test_time_and_steps_to_the_target_come_from_the_first_line_that_reaches_it(tmp_path):
    lines = [(10.0 * i, line) for i, line in enumerate(LOG)]
    r = tool.record_of("fixed 64", 1, str(tmp_path), lines, 0.90)
    assert (r["time_s"], r["steps"], r["epoch"]) == (20.0, 46, 2.0)
    assert (r["best_top1"], r["final_top1"], r["dataset"], r["params"]) == (0.95, 0.95, 1438,
                                                                            176402)
    assert tool.record_of("fixed 64", 1, str(tmp_path), lines, 0.99)["time_s"] is None


@pytest.mark.parametrize("phi", [1e3, 1e5, 1e8])
def test_abci_goodput_is_never_much_slower_than_sonys_schedule(phi):
    # Sony's two phases are among the goodput policy's candidates, so with any noise scale
    # its time to the same progress is at most Sony's plus the hysteresis (5 %).
    curve = (np.array([0.0, 1.0]), np.array([phi, phi]))
    r = tool.predict_abci(curve, 1.0, load_profile("abci"), restart_s=0.0, steps=50)
    assert r["goodput_s"] <= r["fixed_s"] * 1.05
    assert min(p[2] for p in r["goodput_path"]) >= 34816          # B0 is the smallest batch
    assert max(p[1] for p in r["goodput_path"]) <= 2176
    if phi == 1e8:          # efficiency ~1 everywhere: progress = 90 epochs of images
        assert r["epochs_equivalent"] == pytest.approx(90.0, rel=1e-3)
