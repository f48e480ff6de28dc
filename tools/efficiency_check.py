"""The efficiency model checked against fixed-batch runs of a task: at each fixed batch, the
statistical efficiency its measured epochs to the target imply, against what each model
predicts (``python tools/time_to_accuracy.py efficiency``; no launching here).

Efficiency is counted from the smallest fixed batch B_s: measured E(B) = epochs(B_s) /
epochs(B) (means over seeds, half a validation interval off each, accuracy_report.fixed_epochs),
with its standard error (at least the rounding to the validation interval, :func:`resolution`).
The models, each
E(B) = (phi + B_s) / (phi + B) (goodput.py):

1. phi = B_simple, the noise scale the adaptive runs measured up to the target (the median of
   their medians): what the controller uses by default;
2. phi fitted to the other fixed batches (efficiency_fit.fit_phi without the batch predicted,
   leave one batch out): a prediction, not an echo of the point it is scored on;
3. phi fitted to all of them: what ``--efficiency-fit`` hands the controller (as a factor on
   B_simple, written to efficiency_fit.json); its residual, not a prediction.

The bands are E at phi / (1 +- rse) (the fit's error is symmetric in 1 / phi). Example::

    rows, fit, scale = check(records)
    print(table(rows, 0.9, fit, scale))
"""
import math
import statistics

import accuracy_report as rep
from nnabla_torus.planning import efficiency_fit, goodput


def resolution(records):
    """Epochs to which the fixed runs' epochs to the target are known (efficiency_fit.fit_phi's
    resolution): their longest validation interval up to the target (1 at train.py's default
    of a validation at each epoch's end, 0.25 with --val-every 0.25)."""
    return max((rep.val_interval(r) for r in records
                if r["policy"] not in rep.ADAPTIVES and r["epoch"] is not None), default=1.0)


def _band(phi, rse, batch, base):
    """(E at phi, (E at phi / (1 + rse), E at phi / (1 - rse))) relative to ``base`` (the fit's
    band, symmetric in 1 / phi: efficiency_fit.low_end); Nones without phi."""
    if phi is None:
        return None, (None, None)

    def at(p):
        return float(goodput.efficiency(batch, p, base)) if math.isfinite(p) else 1.0
    high = phi / (1.0 - rse) if rse < 1.0 else math.inf
    return at(phi), (at(phi * (1.0 - efficiency_fit.low_end(rse))), at(high))


def check(records):
    """(rows, fit of all, Scale or None) of ``records``: one row per fixed batch every run of
    which reached the target (see module doc); the Scale needs adaptive runs' B_simple."""
    reached = {b: e for b, e in rep.fixed_epochs(records).items() if e and None not in e}
    if len(reached) < 2:
        raise ValueError(f"efficiency check: fixed runs that all reached the target at "
                         f"{len(reached)} batch(es); it needs two or more (measure "
                         f"--policies fixed-64,fixed-128,fixed-256)")
    points = [(b, e) for b, runs in reached.items() for e in runs]
    step = resolution(records)
    fit = efficiency_fit.fit_phi(*zip(*points), resolution=step)
    measured = rep.measured_b_simple(records)
    b_simple = statistics.median(measured) if measured else None
    base = min(reached)
    mean = {b: statistics.mean(e) for b, e in reached.items()}
    se = {b: max(statistics.stdev(e) if len(e) > 1 else math.inf, step / math.sqrt(12))
          / math.sqrt(len(e)) for b, e in reached.items()}
    rows = []
    for batch in sorted(reached):
        others = [(b, e) for b, e in points if b != batch]
        loo = (efficiency_fit.fit_phi(*zip(*others), resolution=step)
               if len({b for b, _ in others}) >= 2 else None)
        eff = mean[base] / mean[batch]
        rel = 0.0 if batch == base else math.hypot(se[base] / mean[base], se[batch] / mean[batch])
        loo_e, loo_band = _band(loo and loo.phi, loo.rse if loo else 0.0, batch, base)
        rows.append(dict(batch=batch, runs=len(reached[batch]), epochs=mean[batch],
                        se=se[batch], measured=eff, measured_se=eff * rel,
                        b_simple=_band(b_simple, 0.0, batch, base)[0],
                        loo=loo_e, loo_band=loo_band, loo_phi=loo and loo.phi,
                        fit=_band(fit.phi, 0.0, batch, base)[0]))
    scale = (efficiency_fit.scale_of(fit, b_simple, _median_rse(measured), max(reached))
             if b_simple else None)
    return rows, fit, scale


def _median_rse(values):
    """Relative standard error of the median of ``values``: 1.2533 sigma / sqrt(n) (the
    normal approximation), relative to the median; inf for fewer than two."""
    if len(values) < 2:
        return math.inf
    return 1.2533 * statistics.stdev(values) / math.sqrt(len(values)) / statistics.median(values)


def mean_error(rows, key):
    """Mean |predicted - measured| efficiency of model ``key`` over the batches above the
    smallest (where E = 1 by definition); None when it predicts none of them."""
    errors = [abs(r[key] - r["measured"]) for r in rows[1:] if r[key] is not None]
    return statistics.mean(errors) if errors else None


def table(rows, target, fit, scale):
    """Markdown table of :func:`check`'s rows, and the lines under it."""
    base = rows[0]["batch"]
    head = (f"| fixed batch | runs | epochs to {target:.0%}, mean +- se | measured E vs "
            f"{base} | E at phi = B_simple | E at phi fitted to the other batches "
            f"[band] (phi) | E at phi fitted to all |\n| --- | --- | --- | --- | --- | --- | "
            f"--- |")
    lines = [head]
    for r in rows:
        band = ("" if r["loo"] is None else
                f"[{rep.fmt(r['loo_band'][0], 3)}-{rep.fmt(r['loo_band'][1], 3)}] "
                f"({rep.fmt(r['loo_phi'], 0)})")
        lines.append(f"| {r['batch']} | {r['runs']} | {r['epochs']:.2f} +- "
                     f"{rep.fmt(r['se'], 2)} | {r['measured']:.3f} +- "
                     f"{rep.fmt(r['measured_se'], 3)} | {rep.fmt(r['b_simple'], 3)} | "
                     f"{rep.fmt(r['loo'], 3)} {band} | {r['fit']:.3f} |")
    errors = {name: mean_error(rows, key) for name, key in
              (("phi = B_simple", "b_simple"), ("phi fitted to the other batches", "loo"),
               ("phi fitted to all (in-sample)", "fit"))}
    lines.append("")
    lines.append("mean |predicted - measured| E above " + str(base) + ": " + ", ".join(
        f"{name} {rep.fmt(e, 3)}" for name, e in errors.items()))
    lines.append(f"fitted phi {rep.fmt(fit.phi, 0)} +- {rep.fmt(fit.rse * 100, 0)} % over "
                 f"{fit.runs} runs at {fit.batches} batches"
                 + (f"; {efficiency_fit.describe(scale)}" if scale else
                    "; no adaptive run measured B_simple, so no factor"))
    return "\n".join(lines)
