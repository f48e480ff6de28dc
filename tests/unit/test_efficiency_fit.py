"""The efficiency model fitted to measured images to a target (planning/efficiency_fit.py), the
controller deciding on it, and its check against fixed runs (tools/efficiency_check.py)."""
import doctest
import json
import math
import os

import numpy as np
import pytest

from nnabla_torus.planning import efficiency_fit, goodput
from nnabla_torus.planning.controller import BatchSizeController
from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from tools import accuracy_report as rep, efficiency_check
from tests.unit.test_time_to_accuracy import epoch_record

# the task of a fit (efficiency_fit.task_of of a batch prior's key)
TASK = {"model": {"arch": "resnet18", "width": 0.125, "image_size": 16, "parameters": 176402},
        "data": {"data": "digits", "images": 1438, "classes": 10}}

BATCHES = np.array([64, 128, 256, 512])


def synthetic(phi, runs_per_batch, noise, seed):
    """(batches, epochs): E_min (1 + B / phi) epochs per run (McCandlish eq. 2.11), E_min = 5,
    each with relative Gaussian noise ``noise``."""
    rng = np.random.default_rng(seed)
    b = np.repeat(BATCHES, runs_per_batch).astype(float)
    return b, 5.0 * (1.0 + b / phi) * (1.0 + noise * rng.standard_normal(len(b)))


def test_doctest():
    assert doctest.testmod(efficiency_fit).failed == 0


@pytest.mark.parametrize("phi", [30.0, 300.0, 3000.0])
def test_the_fit_recovers_a_known_phi(phi):
    exact = efficiency_fit.fit_phi(*synthetic(phi, 2, 0.0, 0))
    assert exact.phi == pytest.approx(phi, rel=1e-9) and exact.rse < 1e-6
    fit = efficiency_fit.fit_phi(*synthetic(phi, 20, 0.02, 1))
    assert abs(fit.phi - phi) < 3 * fit.rse * fit.phi
    assert (fit.runs, fit.batches) == (80, 4)


def test_the_error_is_a_least_squares_lines_against_numpy():
    b, y = synthetic(300.0, 5, 0.05, 2)
    fit = efficiency_fit.fit_phi(b, y)
    (slope, intercept), cov = np.polyfit(b, y, 1, cov="unscaled")
    s2 = np.sum((y - np.polyval([slope, intercept], b)) ** 2) / (len(b) - 2)
    var_b, var_a, cov_ab = s2 * cov[0, 0], s2 * cov[1, 1], s2 * cov[0, 1]
    phi = intercept / slope
    rse = math.sqrt(var_a / intercept ** 2 + var_b / slope ** 2 - 2 * cov_ab / (intercept * slope))
    assert fit.phi == pytest.approx(phi) and fit.rse == pytest.approx(rse)


def test_the_error_is_calibrated_and_shrinks_with_more_runs():
    # over many synthetic experiments the spread of phi matches the rse the fit states
    fits = [efficiency_fit.fit_phi(*synthetic(300.0, 10, 0.03, seed)) for seed in range(400)]
    phis = np.array([f.phi for f in fits])
    assert np.std(phis) / 300.0 == pytest.approx(np.median([f.rse for f in fits]), rel=0.2)
    # 16x the runs: a quarter of the error (1 / sqrt(runs))
    few = np.median([efficiency_fit.fit_phi(*synthetic(300.0, 3, 0.03, s)).rse
                     for s in range(50)])
    many = np.median([efficiency_fit.fit_phi(*synthetic(300.0, 48, 0.03, s)).rse
                      for s in range(50)])
    assert many < few and many / few == pytest.approx(0.25, rel=0.3)


