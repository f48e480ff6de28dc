"""Batch-size priors: the store beside auto's table, its key, the published figures, and the
controller deciding at step 0 on a prior until its own measurement overrides it."""
import json
import logging

import numpy as np
import pytest

from nnabla_torus.planning import priors, published
from nnabla_torus.planning.controller import BatchSizeController
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from nnabla_torus.planning.step_refit import StepTimeRefit

MODEL = {"arch": "resnet18", "width": 0.125, "image_size": 16, "parameters": 17632}
DATA = {"data": "digits", "images": 1437, "classes": 10}


def key(**changes):
    k = priors.prior_key(MODEL, DATA, ranks=4, machine="cpu-2core 1x4")
    k.update(changes)
    return k


def series():
    """(fraction, phi, rse) of a run: untrusted estimates first, then phi growing 100 -> 1000."""
    early = [(0.0, 5000.0, 2.0), (0.01, 30.0, 0.9)]
    return early + [(f, 100 + 900 * f, 0.3) for f in np.linspace(0.02, 1.0, 400)]


def saved_prior(folder):
    """The path of the prior a run of :func:`series` with three steps at 16 x 1 saved."""
    refit = StepTimeRefit(4, min_steps=2, warmup_steps=0)
    for _ in range(3):
        refit.observe(16, 1, 0.4, 0.3)
    return priors.save(folder, key(), series(), refit.state(), "runs/a")


def test_saved_prior_is_reused_only_for_its_key(tmp_path):
    path = saved_prior(tmp_path)
    saved = json.load(open(path))
    assert len(saved["noise_scale"]) == priors.KEEP_POINTS          # thinned, untrusted dropped
    assert min(p[0] for p in saved["noise_scale"]) == pytest.approx(0.02)
    prior, line = priors.choose("auto", tmp_path, key(), "resnet18", epochs=12)
    assert prior.kind == "earlier run" and "runs/a" in line and "step times" in line
    phi, rse = prior.phi_at(np.array([0.0, 0.5, 1.0]))
    assert phi == pytest.approx([118, 550, 1000], rel=0.01) and rse == pytest.approx(0.3)
    # Another rank count, model or data: another file (auto finds none, nothing published for
    # resnet18 on digits), and the file itself, given by path, is refused with the reason.
    for other in (key(ranks=8), key(model=dict(MODEL, width=0.25)), key(data=dict(DATA, images=9))):
        assert priors.choose("auto", tmp_path, other, "resnet18", epochs=12)[0] is None
        refused, why = priors.choose(path, tmp_path, other, "resnet18", epochs=12)
        assert refused is None and "not reused" in why
    assert priors.choose("none", tmp_path, key(), "resnet18", 12)[0] is None
    assert "cannot read" in priors.choose(str(tmp_path / "missing.json"), tmp_path, key(),
                                          "resnet18", 12)[1]


def test_a_damaged_prior_file_is_refused_in_one_line_not_at_step_0_on_every_rank(tmp_path):
    path = saved_prior(tmp_path)
    good = json.load(open(path))

    def damaged(**changes):
        with open(path, "w") as f:
            json.dump(dict(good, **changes), f)
        return priors.choose(path, tmp_path, key(), "resnet18", epochs=12)

    # step times cut short or edited: the noise scale is used, the step times are not (before,
    # a step [0.4] without its sync loaded and failed at the first fit, on every rank)
    for step_times in ({"ranks": 4}, {"ranks": 4, "samples": [[16, 1, [[0.4]]]]},
                       {"ranks": 4, "samples": [[16, 1, [[0.4, "x"]]]]},
                       {"ranks": "4", "samples": []}, {"ranks": 4, "samples": [[0, 1, []]]}, []):
        prior, line = damaged(step_times=step_times)
        assert prior is not None and prior.step_times is None, step_times
        assert "its step times are left out, not a step-time record" in line, line
    # noise-scale points that are not numbers: the file is refused, as an unreadable one
    for points in ([[0.1, None, 0.2]], [[0.1, -5.0, 0.2]], [[0.1, 100.0]]):
        prior, line = damaged(noise_scale=points)
        assert prior is None and line.startswith(f"batch prior: cannot read {path}"), line
    # points out of order are sorted (np.interp needs them ascending)
    prior, _ = damaged(noise_scale=[[0.5, 500.0, 0.2], [0.0, 100.0, 0.2]])
    assert prior.phi_at(0.25)[0] == pytest.approx(300.0)


