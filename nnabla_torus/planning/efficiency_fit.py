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
import os
from collections import namedtuple

import numpy as np

from ..files import atomic_open
from ..knobs import short_repr

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
    "task",      # the task fitted: {"model": ..., "data": ...} of priors.prior_key (task_of)
], defaults=[None, None])

# Factors outside this range say B_simple is off by orders of magnitude, not a task's factor
# (fits here: 1.51 on digits, 11.9 on clusters); beyond it the log's phi is digits, not sense.
FACTOR_RANGE = (1e-3, 1e3)
MAX_BATCH = 2 ** 31 - 1      # largest_batch: a global batch in samples, an MPI int
REWRITE = "write it again with `python tools/time_to_accuracy.py efficiency`"


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


def task_of(key):
    """The task of a batch prior's ``key`` (priors.prior_key): its model and data, without
    the rank count and machine, which change step times, not the images a target takes."""
    return {"model": dict(key["model"]), "data": dict(key["data"])}


def describe_task(task):
    """``resnet18 x0.125 16 px (17,632 parameters) on digits (1,437 images)`` of ``task``."""
    model, data = task["model"], task["data"]
    return (f"{model.get('arch')} x{model.get('width')} {model.get('image_size')} px "
            f"({model.get('parameters', 0):,} parameters) on {data.get('data')} "
            f"({data.get('images', 0):,} images)")


def check_task(scale, task, path):
    """ValueError naming both tasks unless ``scale`` (read from ``path``) was fitted on
    ``task`` (:func:`task_of` of the run's prior key)."""
    if scale.task != task:
        raise ValueError(f"efficiency fit {path!r} was fitted on {describe_task(scale.task)}, "
                         f"not this run's {describe_task(task)}; fit this task's fixed runs "
                         f"(`python tools/time_to_accuracy.py measure -C ... --fixed ...`, then "
                         f"`efficiency`) or leave --efficiency-fit empty")


def scale_of(fit, b_simple, b_simple_rse, largest_batch=None, task=None):
    """:class:`Scale` of ``fit`` over the noise scale ``b_simple`` measured on the same task
    (``task``, :func:`task_of`), with its relative standard error ``b_simple_rse``;
    ``largest_batch``: the largest batch
    of the runs fitted, beyond which the controller does not take the factor (the line is
    measured up to it, and the learning rate's stability is not in it: on clusters,
    emulated, a factor fitted up to 1024 moved one run to 2032 at step 28, whose linearly
    scaled rate of 1.59 diverged)."""
    if not b_simple > 0:
        raise ValueError(f"scale_of: b_simple = {b_simple} must be > 0 (an adaptive run's "
                         f"measured noise scale)")
    return Scale(fit.phi / b_simple, math.hypot(fit.rse, b_simple_rse), fit.phi, b_simple,
                 None if largest_batch is None else int(largest_batch), task)


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
    """Write ``scale`` as JSON (what ``--efficiency-fit`` reads), whole or not at all."""
    with atomic_open(path, "w") as f:
        json.dump(scale._asdict(), f, indent=1)


def load(path):
    """The :class:`Scale` :func:`save` wrote to ``path``; ValueError, one line naming the bad
    field, its value and the allowed range."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"efficiency fit {path!r} is unreadable ({e}); {REWRITE}") from None
    if not isinstance(saved, dict):
        raise ValueError(f"efficiency fit {path!r} holds a JSON {type(saved).__name__}, not an "
                         f"object of {', '.join(Scale._fields)}; {REWRITE}")
    low, high = FACTOR_RANGE
    number = _field(path, saved)
    scale = Scale(number("factor", lambda v: low <= v <= high, f"within {low:g}-{high:g}"),
                  number("rse", lambda v: v >= 0, ">= 0"), number("phi", lambda v: v > 0, "> 0"),
                  number("b_simple", lambda v: v > 0, "> 0"),
                  number("largest_batch", lambda v: v == int(v) and 1 <= v <= MAX_BATCH,
                         f"an integer 1-{MAX_BATCH}", missing_ok=True),
                  saved.get("task"))
    if not (isinstance(scale.task, dict) and isinstance(scale.task.get("model"), dict)
            and isinstance(scale.task.get("data"), dict)):
        raise ValueError(f"efficiency fit {path!r}: task = {short_repr(scale.task)} must name the "
                         f"model and data it was fitted on; {REWRITE}")
    return scale._replace(largest_batch=None if scale.largest_batch is None
                          else int(scale.largest_batch))


def _field(path, saved):
    """A reader of ``saved``'s numeric fields: finite, not a boolean, within ``allowed``."""
    def number(name, allowed, text, missing_ok=False):
        value = saved.get(name)
        if value is None and missing_ok:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and allowed(value)):
            raise ValueError(f"efficiency fit {path!r}: {name} = {short_repr(value)} must be a "
                             f"finite number {text}; {REWRITE}")
        return float(value)
    return number
