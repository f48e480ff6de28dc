"""tools/research/branch_efficiency.py: the images a curve needs to reach a loss, and branches
that leave the run where its small batch alone would have taken it (weights, BN statistics,
momentum)."""
import math

import nnabla as nn
import numpy as np
import pytest

import branch_efficiency as be
from config import parse_config


@pytest.mark.parametrize("loss, images", [
    (2.0, 0.0),        # the start is already there
    (1.5, 50.0),       # halfway between the readings at 0 (2.0) and 100 (1.0)
    (1.0, 100.0),
    (0.9, 250.0),      # the rise at 200 (1.2) is not progress: 1.0 there, 0.8 at 300
    (0.5, math.inf),   # never reached: E above 1
])
def test_images_to_reach_interpolates_the_running_minimum(loss, images):
    curve = [(0, 2.0), (100, 1.0), (200, 1.2), (300, 0.8)]
    assert be.images_to_reach(curve, loss) == pytest.approx(images)


def trained(probe):
    """Weights, BN statistics and momentum after 3 steps at 16 and then either a probe of both
    branches or the small branch's steps alone (digits-cpu, one process)."""
    nn.clear_parameters()
    args = be.parse_args(["-C", "digits-cpu", "--batch", "16", "--large-batch", "32",
                          "--branch-epochs", "0.05", "--probe-images", "48", "--at", "0"])
    cfg = parse_config(["-C", "digits-cpu", "--seed", "3"])
    run = be.Branches(cfg, args)
    epoch = 0.0
    for _ in range(3):
        epoch = run.step(16, epoch)
    if probe:
        row, epoch = be.probe_at(run, epoch)
        assert row["efficiency"] >= 0 and row["start_loss"] > 0
    else:
        for _ in range(2 * max(1, round(0.05 * run.images / 32))):
            epoch = run.step(16, epoch)
    weights, (momentum, _) = run.save()
    return weights, momentum, epoch


def test_a_probe_leaves_the_run_where_its_small_batch_alone_takes_it():
    w_probe, m_probe, e_probe = trained(probe=True)
    w_plain, m_plain, e_plain = trained(probe=False)
    assert e_probe == pytest.approx(e_plain)
    assert any("mean" in k for k in w_plain), "BN statistics are among the saved arrays"
    for k in w_plain:
        np.testing.assert_array_equal(w_probe[k], w_plain[k], err_msg=k)
    for k in m_plain:
        np.testing.assert_array_equal(m_probe[k], m_plain[k], err_msg=k)


@pytest.mark.parametrize("large", [64, 96])
def test_a_large_batch_not_a_multiple_of_the_runs_is_refused(large):
    with pytest.raises(SystemExit, match="must be a multiple"):
        be.main(["-C", "digits-cpu", "--batch", "64", "--large-batch", str(large)])


def test_an_unknown_recipe_is_refused_in_one_line():
    with pytest.raises(SystemExit, match="branch_efficiency.py: error: recipe 'nosuch' not found"):
        be.main(["-C", "nosuch"])


def test_a_large_batch_larger_than_the_data_is_refused():
    nn.clear_parameters()
    with pytest.raises(SystemExit, match="larger than the 1438 training images of digits"):
        be.main(["-C", "digits-cpu", "--large-batch", "4096"])


def test_the_large_branch_trains_on_the_small_branchs_images_in_their_order(monkeypatch):
    nn.clear_parameters()
    args = be.parse_args(["-C", "digits-cpu", "--batch", "16", "--large-batch", "48",
                          "--branch-epochs", "0.1", "--probe-images", "16", "--at", "0"])
    run = be.Branches(parse_config(["-C", "digits-cpu"]), args)
    fed = {16: [], 48: []}
    step = run.step

    def recording(batch, epoch, images_labels=None):
        fed[batch].append(images_labels)
        return step(batch, epoch, images_labels)
    monkeypatch.setattr(run, "step", recording)
    be.probe_at(run, 0.0)
    assert len(fed[16]) == 3 * len(fed[48]) > 0
    for part in (0, 1):       # images, labels
        np.testing.assert_array_equal(np.concatenate([b[part] for b in fed[16]]),
                                      np.concatenate([b[part] for b in fed[48]]))


def test_the_command_prints_a_row_per_branch_and_their_median(capsys):
    nn.clear_parameters()
    rows = be.main(["-C", "digits-cpu", "--batch", "16", "--large-batch", "32", "--at",
                    "0,0.05", "--branch-epochs", "0.03", "--probe-images", "32"])
    out = capsys.readouterr().out
    assert [r["epoch"] for r in rows][0] == 0 and rows[1]["epoch"] >= 0.05
    assert "E(32) / E(16)" in out and f"over {len(rows)} branches" in out
    for r in rows:
        assert f"| {be.shown(r['efficiency'])}" in out


@pytest.mark.parametrize("at", ["1,0.5", "x", "-1"])
def test_branch_points_out_of_order_or_not_numbers_are_refused(at, capsys):
    with pytest.raises(SystemExit):
        be.parse_args(["--at", at])
    assert "--at: " in capsys.readouterr().err