def test_a_damaged_key_or_a_huge_phi_is_one_short_line(tmp_path):
    """A key that is a list or a string was an AttributeError; phi 1e308 printed 309 digits."""
    path = saved_prior(tmp_path)
    good = json.load(open(path))
    for bad_key in (["resnet18"], "resnet18"):
        json.dump(dict(good, key=bad_key), open(path, "w"))
        prior, line = priors.choose(path, tmp_path, key(), "resnet18", epochs=12)
        assert prior is None and line.startswith(f"batch prior: cannot read {path} (its key "
                                                 f"is {type(bad_key).__name__}"), line
    json.dump(dict(good, noise_scale=[[0.1, 1e308, 0.2]]), open(path, "w"))
    prior, line = priors.choose(path, tmp_path, key(), "resnet18", epochs=12)
    assert "phi 1e+308-1e+308 from" in line and len(line) < 200 + len(str(path)), line


def test_a_stored_prior_is_merged_never_replaced_by_less(tmp_path):
    """A 3-step smoke run (no trusted point) or a short run leaves a long run's prior as it
    was; a resumed run (points from its resume on) replaces only the fractions it covers."""
    path = saved_prior(tmp_path)
    before = json.load(open(path))
    refit = StepTimeRefit(4, min_steps=2, warmup_steps=0)
    smoke = [(0.0, 5000.0, 2.0), (0.01, 30.0, 0.9), (0.02, 40.0, 2.0)]
    assert priors.save(tmp_path, key(), smoke, refit.state(), "runs/smoke") == path
    assert json.load(open(path)) == before
    short = [(f, 7.0, 0.3) for f in (0.3, 0.4, 0.5)]
    priors.save(tmp_path, key(), short, None, "runs/short")
    assert json.load(open(path)) == before
    resumed = [(f, 5000.0, 0.2) for f in np.linspace(0.6, 1.0, 300)]
    priors.save(tmp_path, key(), resumed, None, "runs/resumed")
    after = json.load(open(path))
    points = np.array(after["noise_scale"])
    assert list(points[:, 0]) == sorted(points[:, 0]) and len(points) <= priors.KEEP_POINTS
    early, late = points[points[:, 0] < 0.6], points[points[:, 0] >= 0.6]
    assert len(early) > 50 and np.all(early[:, 1] < 1000)       # the earlier run's, kept
    assert len(late) > 50 and np.all(late[:, 1] == 5000.0)      # the resumed run's
    assert after["step_times"] == before["step_times"]          # the run saved none: kept
    assert after["run"] == "runs/resumed"
    # the file of another key at that path (another run's folder) is replaced, as before
    priors.save(tmp_path, key(ranks=8), short, None, "runs/other", path=path)
    assert json.load(open(path))["key"] == key(ranks=8)


def test_published_resnet50_prior():
    assert published.largest_trained_batch("resnet50").batch == 65536      # Jia et al., 75.8 %
    assert published.largest_trained_batch("resnet50", min_top1=0.0).batch == 81920
    assert published.largest_trained_batch("resnet18") is None
    prior, line = priors.choose("auto", "/nonexistent", key(), "resnet50", epochs=90)
    assert prior.kind == "published" and "1811.05233" in line
    phi, rse = prior.phi_at(np.array([0.0, 4.9 / 90, 5 / 90, 1.0]))
    assert list(phi) == [34816, 34816, 69632, 69632]
    assert rse == pytest.approx(published.PRIOR_RSE)
    for entry in published.PUBLISHED:
        assert entry.source in published.SOURCES


def test_refit_prior_counts_until_the_run_measures_its_own():
    earlier = StepTimeRefit(4, min_steps=3, warmup_steps=0)
    for m, step in ((16, 0.5), (64, 0.8)):
        for _ in range(4):
            earlier.observe(m, 1, step, 0.3)
    refit = StepTimeRefit(4, min_steps=3, warmup_steps=0)
    assert refit.load_prior(earlier.state()) is None
    assert refit.ready(64, 1) and refit.steps_at(64, 1) == 0
    assert refit.fit().counted == {(16, 1): 4, (64, 1): 4}
    assert refit.fit().of_prior
    for _ in range(3):
        refit.observe(16, 1, 1.0, 0.3)         # this run is slower: its own steps replace the
    fit = refit.fit()                          # prior's, at every split
    assert fit.counted == {(16, 1): 3} and not fit.of_prior and not refit.ready(64, 1)
    assert "this run has 8" in StepTimeRefit(8).load_prior(earlier.state())


