"""Goodput: predicted training progress per second, the one objective of the batch-size
controller, the planner and the elastic launcher (numpy, broadcasting; batches in samples per
optimizer step, throughput in samples/s).

Pollux (Qiao et al., OSDI'21, arXiv:2008.12260, section 3.1) with McCandlish et al.'s noise
scale phi = B_simple (arXiv:1812.06162, section 2.2)::

    E(B)       = (phi + B0) / (phi + B)        statistical efficiency, 1 at the run's minimum B0
    gain(B)    = (B / B0) E(B)                 B0-steps one step at B is worth (the lr factor)
    goodput(B) = throughput(B) x E(B)          samples/s of progress counted at B0

A change is made only when the predicted gain exceeds the prediction's relative error
(:func:`decide`, never below ``MIN_GAIN``). Derivations, the learning-rate rule and the
hysteresis are in docs/adaptive-batch.md. Example: on this machine 128 buys 14 % throughput
over 64, and with phi = 300 E(128) = 0.85 makes it a loss::

    >>> d = decide([64, 128], [390.0, 444.0], 300.0, 0.2, 64, current=0, model_error=0.14)
    >>> int(d.best), d.change, round(float(efficiency(128, 300.0, 64)), 3)
    (0, False, 0.85)
"""
from collections import namedtuple

import numpy as np

MIN_GAIN = 0.05   # smallest predicted gain that changes anything (AdaptDL issue #27: 5 %)

Confidence = namedtuple("Confidence", [
    "ok",        # True: the estimate may drive decisions
    "samples",   # noise-scale observations so far
    "rse",       # relative standard error of phi (inf when unknown)
    "reason",    # one line: why (not) yet
])

Decision = namedtuple("Decision", [
    "best",        # index of the candidate with the highest goodput at phi x (1 - rse)
    "gain",        # predicted goodput(best) / goodput(current)
    "threshold",   # relative error of that prediction: change only when gain - 1 exceeds it
    "change",      # True: move to ``best``
    "goodput",     # goodput of every candidate, samples/s at B0
])


def efficiency(batch, phi, base_batch):
    """Pollux statistical efficiency (phi + B0) / (phi + max(B, B0)), in (0, 1]; 1 without phi.

    >>> float(efficiency(2744, 1000.0, 256)) == 1256 / 3744
    True
    """
    batch = np.asarray(batch, float)
    if phi is None:
        return np.ones_like(batch)
    return (phi + base_batch) / (phi + np.maximum(batch, base_batch))


def gain(batch, phi, base_batch):
    """Steps at B0 one step at B is worth: (B / B0) E(B), in [1, B/B0]; the LR multiplier.

    Without phi (not yet measured) the linear-scaling limit B / B0.
    """
    batch = np.maximum(np.asarray(batch, float), base_batch)
    return batch / base_batch * efficiency(batch, phi, base_batch)


def goodput(throughput, batch, phi, base_batch):
    """throughput x E(B): samples per second of progress at the reference batch B0."""
    return np.asarray(throughput, float) * efficiency(batch, phi, base_batch)


def prediction_error(batch, current, phi, phi_rse, model_error):
    """Relative error of goodput(batch) / goodput(current): throughput and efficiency parts.

    ``model_error``: the throughput's relative error (the step-time refit's residual error,
    step_refit.py, or before it the cost model's calibrated median step-time error);
    ``phi_rse``: relative standard error of phi. The efficiency part is exact, not linearised:
    E(batch)/E(current) at phi over the same ratio at the pessimistic end of phi's one-error
    band (phi x (1 - rse) for a larger batch, x (1 + rse) for a smaller one), so a change must
    pay even there, at any rse. Compounded with the throughput's error, not in quadrature: the
    throughput errors of two batches need not cancel. Never below ``MIN_GAIN``.
    """
    batch, current = np.asarray(batch, float), np.asarray(current, float)
    larger = batch > current
    pessimistic = phi * np.where(larger, np.maximum(0.0, 1.0 - phi_rse), 1.0 + phi_rse)
    ratio = (phi + current) / (phi + batch)
    eff = ratio / ((pessimistic + current) / (pessimistic + batch)) - 1.0
    return np.maximum(MIN_GAIN, (1.0 + model_error) * (1.0 + np.abs(eff)) - 1.0)


