"""Statistical efficiency fitted to measured progress: the critical batch phi from the images
each batch needed to reach a target, its error, and the factor it puts on the noise scale
(numpy; batches and phi in samples).

McCandlish et al. (arXiv:1812.06162, section 2.3, eq. 2.11) relate the steps S and the
examples E a target takes at batch B by (S / S_min - 1)(E / E_min - 1) = 1; with S = E / B that
is E(B) = E_min (1 + B / B_crit): images to a target grow linearly in B, and Pollux's efficiency
E(B) = (phi + B0) / (phi + B) (goodput.py) is the same law with phi = B_crit. A straight line
images = a + b B through runs at two or more batches gives phi = a / b (:func:`fit_phi`),
with the error of a least-squares line (residual variance over n - 2 degrees of freedom, the
delta method for the ratio), so it shrinks as 1 / sqrt(runs). McCandlish et al. (section 3,
Fig. 4) measure B_crit this way and find it follows B_simple, the noise scale the controller
measures, up to a task-dependent factor: :func:`scale_of` fits that factor k = phi / B_simple,
and :func:`apply` puts it on the run's own B_simple, its error added to B_simple's so that a
decision (``goodput.decide``) moves only when the gain exceeds both. The error is counted in
1 / phi (:func:`low_end`): the line is linear in its slope, so a slope within its error of 0
(larger batches barely cost images) bounds phi from below instead of leaving it anywhere above 0.

AdaScale's gain ratio (Johnson et al., arXiv:2007.05105, section 3.1), r = (sigma^2 + mu^2) /
(sigma^2 / S + mu^2) at S times the base batch, estimated from the same two gradient norms as
B_simple (noise_scale.py), is S (B_simple + B0) / (B_simple + S B0) = goodput.gain at
phi = B_simple: it adds no information to what the controller already prices; a fitted phi does.

Example: fixed 64, 128 and 256 on the digits task reached 90 % after 5.7, 7.3 and 8.6 epochs
(25 seeds, docs/measurements/adaptive-batch.md); the adaptive runs measured B_simple ~ 233::

    >>> f = fit_phi([64, 128, 256], [5.7, 7.3, 8.6])
    >>> round(f.phi), round(f.rse, 2), round(scale_of(f, 233.0, 0.0).factor, 2)
    (351, 0.37, 1.51)
"""
import json
import math
from collections import namedtuple

import numpy as np

Fit = namedtuple("Fit", [
    "phi",       # B_crit = a / b of images = a + b B, samples (inf: larger batches cost nothing)
    "rse",       # relative standard error of phi and of 1 / phi (delta method; inf with fewer
                 # than 3 runs or 2 batches); the band is low_end's, phi / (1 +- rse)
    "runs",      # points fitted
    "batches",   # distinct batches among them
])

Scale = namedtuple("Scale", [
    "factor",    # k = fitted phi / B_simple measured on the task
    "rse",       # relative standard error of k: the fit's and B_simple's, in quadrature
    "phi",       # the fitted phi, samples
    "b_simple",  # the B_simple it is relative to, samples
    "largest_batch",   # the largest batch of the runs fitted, samples (None: not recorded)
], defaults=[None])


def fit_phi(batches, images, resolution=0.0):
    """Fit images to a target = a + b B over runs (one point per run, any unit of images, e.g.
    epochs); returns :class:`Fit` with phi = a / b and its relative standard error.

    ``resolution``: how finely a run's images are known (1 epoch when the target is seen at
    epoch-end validations); its rounding variance resolution^2 / 12 is the least residual
    variance, so seeds that agree to the epoch do not make the error 0. phi is inf when b <= 0
    up to rounding (a larger batch took no more images) and 0 when a <= 0 (images proportional
    to B: no batch saved steps).
    """
    b_, y = np.asarray(batches, float), np.asarray(images, float)
    n, distinct = len(b_), len(np.unique(b_))
    if distinct < 2:
        raise ValueError(f"fit_phi: runs at {distinct} distinct batch(es); the line needs two "
                         f"or more (add fixed runs at another batch)")
    x = np.column_stack([np.ones(n), b_])
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if b * b_.max() <= 1e-9 * np.abs(y).max():  # 0 up to rounding: equal images at every batch
        return Fit(math.inf, math.inf, n, distinct)
    if a <= 0:
        return Fit(0.0, math.inf, n, distinct)
    if n < 3:
        return Fit(float(a / b), math.inf, n, distinct)
    s2 = max(float(np.sum((y - x @ [a, b]) ** 2)) / (n - 2), resolution ** 2 / 12.0)
    (vaa, vab), (_, vbb) = s2 * np.linalg.inv(x.T @ x)
    var = vaa / a ** 2 + vbb / b ** 2 - 2.0 * vab / (a * b)     # of phi / phi, delta method
    return Fit(float(a / b), float(math.sqrt(max(var, 0.0))), n, distinct)


