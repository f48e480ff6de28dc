"""Batch-size priors: what an earlier run of the same model and data measured, or a published
figure, so that the controller's first decision is made before the run has measured: at step
0, or where an earlier run's estimate was first trusted.

A prior holds the noise scale over training (fraction of training -> phi and its relative
error) and, from an earlier run, its step times (``StepTimeRefit.state()``). An adaptive run
writes one at its end beside auto's cached table (``NNABLA_TORUS_CACHE_DIR``, default
``~/.cache/nnabla_torus``), one JSON file per key; the key is the model, the data, the rank count
and the machine (profile and host layout), so a run with another of any of them never reuses it.
``--batch-prior`` chooses (``choose``): ``auto`` (that file, else the published figures of
:mod:`~nnabla_torus.planning.published` for the model, else none), ``none``, or a file's path
(used only when its key matches). The controller decides on the prior until its own estimate
passes the confidence rule, then on the measurement, and logs both moments. An earlier run's
prior holds from its first trusted point on (``Prior.starts``): before it, that run was still
measuring at B0, so the prior says nothing there and the run measures as one without a prior
(carried back to step 0, the phi of that point made the emulated cluster's runs start at 128
and need more epochs: docs/measurements/adaptive-batch.md, "Where a prior starts").
Example::

    key = prior_key({"arch": "resnet18", "width": 0.125, "image_size": 16, "parameters": 17632},
                    {"data": "digits", "images": 1437}, ranks=4, machine="cpu-2core 1x4")
    prior, line = choose("auto", "~/.cache/nnabla_torus", key, "resnet18", epochs=12,
                         data="digits")
    ...  # at the end of the run:
    save("~/.cache/nnabla_torus", key, series, refit.state(), "runs/digits")
"""
import hashlib
import json
import os
import time
from collections import namedtuple

import numpy as np

from ..files import atomic_open
from . import published, step_refit

Prior = namedtuple("Prior", [
    "kind",        # "earlier run" or "published"
    "where",       # the file, or the publication
    "phi_at",      # fraction of training (array) -> (phi, relative error) arrays
    "step_times",  # an earlier run's StepTimeRefit.state(), or None
    "starts",      # fraction of training from which phi_at holds: an earlier run's first
                   # trusted point (before it that run was measuring at B0), 0 if published
], defaults=[0.0])

KEEP_POINTS = 200      # noise-scale points written (evenly over the run)
MAX_PRIOR_RSE = 0.5    # estimates of the earlier run with a larger error are not used
                       # (the controller's MAX_RSE: what the run itself would not act on)


def prior_key(model, data, ranks, machine):
    """The dict a stored prior must match: ``model`` and ``data`` dicts (names, sizes),
    the rank count and the machine (profile name and host layout)."""
    return {"model": dict(model), "data": dict(data), "ranks": int(ranks), "machine": str(machine)}


def prior_path(folder, key):
    """The file of ``key`` under ``folder``: batch-prior-<hash of the key>.json."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser(folder), f"batch-prior-{digest}.json")


def _thinned(points):
    """At most KEEP_POINTS of ``points``, evenly over them."""
    if len(points) <= KEEP_POINTS:
        return points
    return [points[i] for i in np.linspace(0, len(points) - 1, KEEP_POINTS).astype(int)]


def trusted_points(series):
    """The points of ``series`` [(fraction of training, phi, rse)] a prior keeps: finite, with
    an error the controller would act on, in order of fraction, at most KEEP_POINTS (also what
    a checkpoint keeps, so that a resumed run leaves the whole run's prior)."""
    return _thinned(sorted(([float(f), float(p), float(r)] for f, p, r in series
                            if p is not None and np.isfinite(p) and np.isfinite(r)
                            and r <= MAX_PRIOR_RSE), key=lambda p: p[0]))


def _stored(path, key):
    """(points, step_times) already stored at ``path`` for ``key``; ([], None) when there is
    no such file, it cannot be read, or it is another key's."""
    try:
        with open(path) as f:
            saved = json.load(f)
        if saved["key"] != key:
            return [], None
        return [[float(v) for v in p] for p in saved["noise_scale"]], saved.get("step_times")
    except (OSError, ValueError, KeyError, TypeError):
        return [], None


def merged(stored, points):
    """The noise-scale points to keep when a run of ``points`` ends where ``stored`` were
    written: the run's points over the fractions of training it covers, the stored ones
    elsewhere (a resumed run covers only the fractions since its resume) -- unless the stored
    points over those fractions are more than the run's: a short smoke run never replaces a
    long run's estimates with fewer."""
    if not points:
        return stored
    low, high = points[0][0], points[-1][0]
    inside = [p for p in stored if low <= p[0] <= high]
    if len(inside) > len(points):
        return stored
    kept = [p for p in stored if not low <= p[0] <= high] + points
    return _thinned(sorted(kept, key=lambda p: p[0]))


def save(folder, key, series, step_times, run, path=None):
    """Write the prior of a finished run (atomically), merged with what is stored there for the
    same key (:func:`merged`; a run with no trusted point leaves the file as it is); returns
    its path.

    ``series``: [(fraction of training, phi, rse)] per step (None phi: no estimate yet);
    ``step_times``: StepTimeRefit.state() or None; ``run``: its output folder, for the log.
    """
    path = path or prior_path(folder, key)
    points = trusted_points(series)
    stored, stored_step_times = _stored(path, key)
    kept = merged(stored, points)
    if stored and kept is stored:
        return path                              # nothing to add: the stored prior stays
    saved = {"key": key, "run": run, "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "noise_scale": kept,
             "step_times": step_times if step_times is not None else stored_step_times}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path, "w") as f:
        json.dump(saved, f)
    return path