def test_a_prior_from_a_slower_machine_does_not_hold_the_batch():
    # The emulated cluster's prior (runs/tta-emu-q, a slower night): 58 ms + 5.8 ms a sample per
    # micro-batch, 350 ms of sync, measured at 16 x 1, 32 x 1 and 32 x 2. This run's machine
    # computes 25 % faster, so sync weighs more: at phi = 194 (the prior's and the run's),
    # 256 = 32 x 2 gives 1.066x the goodput of 128 = 32 x 1, which the prior's times take at
    # step 0. Before, the fit mixed this run's 32 x 1 with the prior's 16 x 1 and 32 x 2: a
    # 7.8 % residual hid the gain and the run held 128 for all 60 steps (on the emulated
    # cluster to epoch 2.6-5.4). Now this run's own steps replace the prior's and it moves.
    def machine(local, accum, speed=1.0):
        return accum * speed * (0.058 + 0.0058 * local) + 0.35, 0.35
    earlier = StepTimeRefit(4, min_steps=5, warmup_steps=0)
    for local, accum, steps in ((16, 1, 10), (32, 1, 76), (32, 2, 26)):
        for _ in range(steps):
            earlier.observe(local, accum, *machine(local, accum))
    refit = StepTimeRefit(4, shape=(0.058, 0.0058), min_steps=5, warmup_steps=2)
    assert refit.load_prior(earlier.state()) is None
    fake = priors.Prior("earlier run", "prior.json", lambda f: (
        np.full(np.shape(f), 194.0), np.full(np.shape(f), 0.27)), earlier.state())
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 32, noise_scale=est, base_batch=64, min_batch=64,
                               max_batch=1024, min_samples=5, refit=refit, prior=fake,
                               throughput=lambda m, s: 4.0 * m * s / machine(m, s)[0],
                               model_error=0.145, epochs=10, epoch_images=10000)
    plans = []
    for step in range(60):
        plan = ctrl.plan(step / 12)
        plans.append((plan.global_batch, plan.local_batch, plan.accum_steps))
        phi_update(est, 194.0)
        refit.observe(plan.local_batch, plan.accum_steps,
                      *machine(plan.local_batch, plan.accum_steps, speed=0.75))
    assert plans[0] == (128, 32, 1)
    assert plans[10:] == [(256, 32, 2)] * 50, plans


def phi_update(est, phi, g2=2.0, b=8, big_b=64):
    """One exact observation of B_simple = phi."""
    est.update(g2 + phi * g2 / b, b, g2 + phi * g2 / big_b, big_b)


def test_prior_decides_at_step_zero_until_measurement_overrides(caplog):
    fake = priors.Prior("earlier run", "prior.json",
                        lambda f: (np.full(np.shape(f), 2000.0), np.full(np.shape(f), 0.2)), None)
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 64, noise_scale=est, base_batch=32, lr_scaling="linear",
                               min_batch=32, max_batch=1024, min_samples=3, max_rse=10.0,
                               throughput=lambda local, accum: 4 * local / (0.05 + 0.01 * local),
                               prior=fake,
                               epochs=10, epoch_images=10000)
    with caplog.at_level(logging.INFO, logger="nnabla_torus.planning.controller"):
        first = ctrl.plan(0.0)
        assert first.global_batch > 32 and "the prior at 0% of training" in first.reason
        assert "decide on the prior (earlier run: prior.json)" in caplog.text
        for _ in range(3):
            phi_update(est, 5.0)                # the run measures a far smaller noise scale
        later = ctrl.plan(0.1)
    notes = " ".join(ctrl.pop_notes())
    assert "the measurement overrides the prior" in notes and "prior's 2000" in notes
    assert later.global_batch == 32 and "3 samples" in later.reason


def test_an_earlier_runs_prior_decides_only_from_its_first_trusted_point():
    # The earlier run measured at B0 until its estimate was trusted, at 4 % of training here:
    # the prior says nothing before that. Before, that point's phi was carried back to step 0,
    # and on the emulated cluster the prior runs started at 128 where the runs without one
    # measured at 64 first, and needed more epochs to 90 % (docs/measurements/adaptive-batch.md).
    spec = {"file": "prior.json", "step_times": None,
            "noise_scale": [[0.04, 2000.0, 0.2], [1.0, 2000.0, 0.2]]}
    prior = priors.from_spec(spec, epochs=10)
    assert prior.starts == pytest.approx(0.04)
    ctrl = BatchSizeController(4, 64, noise_scale=NoiseScaleEstimator(smoothing=0.5),
                               base_batch=32, min_batch=32, max_batch=1024, min_samples=3,
                               throughput=lambda local, accum: 4 * local / (0.05 + 0.01 * local),
                               prior=prior, epochs=10, epoch_images=10000)
    first = ctrl.plan(0.0)
    assert first.global_batch == 32, first
    assert "decide on the prior (earlier run: prior.json) from 4.0% of training" in first.reason
    assert ctrl.plan(0.39).global_batch == 32                 # 3.9 % of training: still B0
    moved = ctrl.plan(0.4)
    assert moved.global_batch > 32 and "the prior at 4% of training" in moved.reason, moved


