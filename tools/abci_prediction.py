"""ImageNet/ResNet-50 on the abci profile by prediction: Sony's 34K -> 68K against goodput.

Time from the cost model (planner); progress from the statistical efficiency
E(B) = (phi + B0)/(phi + B) with the noise scale phi over training taken from a real run (an
adaptive run's ``noise_scale.series.txt``, as a function of the fraction of training done)
times a factor (*assumed*: no ImageNet noise scale was measured here). Sony's schedule
(1,088 then 2,176 GPUs at 32 images each, 90 epochs, *assumed*) sets the progress to reach;
the goodput policy (at most 2,176 GPUs, batches from 34,816) reaches the same progress
choosing GPUs, grid and batch at each point by goodput, with the planner's hysteresis (a
change only when the gain exceeds the model error) and a restart cost per GPU-count change.
The model's optimum (the highest goodput at every point, no hysteresis, free restarts) bounds
what any schedule of batch and GPU count can gain over Sony's under the same model.
Run through ``python tools/time_to_accuracy.py abci``. Example::

    r = predict_abci(noise_curve("runs/tta/adaptive-goodput-s1", 20), 544.0,
                     load_profile("abci"), restart_s=30.0)
    r["fixed_s"], r["goodput_s"]
"""
import json
import os

import numpy as np

from nnabla_torus.files import atomic_open, atomic_path
from nnabla_torus.launching import elastic
from nnabla_torus.planning import goodput, planner, published
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.schedules import BatchSchedule
from accuracy_report import read_series

SONY_SCHEDULE, SONY_LOCAL, SONY_EPOCHS = "0:34816,5:69632", 32, 90.0
IMAGENET = planner.IMAGENET_TRAIN_IMAGES


def noise_curve(run_dir, skip):
    """(fraction of training, phi) of a run: its noise_scale series against its image count,
    without the first ``skip`` estimates (those the confidence rule would not act on)."""
    noise = read_series(run_dir, "noise_scale")[skip:]
    batch = read_series(run_dir, "global_batch")
    if not len(noise):
        raise ValueError(f"{run_dir} has no noise_scale.series.txt: give an --adaptive-batch "
                         f"run's output directory (--noise-run)")
    images = dict(zip(batch[:, 0].astype(int), np.cumsum(batch[:, 1])))
    done = np.array([images[int(s)] for s in noise[:, 0]]) / np.cumsum(batch[:, 1])[-1]
    return done, noise[:, 1]


def published_curve(points=400):
    """(fraction of training, phi) of the published ResNet-50 prior (planning/published.py:
    phi = the batch Sony's run used at that point, 34,816 then 69,632 from epoch 5)."""
    done = np.linspace(0.0, 1.0, points)
    return done, published.noise_scale_prior("resnet50", SONY_EPOCHS)(done)[0]


class Candidates:
    """Every (GPU count, grid, algorithm, per-GPU batch, accumulation) on the profile, with
    throughput scored once; goodput for a phi is then one vectorised product."""

    def __init__(self, prof, max_gpus, base_batch):
        result = planner.plan(prof, "resnet50", max_gpus=max_gpus, b_noise=1.0,
                              base_batch=base_batch, accum_steps=(1, 2, 4, 8),
                              beyond_profile=False)
        cols = result.candidates
        keep = cols["global_batch"] >= base_batch           # B0 is the smallest batch
        self.cols = {k: v[keep] for k, v in cols.items()}
        self.base_batch = base_batch

    def best(self, phi, current, model_error):
        """(index, Decision) of the goodput choice from ``current`` (index or None)."""
        c = self.cols
        d = goodput.decide(c["global_batch"], c["images_per_s"], phi, 0.0, self.base_batch,
                           current if current is not None else 0, model_error)
        if current is None or d.change:
            return d.best, d
        return current, d


def sony_run(phi_at, prof, steps):
    """(seconds, progress in images at B0's efficiency, path, phases) of Sony's schedule.

    The path is indexed by the fraction of its own progress: two passes, the second with the
    first's total."""
    sony = BatchSchedule.parse(SONY_SCHEDULE)
    phases = planner.plan_schedule(prof, "resnet50", sony, SONY_LOCAL, dataset_size=IMAGENET,
                                   epochs=SONY_EPOCHS)
    b0, images, total = sony.batch(0), IMAGENET * SONY_EPOCHS / steps, None
    for _ in range(2):
        progress, seconds, path = 0.0, 0.0, []
        for e in np.linspace(0, SONY_EPOCHS, steps, endpoint=False):
            plan = [p for s, p in phases if s <= e][-1]
            f = progress / total if total else e / SONY_EPOCHS
            progress += images * float(goodput.efficiency(plan.global_batch, phi_at(f), b0))
            seconds += images / plan.images_per_s
            path.append((f, plan.gpus, plan.global_batch, phi_at(f)))
        total = progress
    return seconds, total, path, phases


def goodput_run(phi_at, cand, total, error, steps):
    """(seconds of training, GPU-count changes, path) of the goodput policy to ``total``."""
    current, seconds, restarts, path = None, 0.0, 0, []
    for f in np.linspace(0, 1, steps, endpoint=False):
        phi = phi_at(f)
        index, _ = cand.best(phi, current, error)
        if current is not None and cand.cols["gpus"][index] != cand.cols["gpus"][current]:
            restarts += 1
        current = index
        batch = cand.cols["global_batch"][index]
        rate = cand.cols["images_per_s"][index] * float(
            goodput.efficiency(batch, phi, cand.base_batch))
        seconds += total / steps / rate
        path.append((f, int(cand.cols["gpus"][index]), int(batch), phi))
    return seconds, restarts, path


