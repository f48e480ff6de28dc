"""Seconds a training run pays beyond its steps, in every plan: start-up, validation passes and
input-loader stalls, from a profile's ``run:`` block.

    startup     = startup_s + startup_s_per_doubling x log2(hosts)
    validation  = validations x validation_s
                  + ceil(epochs / validate_every_epochs) x validation_gpu_s / GPUs
    stalls      = steps x loader_stall_ms

Start-up grows with the hosts that must join (process launch, NCCL set-up; MLPerf's published
initialisation, init_start to run_start, rises about 4 s per doubling of nodes); one validation
pass spreads the validation set over the run's GPUs (``validation_gpu_s``: its seconds on one
GPU). :func:`.fidelity.run_costs_fit` fits both to the published runs. A profile's block
describes its calibrated models' ImageNet runs; :func:`with_own_data` replaces its terms by
the user's data, and leaves them out for a model the profile does not know. Example::

    >>> run = {"startup_s": 47.3, "startup_s_per_doubling": 4.1, "validation_gpu_s": 3.9,
    ...        "validate_every_epochs": 4.0, "loader_stall_ms": 0.0}
    >>> {k: round(v, 1) for k, v in fixed_seconds(run, 8, 64, 35.0, 3000).items()}
    {'startup': 59.6, 'validation': 0.5, 'loader_stalls': 0.0}
"""
import numpy as np

from .costmodel.framework import BACKWARD_SHARE
from .profile_schema import RUN_KEYS


def run_costs(prof):
    """The profile's ``run:`` block (defaults: no fixed cost)."""
    return (prof.extra or {}).get("run") or dict(RUN_KEYS)


def fixed_seconds(run, hosts, gpus, epochs, steps):
    """{startup, validation, loader_stalls: seconds} of a run of ``epochs`` epochs and
    ``steps`` optimizer steps on ``gpus`` GPUs over ``hosts`` hosts (module doc); arrays
    broadcast."""
    every = run.get("validate_every_epochs") or 0.0
    passes = np.ceil(np.asarray(epochs, float) / every - 1e-9) if every > 0 else 0.0
    return {"startup": run["startup_s"] + run.get("startup_s_per_doubling", 0.0) *
            np.log2(np.maximum(1, hosts)),
            "validation": run.get("validations", 0) * run.get("validation_s", 0.0) +
            passes * run.get("validation_gpu_s", 0.0) / np.maximum(1, gpus),
            "loader_stalls": np.asarray(steps) * run["loader_stall_ms"] * 1e-3}


def input_wait_s(run, images_per_host, step_s):
    """Seconds a step waits for its input: what a host's images take beyond the step at the
    pipeline's ``loader_images_per_s`` (0 when not modelled)."""
    rate = run.get("loader_images_per_s") or 0.0
    if not rate:
        return 0.0 * np.asarray(step_s)
    return np.maximum(0.0, np.asarray(images_per_host, float) / rate - step_s)


def with_own_data(run, b_s, own_model, startup_s=None, val_images=None, validate_every=1.0,
                  loader_images_per_s=None):
    """(run block, notes): ``run`` with start-up, validation and the input pipeline from the
    user's data where given; for ``own_model`` (a model the profile does not know) each term
    not given is left out (0) and named in a note with its flag, never the profile's.

    ``startup_s``: launch to first step on one host (the profile's growth per doubling of
    hosts is kept); ``val_images``: one validation pass every ``validate_every`` epochs, each
    image a forward pass, *assumed* ``1 - BACKWARD_SHARE`` of the training ``b_s`` seconds;
    ``loader_images_per_s``: what one host's input pipeline delivers.

    >>> run, notes = with_own_data(dict(RUN_KEYS, startup_s=45.0), 3e-4, True, val_images=1000)
    >>> run["startup_s"], round(run["validation_gpu_s"], 3), notes[0].split(":")[0]
    (0.0, 0.1, 'start-up left out')
    """
    run, notes = dict(run), []
    if startup_s is not None:
        run["startup_s"] = startup_s
    elif own_model:
        run.update(startup_s=0.0, startup_s_per_doubling=0.0)
        notes.append("start-up left out: --startup-s gives your launch-to-first-step seconds")
    if val_images is not None:
        run.update(validation_s=0.0, validations=0, validate_every_epochs=validate_every,
                   validation_gpu_s=val_images * (1 - BACKWARD_SHARE) * b_s)
    elif own_model:
        run.update(validation_s=0.0, validations=0, validation_gpu_s=0.0)
        notes.append("validation left out: --val-images gives your validation images")
    if loader_images_per_s is not None:
        run.update(loader_images_per_s=loader_images_per_s, loader_stall_ms=0.0)
    elif own_model:
        run.update(loader_images_per_s=0.0, loader_stall_ms=0.0)
        notes.append("input pipeline left out: --loader-rate gives the images/s one host's "
                     "loader delivers")
    return run, notes