def test_the_edges_of_the_fit():
    assert efficiency_fit.fit_phi([64, 256], [6.0, 6.0]).phi == math.inf      # no more images
    same = efficiency_fit.fit_phi([128] * 5 + [256] * 5, [2.5, 2.5, 3.5, 2.5, 1.5] * 2)
    assert same.phi == math.inf          # least squares leaves a slope of ~1e-19, not 0
    assert efficiency_fit.fit_phi([64, 256], [2.0, 9.0]).phi == 0.0           # no steps saved
    two = efficiency_fit.fit_phi([64, 256], [5.5, 8.5])
    assert two.phi == pytest.approx(rep.implied_phi(64, 256, 5.5 / 8.5)) and two.rse == math.inf
    with pytest.raises(ValueError, match="two or more"):
        efficiency_fit.fit_phi([64, 64, 64], [5.0, 6.0, 7.0])


def test_adascales_gain_ratio_is_the_goodput_gain_at_b_simple():
    # r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2), sigma^2 = tr(S) / B0 (Johnson et al. 3.1)
    rng = np.random.default_rng(3)
    for _ in range(20):
        trace, grad_sq, base = 10 ** rng.uniform(0, 4), 10 ** rng.uniform(-2, 2), 64
        scale = rng.uniform(1, 64)
        sigma2 = trace / base
        r = (sigma2 + grad_sq) / (sigma2 / scale + grad_sq)
        assert r == pytest.approx(float(goodput.gain(scale * base, trace / grad_sq, base)))


def test_scale_apply_and_file(tmp_path):
    fit = efficiency_fit.Fit(450.0, 0.3, 12, 3)
    scale = efficiency_fit.scale_of(fit, 300.0, 0.4, task=TASK)
    assert scale.factor == 1.5 and scale.rse == pytest.approx(0.5)
    # counted in 1 / phi: one error low is 300 / 1.5 = 200, i.e. 300 x (1 - 1/3)
    assert efficiency_fit.apply(scale, 200.0, 0.0) == (300.0, pytest.approx(1 / 3))
    assert efficiency_fit.apply(None, 200.0, 0.1) == (200.0, 0.1)
    efficiency_fit.save(scale, tmp_path / "fit.json")
    assert efficiency_fit.load(tmp_path / "fit.json") == scale
    (tmp_path / "bad.json").write_text('{"factor": 1.0}')
    with pytest.raises(ValueError, match="time_to_accuracy.py efficiency"):
        efficiency_fit.load(tmp_path / "bad.json")


def test_a_decision_does_not_move_when_the_gain_is_inside_the_models_error():
    # throughput sublinear in B; at phi = 1.5 x 200 the point estimate gains > 10 % by moving
    batches = np.array([64.0, 128.0, 256.0])
    speed = batches / (0.1 + 0.001 * batches)
    sure = efficiency_fit.Scale(1.5, 0.02, 300.0, 200.0)
    unsure = efficiency_fit.Scale(1.5, 9.0, 300.0, 200.0)      # one error low: 30
    for scale, moves in ((sure, True), (unsure, False)):
        phi, rse = efficiency_fit.apply(scale, 200.0, 0.05)
        d = goodput.decide(batches, speed, phi, rse, 64, 0, 0.05)
        assert d.change is moves
        assert goodput.goodput(speed, batches, phi, 64).argmax() != 0   # the point estimate
        #                                                                would move both times


def controller(efficiency):
    est = NoiseScaleEstimator(smoothing=0.5)
    ctrl = BatchSizeController(4, 64, noise_scale=est, base_batch=32, lr_scaling="none",
                               min_batch=32, max_batch=4096, min_samples=2, max_rse=10.0,
                               throughput=lambda local, accum: 1000.0 * local / (1 + local / 64),
                               efficiency=efficiency)
    ctrl.plan(0)
    for _ in range(3):
        est.update(2 + 400 / 8, 8, 2 + 400 / 64, 64)    # B_simple = 200
    return ctrl