def predict_abci(curve, factor, prof, restart_s, steps=400):
    """Seconds (and the trajectories) of Sony's schedule and of the goodput policy, with the
    run's noise-scale ``curve`` (fraction of training, phi) times ``factor``."""
    done, phi_run = curve

    def phi_at(fraction):
        return float(np.interp(fraction, done, phi_run)) * factor

    fixed_s, total, fixed_path, phases = sony_run(phi_at, prof, steps)
    cand = Candidates(prof, phases[-1][1].gpus, phases[0][1].global_batch)
    seconds, restarts, path = goodput_run(phi_at, cand, total, goodput.model_error_of(prof),
                                          steps)
    # The model's optimum: the highest goodput at every point, with no hysteresis and free
    # restarts. Time to the same progress is the integral of 1/goodput over progress, so this
    # pointwise choice is the fastest of every schedule of batch (>= B0) and GPU count.
    optimum_s, _, _ = goodput_run(phi_at, cand, total, 0.0, steps)
    return {"factor": factor, "fixed_s": fixed_s, "fixed_restart_s": restart_s * (len(phases) - 1),
            "goodput_s": seconds + restarts * restart_s, "optimum_s": optimum_s,
            "base_batch": int(cand.base_batch),
            "restarts": restarts, "fixed_path": fixed_path, "goodput_path": path,
            "epochs_equivalent": total / IMAGENET}


def abci(args):
    """Predict, write abci.md, abci.json and abci_batch_over_training.png into ``args.out``
    (args: profile, noise_run, skip_samples, restart_cost, noise_scale_factor)."""
    prof = load_profile(args.profile)
    prior = args.noise_run == "published"
    curve = published_curve() if prior else noise_curve(args.noise_run, args.skip_samples)
    restart_s = elastic.restart_cost(prof, args.restart_cost)
    factors = [(1.0 if prior else args.noise_scale_factor) * m for m in (0.25, 1.0, 4.0)]
    results = [predict_abci(curve, k, prof, restart_s) for k in factors]
    shape = ("the published prior: " + published.describe("resnet50") if prior else
             f"noise-scale shape from {args.noise_run}")
    lines = [f"ImageNet/ResNet-50 on {prof.name} (predicted; {shape}, restart {restart_s:g} s "
             f"per GPU-count change)",
             "| noise scale x | phi over training | Sony 34K->68K (1,088->2,176 GPUs) | goodput "
             "(<= 2,176 GPUs), restarts included | the model's optimum (any schedule) | "
             "goodput's batches | GPU counts | restarts |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        batches = sorted({p[2] for p in r["goodput_path"]})
        gpus = sorted({p[1] for p in r["goodput_path"]})
        phis = [p[3] for p in r["goodput_path"]]
        lines.append(f"| {r['factor']:g} | {min(phis):,.0f}-{max(phis):,.0f} | "
                     f"{r['fixed_s']:.0f} s (+{r['fixed_restart_s']:.0f} s if relaunched at "
                     f"epoch 5) | {r['goodput_s']:.0f} s "
                     f"({r['fixed_s'] / r['goodput_s']:.2f}x) | {r['optimum_s']:.0f} s "
                     f"({r['fixed_s'] / r['optimum_s']:.2f}x) | {batches[0]:,}-{batches[-1]:,} | "
                     f"{gpus[0]:,}-{gpus[-1]:,} | {r['restarts']} |")
    gains = [r["fixed_s"] / r["goodput_s"] for r in results]
    bounds = [r["fixed_s"] / r["optimum_s"] for r in results]
    behind = max(r["goodput_s"] / r["optimum_s"] - 1.0 for r in results)
    lines.append(f"\ngoodput against Sony's schedule: {min(gains):.2f}-{max(gains):.2f}x "
                 f"(> 1: faster) over noise-scale factors {factors[0]:g}-{factors[-1]:g}; the "
                 f"model's optimum (any schedule of batch >= {results[0]['base_batch']:,} and "
                 f"GPU count <= 2,176, changes free) is {min(bounds):.2f}-{max(bounds):.2f}x, "
                 f"goodput at most {behind:.1%} behind it")
    text = "\n".join(lines)
    plot_abci(results[1], os.path.join(args.out, "abci_batch_over_training.png"))
    os.makedirs(args.out, exist_ok=True)
    with atomic_open(os.path.join(args.out, "abci.md"), "w") as f:
        f.write(text + "\n")
    with atomic_open(os.path.join(args.out, "abci.json"), "w") as f:
        json.dump(results, f)
    print(text)
    print(f"wrote {args.out}/abci.md, abci.json, abci_batch_over_training.png")


def plot_abci(result, path):
    """Global batch over training progress of both policies, and the noise scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, key in (("Sony 34K->68K", "fixed_path"), ("goodput", "goodput_path")):
        p = np.array(result[key], float)
        ax.step(p[:, 0], p[:, 2], where="post", label=f"{name}: global batch")
    p = np.array(result["goodput_path"], float)
    ax.plot(p[:, 0], p[:, 3], ":", label="noise scale phi (scaled digits run)")
    ax.set(xlabel="fraction of training progress", ylabel="images", yscale="log",
           title=f"abci, ResNet-50 (predicted), noise scale x {result['factor']:.0f}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=90)
    plt.close(fig)