def test_measurement_before_the_prior_starts_is_the_first_decision_without_one():
    # The run's own estimate is trusted before the prior starts: it decides on it as a run
    # without a prior would, says so, and never goes back to the prior.
    spec = {"file": "prior.json", "step_times": None, "noise_scale": [[0.5, 2000.0, 0.2]]}
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 64, noise_scale=est, base_batch=32, min_batch=32,
                               max_batch=1024, min_samples=3,
                               throughput=lambda local, accum: 4 * local / (0.05 + 0.01 * local),
                               prior=priors.from_spec(spec, epochs=10), epochs=10,
                               epoch_images=10000)
    assert ctrl.plan(0.0).global_batch == 32
    for _ in range(3):
        phi_update(est, 5.0)
    assert ctrl.plan(0.1).global_batch == 32
    notes = " ".join(ctrl.pop_notes())
    assert "overrides the prior" in notes and "before the prior starts (50.0% of" in notes, notes
    assert ctrl.prior_overridden and ctrl.plan(6.0).global_batch == 32     # never the prior's


def test_a_resumed_controller_continues_its_decisions():
    """The checkpoint keeps the decisions so far: a resumed run whose own estimate has to be
    measured anew does not go back to the prior (before: it decided on it again)."""
    def controller(est):
        fake = priors.Prior("earlier run", "prior.json", lambda f: (
            np.full(np.shape(f), 2000.0), np.full(np.shape(f), 0.2)), None)
        return BatchSizeController(4, 64, noise_scale=est, base_batch=32, min_batch=32,
                                   max_batch=1024, min_samples=3, max_rse=10.0, prior=fake,
                                   throughput=lambda local, accum: (
                                       4 * local / (0.05 + 0.01 * local)),
                                   epochs=10, epoch_images=10000)
    est = NoiseScaleEstimator(smoothing=0.5)
    first = controller(est)
    first.plan(0.0)
    for _ in range(3):
        phi_update(est, 5.0)
    assert first.plan(0.1).global_batch == 32 and first.prior_overridden
    resumed = controller(NoiseScaleEstimator(smoothing=0.5))
    resumed.current = first.current
    line = resumed.load_state(json.loads(json.dumps(first.state())))
    assert line.endswith("after 2 decision(s), on the run's own noise scale (not the prior)")
    again = resumed.plan(0.2)
    assert again.global_batch == 32 and "prior" not in again.reason, again.reason


def first_move(draws, epochs):
    """(samples, phi's relative error) at the first move off B0 = 64 of a 4-rank run of
    ``epochs`` x 1,440 images whose estimates are ``draws`` (the emulated cluster's step times)."""
    est = NoiseScaleEstimator(smoothing=0.95, reference_batch=64)
    ctrl = BatchSizeController(4, 32, noise_scale=est, base_batch=64, min_batch=64,
                               max_batch=1024, throughput=lambda local, accum:
                               4 * local * accum / (0.34 + 0.0035 * local * accum),
                               epochs=epochs, epoch_images=1440)
    for n, phi in enumerate(draws):
        if ctrl.plan(n * 64 / 1440).global_batch != 64:
            return n, est.rse
        phi_update(est, phi, b=16, big_b=64)
    return len(draws), est.rse


def test_first_decision_waits_longer_on_a_longer_run():
    """The same estimates, phi = 150 with its error falling as 1/sqrt(samples): the 12-epoch
    digits run decides after 5 samples (the floor), a run 300 times as long after many more."""
    rng = np.random.default_rng(0)
    draws = [max(150.0 * (1 + 0.6 * rng.standard_normal()), 5.0) for _ in range(200)]
    (short, _), (long, _) = first_move(draws, 12), first_move(draws, 3600)
    assert short == 5 and long > 20


def test_first_decision_of_a_short_run_does_not_wait_for_the_error_bound():
    """A noisy estimate whose error stays above MAX_RSE: the 12-epoch run decides once waiting
    costs more than a wrong move risks (before: it waited until the error fell to 0.5, 31 of
    a 55-step run's steps at B0 on the emulated cluster); a run 300 times as long still waits."""
    from nnabla_torus.planning.controller import MAX_RSE
    rng = np.random.default_rng(3)     # its error stays above 0.5 for 20 samples
    draws = [300.0 * np.exp(rng.standard_normal()) for _ in range(200)]
    (short, short_rse), (long, _) = first_move(draws, 12), first_move(draws, 3600)
    assert short < 20 and short_rse > MAX_RSE, (short, short_rse)
    assert long > 2 * short, (long, short)
