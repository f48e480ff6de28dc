"""The noise scale with the Hessian, B_noise = tr(H S) / (G^T H G), beside the one the
controller uses, B_simple = tr(S) / |G|^2, at points of a single-process run.

McCandlish et al. (arXiv:1812.06162, section 2.2) derive the critical batch from B_noise: it
is the batch at which a step at the optimal learning rate makes half the progress of a step on
the true gradient. B_simple is the same ratio with H taken as a multiple of the identity, the
form that two gradient norms per step give, and so the one a run can measure for free. This
tool measures both, to check whether the Hessian would move the efficiency E(B) = (phi + B0) /
(phi + B) towards what fixed runs measure (``time_to_accuracy.py efficiency``)::

    python tools/research/hessian_noise_scale.py -C clusters-mlp --seed 1

At each point ``--at`` (epochs) of a run at ``--batch`` (default: the recipe's first batch),
``--micro-batches`` gradients at ``--batch`` are taken on images of their own, and
Hessian-vector products on a further ``--hessian-images`` images, exactly, by nnabla's double
backward (``nn.grad`` of G . v). With g_1..g_M the gradients (S the covariance of one image's
gradient, H the Hessian of the training loss, G its gradient):

- tr(S) = B x the mean of |g_i - g_j|^2 / 2 over the pairs (0, 1), (2, 3), ...;
- tr(H S) = B x the mean of (g_i - g_j)^T H (g_i - g_j) / 2 over the same pairs;
- |G|^2 = the mean of G_a . g_i and G^T H G = the mean of G_a^T H g_i over the second half's
  gradients g_i, G_a the mean of the first half's: unbiased, as G_a and g_i are independent.

Each is a mean; its standard error comes from the spread of its terms, and a ratio's relative
error is its two parts' in quadrature (their correlation left out). The weights and BN
statistics are restored after each point and the solver does not step, so the run goes on as if
unmeasured.

E(B) = (B_noise + B0) / (B_noise + B) is the efficiency at the rate that lowers the loss most at
each batch, eps_opt(B) = (|G|^2 / G^T H G) / (1 + B_noise / B) (McCandlish et al., eq. 2.6).
The next two columns are the step the run takes, the recipe's rate at the point over
(1 - momentum) as a momentum buffer takes on a steady gradient, and that step over
eps_opt(--batch). Above 2 the step raises the quadratic model's loss in expectation, and the
model's E(B) describes steps the run does not take. (LARS recipes get no figure: their rate is
per layer.)

With ``--sharpness-iterations N`` the tool also estimates the Hessian's largest eigenvalue,
lambda_max, by N power iterations on the Hessian images (the estimate is never above it), and
prints rate x lambda_max: heavy-ball momentum (nnabla's ``v <- m v + rate g``) is stable on a
quadratic while it is below 2 (1 + m). Linear scaling multiplies it by the batch's factor, so
it says how far the rate is from where a large batch's steps could no longer converge.
"""
import argparse

import _tools  # noqa: F401  (tools/ on sys.path, for _example)
import _example  # noqa: F401  (examples/imagenet on sys.path)
import nnabla as nn
import nnabla.functions as F
import numpy as np

import data
from branch_efficiency import (Branches, add_run_knobs, check_run_knobs, recipe_of,
                               set_weights, weights)
from nnabla_torus.knobs import add_knob, number


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_knobs(parser, "NNABLA_TORUS_HESSIAN", "0.1,0.4,1,1.6,2.5")
    add_knob(parser, "--micro-batches", "NNABLA_TORUS_HESSIAN_MICRO_BATCHES", 64,
             "gradients at --batch per point (even; the Hessian-vector products are as many)",
             type=number(int, low=4))
    add_knob(parser, "--hessian-images", "NNABLA_TORUS_HESSIAN_IMAGES", 2048,
             "images of the batch whose loss gives the Hessian", type=number(int, low=1))
    add_knob(parser, "--sharpness-iterations", "NNABLA_TORUS_HESSIAN_SHARPNESS_ITERATIONS", 0,
             "power iterations for the Hessian's largest eigenvalue (0: not measured)",
             type=number(int, low=0))
    args = parser.parse_args(argv)
    if args.micro_batches % 2:
        parser.error(f"--micro-batches: an even number (pairs and halves), got "
                     f"{args.micro_batches}")
    return check_run_knobs(parser, args)


