"""Seconds a training run pays beyond its steps, in every plan: start-up, validation passes and
input-loader stalls, from a profile's ``run:`` block.

    startup     = startup_s + startup_s_per_doubling x log2(hosts)
    validation  = validations x validation_s
                  + ceil(epochs / validate_every_epochs) x validation_gpu_s / GPUs
    stalls      = steps x loader_stall_ms

Start-up grows with the hosts that must join (process launch, NCCL set-up; MLPerf's published
initialisation, init_start to run_start, rises about 4 s per doubling of nodes); one validation
pass spreads the validation set over the run's GPUs (``validation_gpu_s``: its seconds on one
GPU). :func:`.fidelity.run_costs_fit` fits both to the published runs. Example::

    >>> run = {"startup_s": 47.3, "startup_s_per_doubling": 4.1, "validation_gpu_s": 3.9,
    ...        "validate_every_epochs": 4.0, "loader_stall_ms": 0.0}
    >>> {k: round(v, 1) for k, v in fixed_seconds(run, 8, 64, 35.0, 3000).items()}
    {'startup': 59.6, 'validation': 0.5, 'loader_stalls': 0.0}
"""
import numpy as np

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