def decide(batches, throughput, phi, phi_rse, base_batch, current, model_error):
    """Decision over candidate ``batches`` with predicted ``throughput`` (arrays, one per batch).

    ``best`` is the batch with the highest goodput at the low end of phi's one-error band,
    phi x (1 - rse), and of its throughput's, / (1 + model_error) (the smallest among equal
    ones): the batch that is best even if phi is one error lower than estimated, where a
    larger batch loses the most, and its throughput one error lower. ``current``: index of the
    batch in use; a move to ``best`` must gain more than its :func:`prediction_error` at phi
    (hysteresis: inside the error, keep). ``model_error``: one relative error, or one per
    candidate (the throughput of a batch never run is known less well than that of one
    measured: of two batches predicted alike, the measured one is best). With rse = 0 and
    one error this is the highest goodput at phi.
    """
    batches = np.asarray(batches, float)
    error = np.broadcast_to(np.asarray(model_error, float), batches.shape)
    g = goodput(throughput, batches, phi, base_batch)
    low = goodput(throughput, batches, phi * max(0.0, 1.0 - phi_rse), base_batch) / (1.0 + error)
    top = low >= low.max() * (1.0 - 1e-12)       # equal up to rounding: take the smallest batch
    best = int(np.flatnonzero(top)[np.argmin(batches[top])])
    threshold = float(prediction_error(batches[best], batches[current], phi, phi_rse, error[best]))
    gain = float(g[best] / g[current])
    return Decision(best, gain, threshold, best != current and gain - 1.0 > threshold, g)


Wait = namedtuple("Wait", [
    "pays",       # True: measure another step before the first decision
    "waited_s",   # progress lost so far by measuring at the batch in use, seconds
    "risk_s",     # progress a decision now is expected to lose over the rest of the run, seconds
    "regret",     # expected share of goodput lost by a decision now (phi's error)
])


def waiting(batches, throughput, phi, phi_rse, base_batch, current, samples, images_left):
    """Whether the first decision should wait for another noise-scale sample, priced by the
    run's length (explore, then commit: the two costs are balanced).

    A decision now takes ``decide``'s choice c (at phi x (1 - rse)). Its expected regret is the
    goodput share c loses against the best batch when phi is one error either side, phi x (1 -
    rse) or phi x (1 + rse) (the mean of the two), paid over the rest of the run:
    ``risk_s = regret x images_left / throughput(c)``. Measuring has cost ``samples`` steps at the
    batch in use, each (1 - goodput(current) / goodput(c)) of a step behind c at phi:
    ``waited_s``. Wait while ``waited_s < risk_s``. With regret ~ rse^2 ~ 1/samples, this is
    the explore-then-commit optimum (samples ~ sqrt(run length)): a 55-step run decides after a
    few steps, a 3,000-step run waits until phi's error is small.

    Example: the emulated cluster's measured step times, phi = 150 +- 30 % after 7 samples;
    the 12-epoch digits run (15,552 images left) decides, one 12 times longer waits::

    >>> batches = np.arange(64, 1025, 8.0)
    >>> speed = batches / (0.34 + 0.00088 * batches)           # samples/s
    >>> [waiting(batches, speed, 150.0, 0.3, 64, 0, 7, left).pays for left in (15552, 190000)]
    [False, True]
    """
    batches, speed = np.asarray(batches, float), np.asarray(throughput, float)
    choice = decide(batches, speed, phi, phi_rse, base_batch, current, MIN_GAIN).best
    regret = 0.0
    for truth in (phi * max(0.0, 1.0 - phi_rse), phi * (1.0 + phi_rse)):
        g = goodput(speed, batches, truth, base_batch)
        regret += 0.5 * (1.0 - g[choice] / g.max())
    g = goodput(speed, batches, phi, base_batch)
    waited = samples * batches[current] / speed[current] * max(0.0, 1.0 - g[current] / g[choice])
    risk = regret * images_left / speed[choice]
    return Wait(bool(waited < risk), float(waited), float(risk), float(regret))


def confidence(samples, rse, min_samples, max_rse):
    """The confidence rule: act on phi only after ``min_samples`` observations and when its
    relative standard error is at most ``max_rse``."""
    if samples < min_samples:
        return Confidence(False, samples, rse, f"{samples} noise-scale samples < {min_samples}")
    if not rse <= max_rse:                       # also catches NaN
        return Confidence(False, samples, rse, f"noise-scale relative error {rse:.2f} > "
                                               f"{max_rse:g} after {samples} samples")
    return Confidence(True, samples, rse, f"{samples} samples, relative error {rse:.2f} "
                                          f"<= {max_rse:g}")


def model_error_of(prof, default=MIN_GAIN):
    """The cost model's measured relative error for profile ``prof``: its calibration's
    ``model_error`` (the shipped GPU profiles: the largest error on the published runs they are
    fitted to, planning/fidelity.py), else its median step-time error (``step_mdape``,
    tools/calibrate.py), else ``default``."""
    calibration = (prof.extra or {}).get("calibration") or {}
    return float(calibration.get("model_error", calibration.get("step_mdape", default)))