def read_file(path, key):
    """(spec or None, one line for the log) of a file :func:`save` wrote; None when the file is
    missing, unreadable, has no trusted noise-scale point, or was written for another key. A
    spec is JSON-able (one rank reads it and sends it to the others): :func:`from_spec`."""
    try:
        with open(path) as f:
            saved = json.load(f)
        points = np.array(saved["noise_scale"], float).reshape(-1, 3)
        other = saved["key"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"batch prior: cannot read {path} ({e}); measuring from B0"
    if not isinstance(other, dict):
        return None, (f"batch prior: cannot read {path} (its key is {type(other).__name__}, "
                      f"not a mapping of model, data, ranks and machine); measuring from B0")
    if other != key:
        diff = "; ".join(f"{k} {other.get(k)} there, {key[k]} here" for k in key
                         if other.get(k) != key[k])
        return None, (f"batch prior: {path} is of another run ({diff}): not reused; measuring "
                      f"from B0")
    if not len(points):
        return None, f"batch prior: {path} has no trusted noise-scale estimate; measuring from B0"
    if not (np.all(np.isfinite(points)) and np.all(points[:, 1:] > 0)):
        return None, (f"batch prior: cannot read {path} (a noise-scale point is not [fraction, "
                      f"phi, relative error] of finite numbers, phi and error > 0); measuring "
                      f"from B0")
    points = points[np.argsort(points[:, 0], kind="stable")]    # np.interp needs them sorted
    step_times, note = saved.get("step_times"), ""
    if step_times is not None:
        try:
            step_refit.check_state(step_times)
            note = ", with its step times"
        except ValueError as e:
            step_times, note = None, f"; its step times are left out, {e}"
    line = (f"batch prior: the run {saved.get('run', '?')} of {saved.get('written', '?')} "
            f"({path}): phi {_number(points[:, 1].min())}-{_number(points[:, 1].max())} from "
            f"{points[0, 0]:.1%} of training on" + note)
    return {"file": path, "noise_scale": points.tolist(), "step_times": step_times}, line


def _number(phi):
    """A noise scale for the log: whole images, or 3 significant digits past 10^7 (a damaged
    file's 1e308 is 1e+308, not 309 digits)."""
    return f"{phi:.0f}" if phi < 1e7 else f"{phi:.3g}"


def find(setting, folder, key, model, data="imagenet"):
    """(spec or None, log line) for ``--batch-prior setting``: auto | none | a file's path."""
    if setting == "none":
        return None, "batch prior: none (--batch-prior none): measuring from B0"
    if setting != "auto":
        return read_file(os.path.expanduser(setting), key)
    path = prior_path(folder, key)
    if os.path.exists(path):
        return read_file(path, key)
    if not published.published_batches(model, data):
        return None, f"batch prior: none stored for this run, nothing published for {model} on " \
                     f"{data}; measuring from B0"
    return {"published": [model, data]}, "batch prior: " + published.describe(model, data)


def from_spec(spec, epochs):
    """The Prior of a :func:`find` spec (None for None); ``epochs``: the run's length, over
    which a published schedule is laid."""
    if spec is None:
        return None
    if "published" in spec:
        model, data = spec["published"]
        return Prior("published", published.describe(model, data),
                     published.noise_scale_prior(model, epochs, data), None)
    fraction, phi, rse = np.array(spec["noise_scale"], float).T

    def phi_at(f):
        f = np.asarray(f, float)
        return np.interp(f, fraction, phi), np.interp(f, fraction, rse)
    return Prior("earlier run", spec["file"], phi_at, spec["step_times"], float(fraction[0]))


def choose(setting, folder, key, model, epochs, data="imagenet"):
    """(Prior or None, log line) for ``--batch-prior setting`` (:func:`find`, then
    :func:`from_spec`)."""
    spec, line = find(setting, folder, key, model, data)
    return from_spec(spec, epochs), line
