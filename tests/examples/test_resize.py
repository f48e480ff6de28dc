"""Resharding an epoch over another world size: exact step composition, full cover, fallbacks."""
import os
import sys
from collections import Counter

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import data  # noqa: E402
import resize  # noqa: E402
from nnabla_torus.planning.controller import BatchPlan  # noqa: E402


def rows(num, batch, size, seed, order=None, start=0):
    return [data.shard_plan(num, batch, r, size, True, seed, 0, start, order)[0]
            for r in range(size)]


@pytest.mark.parametrize("num,old,new,k,position", [(1438, 4, 2, 16, 48), (1438, 4, 8, 16, 48),
                                                    (517, 3, 5, 10, 20), (100, 2, 4, 8, 0)])
def test_same_global_batch_gives_the_same_images_per_step(num, old, new, k, position):
    before = rows(num, k, old, seed=3)
    new_k = old * k // new if old * k % new == 0 else -(-old * k // new)
    order, left, per_rank = resize.epoch_order(num, 3, 0, [[old, position, k, 0, k]], new, new_k)
    after = rows(num, new_k, new, 3, order)
    assert len(order) % new == 0
    steps = -(-(-(-num // old) - position) // k)
    for t in range(steps):
        want = Counter(np.concatenate([r[position + t * k: position + (t + 1) * k]
                                       for r in before]).tolist())
        got = Counter(np.concatenate([r[t * new_k:(t + 1) * new_k] for r in after]).tolist())
        if old * k % new == 0:
            assert got == want, t                 # the same images in every later step
    # The epoch fraction continues: the rest of the epoch covers exactly `left` of it.
    assert left == pytest.approx(1 - position / -(-num // old))
    assert per_rank == pytest.approx((-(-num // old) - position) * old / new)


def test_every_image_once_per_epoch_across_two_resizes():
    num, seed = 1000, 7
    seen = Counter()
    first = rows(num, 10, 4, seed)                       # 4 ranks read 30 images each
    for r in first:
        seen.update(r[:30].tolist())
    order, _, per_rank = resize.epoch_order(num, seed, 0, [[4, 30, 10, 0, 10]], 2, 20)
    second = rows(num, 20, 2, seed, order)               # 2 ranks read 100 each
    for r in second:
        seen.update(r[:100].tolist())
    segments = [[4, 30, 10, 0, 10], [2, 100, 20, 0, 20]]
    order, left, per_rank = resize.epoch_order(num, seed, 0, segments, 8, 5)
    for r in rows(num, 5, 8, seed, order):
        seen.update(r[:int(np.ceil(per_rank))].tolist())
    assert set(seen) == set(range(num))                  # nothing skipped
    assert sum(seen.values()) - num <= 8 * 5, seen.most_common(3)   # only padding repeats
    assert left == pytest.approx((250 - 30) / 250 * (440 - 100) / 440)


def test_loader_state_continues_on_the_new_world():
    plan = BatchPlan(64, 16, 2, 1.0, False, "")
    state = {"epoch": 1, "start_image": 32, "batch_size": 16, "consumed_steps": 1}
    new = resize.resized_loader_state(state, 4, 16, plan)     # whatever the new world's size
    assert new == {"epoch": 1, "start_image": 0, "batch_size": 16, "consumed_steps": 0,
                   "segments": [[4, 48, 16, 32, 16]], "step_images": 32}
    start = {"epoch": 2, "start_image": 0, "batch_size": 16, "consumed_steps": 0}
    assert "segments" not in resize.resized_loader_state(start, 4, 16, plan)
    layout = resize.EpochLayout(1438, 5, 2, new)
    assert layout.fraction(0) == pytest.approx(48 / 360)
    assert layout.fraction(layout.per_rank) == pytest.approx(1.0)
    assert layout.state() == {"segments": [[4, 48, 16, 32, 16]], "step_images": 32}
    layout.start(2)
    assert layout.order is None and layout.state() == {}


def test_resplit_keeps_the_global_batch_or_says_why_not():
    saved = [64, 16, 1, 1.0, True, "old"]
    plan, message = resize.resplit(saved, 2, 16, lambda b: b / 64)
    assert (plan.global_batch, plan.local_batch, plan.accum_steps) == (64, 16, 2)
    assert "falling back" not in message
    plan, message = resize.resplit(saved, 3, 16, lambda b: b / 64)
    assert plan.global_batch == 3 * plan.local_batch * plan.accum_steps != 64
    assert "64 does not split over 3 ranks: falling back to global batch" in message
    assert plan.lr_factor == plan.global_batch / 64


def test_another_model_or_recipe_is_refused_by_name_another_image_size_is_noted():
    # checkpoint.check_model (examples/imagenet) guards every resume, on any rank count.
    from run_checkpoint import check_model
    saved = {"model": {"arch": "resnet18", "width": 0.125, "classes": 10, "image_size": 16,
                       "recipe": "digits-cpu"}}
    here = dict(saved["model"])
    shapes = {"param/w": (3, 3)}
    arrays = {"param/w": np.zeros((3, 3))}
    assert check_model(saved, "ckpt", here, shapes, arrays) == ""
    with pytest.raises(ValueError, match=r"arch 'resnet18' \(this run: 'resnet50', --arch\)"):
        check_model(saved, "ckpt", dict(here, arch="resnet50"), shapes, arrays)
    with pytest.raises(ValueError, match=r"recipe 'digits-cpu' \(this run: 'sony-224s', -C\)"):
        check_model(saved, "ckpt", dict(here, recipe="sony-224s"), shapes, arrays)
    note = check_model(saved, "ckpt", dict(here, image_size=32), shapes, arrays)
    assert "image_size 16 -> 32" in note


def test_a_grid_that_does_not_fit_the_new_size_falls_back():
    assert resize.fit_grid("2x2", 4) == ("2x2", "")
    assert resize.fit_grid("", 8) == ("", "")
    grid, message = resize.fit_grid("2x2", 8)
    assert grid == "" and "grid 2x2 does not fit 8 ranks: falling back" in message


def advisor(monkeypatch, size, fixed=None, slots=None, adaptive=False):
    from types import SimpleNamespace

    from nnabla_torus.planning.machine_profile import load_profile
    from nnabla_torus.planning.schedules import BatchSchedule
    for name, value in (("NNABLA_TORUS_ELASTIC_RANKS", fixed),
                        ("NNABLA_TORUS_ELASTIC_SLOTS", slots)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("NNABLA_TORUS_RESTART_COST", raising=False)
    planner = SimpleNamespace(prof=load_profile("cpu-2core"), model="resnet18-w0.125-16px",
                              common=dict(dataset_size=1438, epochs=12))
    return resize.ResizeAdvisor(planner, BatchSchedule.parse("0:32,2:64,4:128"), adaptive, 12,
                                1438, size)


def test_advisor_decides_once_per_batch_and_fixed_count(monkeypatch):
    a = advisor(monkeypatch, 1, fixed="0:1,2:2,4:4", slots="4")
    plan = BatchPlan(32, 32, 1, 0.5, True, "")
    assert a.due(plan, 0.0)
    ranks, decision, note = a.decide(plan, 0.0)
    assert ranks == 1 and not decision.resize and "fixed GPU-count schedule" in decision.reason
    assert not a.due(plan._replace(changed=False), 1.5)       # nothing new: no second decision
    plan = BatchPlan(64, 32, 2, 1.0, True, "")
    assert a.due(plan, 2.0) and a.phase_end(2.0) == 4.0
    ranks, decision, note = a.decide(plan, 2.0)
    assert ranks == 2 and decision.resize and "2876 images left in the phase" in decision.reason


def test_advisor_caps_at_the_slots_and_plans_to_the_end_in_adaptive_mode(monkeypatch):
    a = advisor(monkeypatch, 1, fixed="0:4", slots="2")
    ranks, decision, note = a.decide(BatchPlan(64, 32, 2, 1.0, True, ""), 0.0)
    assert ranks == 2 and "wanted 4 ranks but only 2 slots exist: using 2" in note
    assert advisor(monkeypatch, 2, adaptive=True).phase_end(3.0) == 12