def test_the_controller_decides_on_the_fitted_phi():
    plain, fitted = controller(None), controller(efficiency_fit.Scale(4.0, 0.01, 800.0, 200.0))
    p, f = plain.plan(0.3), fitted.plan(0.3)
    assert "phi = 200" in (p.reason if p.changed else " ".join(plain.notes))
    assert f.changed and "phi = 800" in f.reason and "4.00 x B_simple, fitted" in f.reason
    assert f.global_batch > p.global_batch            # a larger phi: a larger batch pays
    # one error low, 800 / (1 + 5) = 133 < 200: no larger a batch than without the fit
    unsure = controller(efficiency_fit.Scale(4.0, 5.0, 800.0, 200.0))
    assert 32 < unsure.plan(0.3).global_batch <= p.global_batch


def test_a_slope_within_its_error_of_zero_still_bounds_phi_from_below():
    """Clusters on one host, quarter-epoch validations: every batch 64-1024 took ~2 epochs, a
    fit of phi 9,582 +- 122 %. Counted in phi its low end was 0 (the controller could never
    move); counted in 1 / phi, where the line's error is symmetric, it is 9,582 / 2.22."""
    phi, rse = efficiency_fit.apply(efficiency_fit.Scale(11.9, 1.22, 9582.0, 805.0), 805.0, 0.0)
    assert phi * (1 - rse) == pytest.approx(9582.0 / 2.22, rel=1e-3)
    inside = []                               # and the low end holds the truth as often as stated
    for seed in range(400):
        b, y = synthetic(2000.0, 9, 0.08, seed)
        fit = efficiency_fit.fit_phi(b, y)
        inside.append(fit.phi * (1 - efficiency_fit.low_end(fit.rse)) <= 2000.0)
    assert 0.75 < np.mean(inside) < 0.92      # one-sided one-error coverage: 84 %


def test_the_check_predicts_each_fixed_batch(tmp_path):
    # runs that follow E(B) at phi = 320 exactly (3.6, 4.2, 5.4 epochs, seen 0.5 after)
    epochs = {b: 3.0 * (1 + b / 320) for b in (64, 128, 256)}
    records = [epoch_record(tmp_path, f"fixed {b}", b, s, e + 0.5 + 0.01 * (s - 1))
               for b, e in epochs.items() for s in range(3)]
    records.append(epoch_record(tmp_path, rep.ADAPTIVE, 64, 9, 7.0, "1 100\n2 100\n"))
    rows, fit, scale = efficiency_check.check(records)
    assert [r["batch"] for r in rows] == [64, 128, 256] and rows[0]["measured"] == 1.0
    assert fit.phi == pytest.approx(320.0, rel=1e-6)
    for r in rows[1:]:
        want = (320.0 + 64) / (320.0 + r["batch"])
        assert r["measured"] == pytest.approx(want) and r["loo"] == pytest.approx(want, rel=1e-6)
        assert r["b_simple"] == pytest.approx((100.0 + 64) / (100.0 + r["batch"]))
    assert efficiency_check.mean_error(rows, "loo") < 1e-6 < efficiency_check.mean_error(
        rows, "b_simple")
    assert scale.factor == pytest.approx(3.2, rel=1e-6) and scale.rse == math.inf  # one run
    text = efficiency_check.table(rows, 0.90, fit, scale)
    assert "| 256 | 3 |" in text and "phi fitted to the other batches 0.000" in text


def test_seeds_that_agree_to_the_epoch_leave_the_rounding_as_the_error():
    b, y = np.repeat([64.0, 128.0, 256.0], 4), np.repeat([6.0, 7.0, 9.0], 4)
    assert efficiency_fit.fit_phi(b, y).rse == pytest.approx(0.0, abs=1e-9)
    rounded = efficiency_fit.fit_phi(b, y, resolution=1.0)
    x = np.column_stack([np.ones(12), b])
    (vaa, vab), (_, vbb) = np.linalg.inv(x.T @ x) / 12.0        # s^2 = 1 / 12 epoch^2
    (a, slope), *_ = np.linalg.lstsq(x, y, rcond=None)
    want = math.sqrt(vaa / a ** 2 + vbb / slope ** 2 - 2 * vab / (a * slope))
    assert rounded.rse == pytest.approx(want)


