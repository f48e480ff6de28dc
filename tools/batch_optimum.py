"""The model's best batch schedule for a run that was measured: how much any batch-size policy
could gain over a fixed batch, under the goodput model, from an earlier run's prior (its noise
scale over training and its measured step times, ``batch_prior.json``).

Progress is counted in B0-samples (goodput.py): a step at batch B makes B x E(B) of it, with
E(B) = (phi + B0) / (phi + B). The time to a given progress is the integral of 1 / goodput
over progress, so the batch with the highest goodput at every point is the fastest of all
schedules (changes free and instant); a fixed batch B takes the same integral at B. phi is
read from the prior at the fraction of progress made (the earlier run's fraction of its
images: an approximation when that run changed its batch). Throughput is the prior's step-time
refit (``step_refit.py``) at the split a fixed run gives each global batch. Run through
``python tools/time_to_accuracy.py optimum --prior FILE``. Example::

    rows = schedule_times(json.load(open("runs/x/batch_prior.json")), base_batch=64,
                          run_images=12 * 1438, local_batch=32, fractions=(0.5, 0.75))
"""
import numpy as np

from nnabla_torus.planning import goodput
from nnabla_torus.planning.splits import split_batch
from nnabla_torus.planning.step_refit import StepTimeRefit, throughput

POINTS = 2000                   # integration points over progress


def candidates(step_times, local_batch, base_batch, max_batch):
    """(global batches, their throughput in samples/s) from an earlier run's
    ``StepTimeRefit.state()``: every batch from ``base_batch`` to ``max_batch`` the ranks
    realise, split as a fixed run splits it (``split_batch``: the fewest accumulation steps
    with at most ``local_batch`` per rank; under the refit's line, a + b m with a > 0, also the
    fastest split, so the controller's choice of split gains nothing under the model)."""
    refit = StepTimeRefit(step_times["ranks"], min_steps=1, warmup_steps=0)
    refit.load_prior(step_times)
    fit = refit.fit()
    splits = {}
    for per_rank in range(-(-base_batch // fit.ranks), max_batch // fit.ranks + 1):
        local, accum = split_batch(per_rank * fit.ranks, fit.ranks, local_batch)
        splits.setdefault(fit.ranks * local * accum, (local, accum))
    batches = np.array(sorted(b for b in splits if base_batch <= b <= max_batch), float)
    return batches, np.array([float(throughput(fit, *splits[int(b)])) for b in batches])


def schedule_times(saved, base_batch, run_images, local_batch, fractions, max_batch=1024):
    """Model seconds to the progress fixed ``base_batch`` makes in each of ``fractions`` of the
    run: {"fixed B": [s, ...]} for every candidate batch, and "optimum" (the pointwise best)."""
    fraction, phi = np.array(saved["noise_scale"], float)[:, :2].T
    batches, speed = candidates(saved["step_times"], local_batch, base_batch, max_batch)
    times = {}
    for target in fractions:
        progress = np.linspace(0.0, target, POINTS)
        phis = np.interp(progress, fraction, phi)[:, None]
        rate = speed * goodput.efficiency(batches, phis, base_batch)   # B0-samples/s
        seconds = (target * run_images / POINTS) / rate
        for batch, s in zip(batches, seconds.sum(axis=0)):
            times.setdefault(f"fixed {int(batch)}", []).append(float(s))
        times.setdefault("optimum", []).append(float((1.0 / rate.max(axis=1)).sum()
                                                     * target * run_images / POINTS))
    return times


def describe(times, fractions, shown=(64, 128, 176, 256, 384, 512)):
    """Markdown lines: the optimum, the best fixed batch and ``shown`` batches, in model s."""
    fixed = {k: v for k, v in times.items() if k != "optimum"}
    best = min(fixed, key=lambda k: fixed[k][-1])
    names = ["optimum", best] + [f"fixed {b}" for b in shown if f"fixed {b}" in fixed
                                 and f"fixed {b}" != best]
    head = " | ".join(f"to {f:.0%} of the run's B0-progress" for f in fractions)
    lines = [f"| schedule | {head} |", "| --- |" + " --- |" * len(fractions)]
    for name in names:
        label = name + (" (best fixed)" if name == best else "")
        cells = " | ".join(f"{s:.1f} s ({s / times['optimum'][i]:.3f}x)"
                           for i, s in enumerate(times[name]))
        lines.append(f"| {label} | {cells} |")
    return lines