def scale_of(fit, b_simple, b_simple_rse, largest_batch=None):
    """:class:`Scale` of ``fit`` over the noise scale ``b_simple`` measured on the same task
    (with its relative standard error ``b_simple_rse``); ``largest_batch``: the largest batch
    of the runs fitted, beyond which the controller does not take the factor (the line is
    measured up to it, and the learning rate's stability is not in it: on clusters,
    emulated, a factor fitted up to 1024 moved one run to 2032 at step 28, whose linearly
    scaled rate of 1.59 diverged)."""
    if not b_simple > 0:
        raise ValueError(f"scale_of: b_simple = {b_simple} must be > 0 (an adaptive run's "
                         f"measured noise scale)")
    return Scale(fit.phi / b_simple, math.hypot(fit.rse, b_simple_rse), fit.phi, b_simple,
                 None if largest_batch is None else int(largest_batch))


def low_end(rse):
    """The relative error below phi of a fit with relative standard error ``rse``: 1 - 1 / (1 +
    rse), phi one error low being phi / (1 + rse). The least-squares line images = a + b B is
    linear in b, so its error is symmetric in b / a = 1 / phi, not in phi: a slope within its
    error of 0 (rse >= 1) still bounds phi from below, where phi x (1 - rse) would be 0. On
    clusters (one host, quarter-epoch validations) phi = 9,582 +- 122 % is at least 4,316.

    >>> round(low_end(1.22), 3), round(low_end(0.0), 3)
    (0.55, 0.0)
    """
    return rse / (1.0 + rse) if math.isfinite(rse) else 1.0


def apply(scale, phi, rse):
    """(phi, rse) to decide with: the run's ``phi`` (B_simple, or a prior's) times the fitted
    factor, its relative error ``rse`` and the factor's low end (:func:`low_end`) in quadrature;
    unchanged without one. (The controller decides at phi x (1 - rse).)"""
    if scale is None:
        return phi, rse
    return phi * scale.factor, math.hypot(rse, low_end(scale.rse))


def describe(scale):
    """One line for the log: the factor, its error and where it comes from."""
    return (f"phi = {scale.factor:.2f} +- {scale.rse:.0%} x B_simple (fitted phi "
            f"{scale.phi:.0f} over a measured B_simple of {scale.b_simple:.0f}"
            + (f", runs up to batch {scale.largest_batch}" if scale.largest_batch else "") + ")")


def save(scale, path):
    """Write ``scale`` as JSON (what ``--efficiency-fit`` reads)."""
    with open(path, "w") as f:
        json.dump(scale._asdict(), f, indent=1)


def load(path):
    """The :class:`Scale` :func:`save` wrote to ``path``; ValueError naming what is wrong."""
    try:
        with open(path) as f:
            saved = json.load(f)
        largest = saved.get("largest_batch")     # absent in files written before it
        scale = Scale(*(float(saved[k]) for k in Scale._fields[:4]),
                      None if largest is None else int(largest))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"efficiency fit {path!r} is unreadable ({e}); write it with "
                         f"`python tools/time_to_accuracy.py efficiency`") from e
    if not (scale.factor > 0 and math.isfinite(scale.factor) and scale.rse >= 0
            and (scale.largest_batch is None or scale.largest_batch >= 1)):
        raise ValueError(f"efficiency fit {path!r}: factor {scale.factor} must be finite and "
                         f"> 0, rse {scale.rse} >= 0 and largest_batch "
                         f"{scale.largest_batch} >= 1")
    return scale