class HessianVector:
    """v -> H v for the Hessian of ``loss`` in ``params`` (a list of Variables) on the data
    in its graph, by double backward; vectors are flat float64 arrays."""

    def __init__(self, loss, params):
        grads = nn.grad([loss], params)
        self.vectors = [nn.Variable(p.shape) for p in params]
        g_dot_v = F.sum(F.stack(*[F.sum(g * v) for g, v in zip(grads, self.vectors)]))
        self.products = nn.grad([g_dot_v], params)
        self.sink = F.sink(*self.products)

    def __call__(self, vector):
        start = 0
        for v in self.vectors:
            v.d = vector[start:start + v.size].reshape(v.shape)
            start += v.size
        self.sink.forward(clear_no_need_grad=True)
        return np.concatenate([h.d.ravel() for h in self.products]).astype(np.float64)


def noise_scales(grads, hessian_vector, batch):
    """B_simple and B_noise, with their parts and relative standard errors, from the rows of
    ``grads`` (M gradients, each a mean over ``batch`` images, M even) and ``hessian_vector``."""
    half = len(grads) // 2
    mean_a, second = grads[:half].mean(axis=0), grads[half:]
    diffs = grads[0::2] - grads[1::2]
    trace_s = batch * np.einsum("ij,ij->i", diffs, diffs) / 2
    trace_hs = batch * np.array([d @ hessian_vector(d) for d in diffs]) / 2
    g_sq = second @ mean_a
    h_mean_a = hessian_vector(mean_a)            # H symmetric: G_a^T H g_i = (H G_a) . g_i
    g_h_g = second @ h_mean_a

    def mean_rse(terms):
        return terms.mean(), terms.std(ddof=1) / np.sqrt(len(terms)) / abs(terms.mean())
    (ts, ts_e), (ths, ths_e), (g2, g2_e), (ghg, ghg_e) = map(
        mean_rse, (trace_s, trace_hs, g_sq, g_h_g))
    return {"g_sq": g2, "trace_s": ts, "b_simple": ts / g2, "b_simple_rse": np.hypot(ts_e, g2_e),
            "g_h_g": ghg, "trace_hs": ths, "b_noise": ths / ghg,
            "b_noise_rse": np.hypot(ths_e, ghg_e)}


def largest_eigenvalue(hessian_vector, size, iterations, seed=0):
    """lambda_max of the Hessian behind ``hessian_vector`` (vectors of ``size``) after
    ``iterations`` power iterations from a random start: the Rayleigh quotient of the last
    vector, never above lambda_max, and converging to it when no negative eigenvalue is
    larger in magnitude."""
    vector = np.random.default_rng(seed).standard_normal(size)
    for _ in range(iterations):
        vector /= np.linalg.norm(vector)
        product = hessian_vector(vector)
        quotient, vector = vector @ product, product
    return quotient


class Measure:
    """Gradients and Hessian-vector products at the run's current weights, on images of their
    own (the run's stream is left alone)."""

    def __init__(self, run, args):
        self.run, self.args = run, args
        self.params = list(nn.get_parameters().values())
        cfg = run.cfg
        self.gradient_images = self.batches(args.batch, cfg.seed + 202)
        self.hessian_images = self.batches(args.hessian_images, cfg.seed + 101)
        x, t, loss, _, _ = run.graph(args.hessian_images)
        self.hessian_inputs = (x, t)
        self.hessian_vector = HessianVector(loss, self.params)

    def batches(self, size, seed):
        """Batches of ``size`` training images, epoch after epoch."""
        cfg = self.run.cfg
        while True:
            yield from data.make_loader(self.run.train_set, size, train=True,
                                        image_size=cfg.image_size, seed=seed,
                                        crop_scale=(cfg.min_crop_area, 1.0), flip=cfg.flip,
                                        val_crop=cfg.val_crop)
            seed += 1000

    def gradient(self):
        x, t, _, objective, _ = self.run.graph(self.args.batch)
        feed((x, t), next(self.gradient_images))
        for p in self.params:
            p.grad.zero()
        objective.forward(clear_no_need_grad=True)
        objective.backward(clear_buffer=True)
        return np.concatenate([p.g.ravel() for p in self.params]).astype(np.float64)

    def __call__(self):
        saved = weights()               # forward in training mode moves the BN statistics
        grads = np.array([self.gradient() for _ in range(self.args.micro_batches)])
        feed(self.hessian_inputs, next(self.hessian_images))
        scales = noise_scales(grads, self.hessian_vector, self.args.batch)
        if self.args.sharpness_iterations:
            scales["sharpness"] = largest_eigenvalue(self.hessian_vector, grads.shape[1],
                                                     self.args.sharpness_iterations)
        set_weights(saved)
        return scales