def test_the_efficiency_command_writes_the_fit_train_py_reads(tmp_path, capsys):
    import json

    from tools import time_to_accuracy as tta
    epochs = {64: [6.0, 6.0, 7.0], 128: [7.0, 8.0, 8.0], 256: [9.0, 9.0, 10.0]}
    records = [epoch_record(tmp_path, f"fixed {b}", b, s, e) for b, runs in epochs.items()
               for s, e in enumerate(runs)]
    records += [epoch_record(tmp_path, rep.ADAPTIVE, 64, 10 + s, 7.0, f"1 {phi}\n")
                for s, phi in enumerate((200, 240, 220))]
    (tmp_path / "measured.json").write_text(json.dumps({"where": "here", "records": records}))
    assert tta.main(["efficiency", "--out", str(tmp_path)]) == 0      # no run names its task
    assert "efficiency_fit.json not written: no adaptive run left its batch_prior.json" in \
        capsys.readouterr().out and not (tmp_path / "efficiency_fit.json").exists()
    for r in records[-2:]:                   # what train.py leaves: the task in the prior's key
        prior = {"key": {**TASK, "ranks": 4, "machine": "cpu-2core 1x4"}, "points": []}
        (tmp_path / os.path.basename(r["dir"]) / "batch_prior.json").write_text(
            json.dumps(prior))
    assert tta.main(["efficiency", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.endswith(
        "(train.py --efficiency-fit) for resnet18 x0.125 16 px (176,402 parameters) on digits "
        "(1,438 images)\n")
    scale = efficiency_fit.load(tmp_path / "efficiency_fit.json")
    assert scale.task == TASK
    points = [(b, e - 0.5) for b, runs in epochs.items() for e in runs]
    fit = efficiency_fit.fit_phi(*zip(*points), resolution=1.0)
    assert scale.phi == pytest.approx(fit.phi) and scale.b_simple == 220.0
    assert scale.factor == pytest.approx(fit.phi / 220.0) and fit.rse < scale.rse < 1.0
    assert "| 128 | 3 | 7.17 +- 0.33 |" in (tmp_path / "efficiency.md").read_text()


def test_a_pool_of_two_tasks_writes_no_fit(tmp_path):
    from tools import time_to_accuracy as tta
    records = [epoch_record(tmp_path, rep.ADAPTIVE, 64, s, 7.0, "1 200\n") for s in (1, 2)]
    for r, images in zip(records, (1438, 512)):
        key = {**TASK, "data": dict(TASK["data"], images=images), "ranks": 4, "machine": "x"}
        (tmp_path / os.path.basename(r["dir"]) / "batch_prior.json").write_text(
            json.dumps({"key": key}))
    with pytest.raises(SystemExit, match=r"^time_to_accuracy.py efficiency: the runs trained "
                                         r"different tasks \(resnet18 x0.125 16 px \(176,402 "
                                         r"parameters\) on digits \(1,438 images\) in .*; .* "
                                         r"on digits \(512 images\) in .*\): pool measurements "
                                         r"of one task$"):
        tta.fitted_task(records)
    fixed = dict(records[0], policy="fixed 64", params=176402, dataset=1000, dir="runs/f")
    with pytest.raises(SystemExit, match=r"176,402 parameters on 1,000 images in runs/f\)"):
        tta.fitted_task([records[0], fixed])


GOOD = {"factor": 1.5, "rse": 0.3, "phi": 330.0, "b_simple": 220.0, "largest_batch": 256,
        "task": TASK}


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "holds a JSON list, not an object of factor, rse, phi"),
    ('"fit"', "holds a JSON str, not an object of factor"),
    ("{", "is unreadable (Expecting property name"),
    (dict(GOOD, largest_batch=1e999), "largest_batch = inf must be a finite number an integer"),
    (dict(GOOD, largest_batch=96.5), "largest_batch = 96.5 must be"),
    (dict(GOOD, rse=math.inf), "rse = inf must be a finite number >= 0"),
    (dict(GOOD, factor=True), "factor = True must be a finite number within 0.001-1000"),
    (dict(GOOD, factor=1e308), "factor = 1e+308 must be a finite number within 0.001-1000"),
    (dict(GOOD, factor="2"), "factor = '2' must be"),
    (dict(GOOD, phi=-5.0), "phi = -5.0 must be a finite number > 0"),
    (dict(GOOD, phi=math.nan), "phi = nan must be a finite number > 0"),
    (dict(GOOD, b_simple=list(range(100))), "b_simple = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11... "
                                             "must be"),
    ({k: v for k, v in GOOD.items() if k != "rse"}, "rse = None must be a finite number"),
    ({k: v for k, v in GOOD.items() if k != "task"}, "task = None must name the model and data"),
    (dict(GOOD, task="digits"), "task = 'digits' must name the model and data"),
])
def test_a_bad_fit_file_is_one_line(tmp_path, text, message):
    """Each was a traceback (a list, a string, largest_batch 1e999) or accepted (rse inf,
    factor true, phi negative or NaN, factor 1e308: a 464-character log line)."""
    path = tmp_path / "fit.json"
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    with pytest.raises(ValueError) as caught:
        efficiency_fit.load(str(path))
    line = str(caught.value)
    assert line.startswith(f"efficiency fit {str(path)!r}") and message in line, line
    assert "\n" not in line and len(line) < 300, line
    assert line.endswith("write it again with `python tools/time_to_accuracy.py efficiency`")


