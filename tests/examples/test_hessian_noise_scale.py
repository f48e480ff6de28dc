"""tools/research/hessian_noise_scale.py: exact Hessian-vector products, B_simple and B_noise
against their true values on gradients of known statistics, and a run that goes on as if
unmeasured."""
import nnabla as nn
import nnabla.functions as F
import numpy as np
import pytest

import branch_efficiency as be
import hessian_noise_scale as hns
from config import parse_config


def test_hessian_vector_products_are_least_squares_exact_hessian():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 7))
    w = nn.Variable((7,), need_grad=True)
    w.d = rng.standard_normal(7)
    xs, ys = nn.Variable.from_numpy_array(x), nn.Variable.from_numpy_array(rng.standard_normal(50))
    loss = F.mean((F.sum(xs * F.reshape(w, (1, 7)), axis=1) - ys) ** 2) * 0.5
    hessian_vector = hns.HessianVector(loss, [w])
    for _ in range(3):
        v = rng.standard_normal(7)
        np.testing.assert_allclose(hessian_vector(v), x.T @ x / 50 @ v, rtol=1e-4, atol=1e-5)


def test_power_iterations_find_the_largest_eigenvalue_from_below():
    rng = np.random.default_rng(5)
    basis, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    hessian = basis @ np.diag([5.0, 3.0, 1.0, 0.5, -0.5, 0.1]) @ basis.T
    few = hns.largest_eigenvalue(lambda v: hessian @ v, 6, 3)
    assert 3.0 < few <= 5.0
    assert hns.largest_eigenvalue(lambda v: hessian @ v, 6, 100) == pytest.approx(5.0)


def gradients(rng, count, batch, mean, noise_sd):
    """``count`` gradients, each the mean over ``batch`` images whose gradients are
    ``mean`` + N(0, diag(noise_sd^2))."""
    return mean + rng.standard_normal((count, mean.size)) * noise_sd / np.sqrt(batch)


# G, S = diag(sd^2) and a diagonal H whose weights differ from S's, so that B_noise = 4.4 is far
# from B_simple = 404: the noise sits where the curvature is small.
G = np.array([1.0, 1.0, 0.0, 0.0])
SD = np.array([2.0, 2.0, 20.0, 20.0])
H = np.array([1.0, 1.0, 0.001, 0.001])
B_SIMPLE = (SD ** 2).sum() / (G @ G)
B_NOISE = (H * SD ** 2).sum() / (G @ (H * G))


def test_the_noise_scales_come_out_at_their_true_values():
    assert (B_SIMPLE, round(B_NOISE, 6)) == (404.0, 4.4)
    rng = np.random.default_rng(1)
    scales = hns.noise_scales(gradients(rng, 4000, 32, G, SD), lambda v: H * v, 32)
    assert scales["b_simple"] == pytest.approx(B_SIMPLE, rel=4 * scales["b_simple_rse"])
    assert scales["b_noise"] == pytest.approx(B_NOISE, rel=4 * scales["b_noise_rse"])
    assert scales["b_simple_rse"] < 0.05 and scales["b_noise_rse"] < 0.05


@pytest.mark.parametrize("over_optimum, sign", [(1, -1), (2, 0), (3, 1)])
def test_a_step_over_twice_the_optimal_raises_the_quadratic_loss(over_optimum, sign):
    """On L(w) = (w - w*)^T H (w - w*) / 2 with gradients at batch 8 of noise S / 8, the mean
    change of the loss over 200,000 noisy steps falls below 0 at the optimal step, is 0 at
    twice it and rises above 0 beyond."""
    rng, batch, offset = np.random.default_rng(4), 8, G / H
    scales = {"g_sq": G @ G, "g_h_g": G @ (H * G), "b_noise": B_NOISE}
    rate = over_optimum / hns.rate_over_optimum(1.0, 0.0, scales, batch)
    assert hns.rate_over_optimum(rate / 10, 0.9, scales, batch) == pytest.approx(over_optimum)
    after = offset - rate * gradients(rng, 200_000, batch, G, SD)
    change = (after ** 2 * H).sum(axis=1) / 2 - offset @ (H * offset) / 2
    mean, error = change.mean(), change.std() / np.sqrt(change.size)
    if sign:
        assert np.sign(mean) == sign and abs(mean) > 4 * error
    else:
        assert abs(mean) < 4 * error


def test_each_part_is_unbiased_from_as_few_as_eight_gradients():
    """|mean g|^2 would be |G|^2 + tr(S) / (B M): 5.2 instead of 2 here."""
    rng = np.random.default_rng(3)
    parts = {"g_sq": G @ G, "trace_s": (SD ** 2).sum(), "g_h_g": G @ (H * G),
             "trace_hs": (H * SD ** 2).sum()}
    samples = {name: [] for name in parts}
    for _ in range(3000):
        scales = hns.noise_scales(gradients(rng, 8, 32, G, SD), lambda v: H * v, 32)
        for name in parts:
            samples[name].append(scales[name])
    for name, true in parts.items():
        values = np.array(samples[name])
        assert values.mean() == pytest.approx(true, abs=4 * values.std() / np.sqrt(len(values)))