def feed(variables, arrays):
    for v, a in zip(variables, arrays):
        v.d = np.asarray(a).reshape(v.shape)


def rate_over_optimum(rate, momentum, scales, batch):
    """The step ``rate`` / (1 - ``momentum``) over McCandlish et al.'s optimal step at ``batch``
    (eq. 2.6), from the parts in ``scales`` (``noise_scales``): 1 is the optimum, above 2 the
    step raises the quadratic model's loss in expectation."""
    optimum = scales["g_sq"] / scales["g_h_g"] / (1 + scales["b_noise"] / batch)
    return rate / (1 - momentum) / optimum


def main(argv=None):
    args = parse_args(argv)
    cfg = recipe_of(args, "hessian_noise_scale.py")
    # the run of branch_efficiency.py (its probe and large batch unused here)
    run = Branches(cfg, argparse.Namespace(batch=args.batch, large_batch=args.batch,
                                           probe_images=1))
    if args.hessian_images > run.images:
        raise SystemExit(f"hessian_noise_scale.py: error: --hessian-images "
                         f"{args.hessian_images} is more than the {run.images} training images "
                         f"of {cfg.dataset}")
    measure = Measure(run, args)
    print(f"{args.config}, seed {args.seed}: {args.micro_batches} gradients at {args.batch} "
          f"and the Hessian on {args.hessian_images} images per point")
    sharpness = args.sharpness_iterations > 0
    print("epoch | |G|^2 | tr(S) | B_simple | G^T H G | tr(H S) | B_noise | B_noise / B_simple | "
          "rate / (1 - momentum) | over the optimal step"
          + (" | lambda_max | rate x lambda_max" if sharpness else ""))
    epoch, rows = 0.0, []
    for at in args.at:
        while epoch < at:
            epoch = run.step(args.batch, epoch)
        rate = run.rate(args.batch, epoch)
        row = dict(measure(), epoch=epoch, step=rate / (1 - cfg.momentum))
        row["over_optimum"] = (rate_over_optimum(rate, cfg.momentum, row, args.batch)
                               if cfg.optimizer == "momentum" else float("nan"))
        if sharpness:
            row["rate_sharpness"] = rate * row["sharpness"]
        rows.append(row)
        print(f"{epoch:.3f} | {row['g_sq']:.4g} | {row['trace_s']:.4g} | "
              f"{row['b_simple']:.0f} +- {row['b_simple_rse']:.0%} | {row['g_h_g']:.4g} | "
              f"{row['trace_hs']:.4g} | {row['b_noise']:.0f} +- {row['b_noise_rse']:.0%} | "
              f"{row['b_noise'] / row['b_simple']:.2f} | {row['step']:.4g} | "
              f"{row['over_optimum']:.2f}"
              + (f" | {row['sharpness']:.4g} | {row['rate_sharpness']:.3g}" if sharpness else ""),
              flush=True)
    ratios = [r["b_noise"] / r["b_simple"] for r in rows]
    print(f"median B_noise / B_simple over {len(rows)} points: {np.median(ratios):.2f} "
          f"(range {min(ratios):.2f} to {max(ratios):.2f})")
    if cfg.optimizer == "momentum":
        over = [r["over_optimum"] for r in rows]
        print(f"the run's step over the optimal step at {args.batch}: median "
              f"{np.median(over):.2f} (range {min(over):.2f} to {max(over):.2f}; above 2 a "
              f"step raises the quadratic model's loss)")
    if sharpness:
        products = [r["rate_sharpness"] for r in rows]
        print(f"rate x lambda_max at {args.batch}: median {np.median(products):.3g} (range "
              f"{min(products):.3g} to {max(products):.3g}; momentum {cfg.momentum} is stable "
              f"below {2 * (1 + cfg.momentum):.2f}, and linear scaling multiplies it by the "
              f"batch's factor)")
    return rows


if __name__ == "__main__":
    main()