def test_a_fit_of_another_task_names_both():
    scale = efficiency_fit.Scale(1.5, 0.3, 330.0, 220.0, 256, TASK)
    efficiency_fit.check_task(scale, TASK, "fit.json")
    other = {"model": dict(TASK["model"], arch="mlp", parameters=5000), "data": TASK["data"]}
    with pytest.raises(ValueError, match=r"^efficiency fit 'fit.json' was fitted on resnet18 "
                                         r"x0.125 16 px \(176,402 parameters\) on digits "
                                         r"\(1,438 images\), not this run's mlp x0.125 16 px "
                                         r"\(5,000 parameters\) on digits \(1,438 images\); "):
        efficiency_fit.check_task(scale, other, "fit.json")


def test_the_fitted_factor_is_not_taken_past_the_batches_it_was_fitted_on(tmp_path):
    """Clusters, emulated: a factor of 31 fitted to runs up to 1024 moved one run to 2032 at
    step 28, where its linearly scaled rate (1.59) diverged to chance accuracy."""
    scale = efficiency_fit.scale_of(efficiency_fit.Fit(4000.0, 0.5, 9, 3), 200.0, 0.1, 256,
                                    TASK)
    assert scale.largest_batch == 256 and "runs up to batch 256" in efficiency_fit.describe(scale)
    efficiency_fit.save(scale, tmp_path / "fit.json")
    assert efficiency_fit.load(tmp_path / "fit.json") == scale
    ctrl = controller(scale)                              # phi = 20 x 200: 4096 would pay
    assert ctrl.max_batch == 256 and "fit's runs went up to batch 256" in ctrl.notes[0]
    for epoch in (0.3, 0.6, 0.9):
        assert ctrl.plan(epoch).global_batch <= 256
    assert ctrl.current.global_batch > 32
    # a file written before largest_batch loads with no bound
    (tmp_path / "old.json").write_text(json.dumps({"factor": 2.0, "rse": 0.3, "phi": 400,
                                                   "b_simple": 200, "task": TASK}))
    assert efficiency_fit.load(tmp_path / "old.json").largest_batch is None
    assert controller(efficiency_fit.load(tmp_path / "old.json")).max_batch == 4096