def test_one_relative_error_holds_the_truth_about_two_times_in_three():
    rng = np.random.default_rng(2)
    held = {"b_simple": 0, "b_noise": 0}
    trials = 300
    for _ in range(trials):
        scales = hns.noise_scales(gradients(rng, 64, 32, G, SD), lambda v: H * v, 32)
        for name, true in (("b_simple", B_SIMPLE), ("b_noise", B_NOISE)):
            held[name] += abs(scales[name] / true - 1) <= scales[name + "_rse"]
    for name, count in held.items():
        assert 0.55 <= count / trials <= 0.85, (name, count / trials)


def run_on_digits(measured):
    """Weights, BN statistics and momentum after 4 steps at 16 on digits-cpu, measured after
    the second or not."""
    nn.clear_parameters()
    args = hns.parse_args(["-C", "digits-cpu", "--batch", "16", "--micro-batches", "4",
                           "--hessian-images", "24", "--at", "0"])
    cfg = parse_config(["-C", "digits-cpu", "--seed", "5"])
    run = be.Branches(cfg, be.parse_args(["--batch", "16", "--large-batch", "32",
                                          "--probe-images", "8"]))
    epoch = run.step(16, run.step(16, 0.0))
    if measured:
        scales = hns.Measure(run, args)()
        assert scales["trace_s"] > 0 and np.isfinite(scales["b_noise"])
    epoch = run.step(16, run.step(16, epoch))
    weights, (momentum, _) = run.save()
    return weights, momentum


@pytest.mark.slow
def test_a_measurement_leaves_the_run_as_if_unmeasured():
    w_measured, m_measured = run_on_digits(measured=True)
    w_plain, m_plain = run_on_digits(measured=False)
    assert any("mean" in k for k in w_plain), "BN statistics are among the saved arrays"
    for k in w_plain:
        np.testing.assert_array_equal(w_measured[k], w_plain[k], err_msg=k)
    for k in m_plain:
        np.testing.assert_array_equal(m_measured[k], m_plain[k], err_msg=k)


@pytest.mark.slow
def test_the_command_prints_a_row_per_point_and_their_median(capsys):
    nn.clear_parameters()
    rows = hns.main(["-C", "digits-cpu", "--batch", "16", "--at", "0,0.05",
                     "--micro-batches", "4", "--hessian-images", "24"])
    out = capsys.readouterr().out
    assert rows[0]["epoch"] == 0 and rows[1]["epoch"] >= 0.05
    assert "median B_noise / B_simple over 2 points" in out
    for r in rows:
        assert (f"| {r['b_noise'] / r['b_simple']:.2f} | {r['step']:.4g} | "
                f"{r['over_optimum']:.2f}\n") in out
    # digits-cpu: 0.05 at 64 after a one-epoch linear warm-up, linear scaling, momentum 0.9
    warm_rate = 0.05 * rows[1]["epoch"] / 1 * 16 / 64
    assert rows[1]["step"] == pytest.approx(warm_rate / (1 - 0.9))
    assert "the run's step over the optimal step at 16: median" in out
    assert "lambda_max" not in out


@pytest.mark.slow
def test_the_sharpness_columns_are_the_rate_times_the_largest_eigenvalue(capsys):
    nn.clear_parameters()
    rows = hns.main(["-C", "clusters-mlp", "--at", "0.01", "--micro-batches", "4",
                     "--hessian-images", "64", "--sharpness-iterations", "30"])
    out = capsys.readouterr().out
    row = rows[0]
    assert row["sharpness"] > 0
    assert row["rate_sharpness"] == pytest.approx(row["step"] * (1 - 0.9) * row["sharpness"])
    assert f"| {row['sharpness']:.4g} | {row['rate_sharpness']:.3g}\n" in out
    assert "rate x lambda_max at 64: median" in out and "stable below 3.80" in out


@pytest.mark.parametrize("argv, message", [
    (["--micro-batches", "5"], "--micro-batches: an even number"),
    (["--micro-batches", "2"], "--micro-batches"),
    (["--at", "1,0.5"], "--at: epochs >= 0 in increasing order"),
    (["--sharpness-iterations", "-1"], "--sharpness-iterations"),
])
def test_bad_flags_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        hns.parse_args(argv)
    assert message in capsys.readouterr().err


def test_more_hessian_images_than_the_data_and_an_unknown_recipe_are_refused():
    nn.clear_parameters()
    with pytest.raises(SystemExit, match="--hessian-images 4096 is more than the 1438 training "
                                         "images of digits"):
        hns.main(["-C", "digits-cpu", "--hessian-images", "4096"])
    with pytest.raises(SystemExit, match="hessian_noise_scale.py: error: recipe 'nosuch'"):
        hns.main(["-C", "nosuch"])
