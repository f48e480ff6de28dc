"""The checkpoint interval from the failure rate: Young/Daly's optimum.

A job of ``gpus`` GPUs whose GPUs fail once per ``mtbf_hours`` each (the profile's
``run.mtbf_hours``: GPU-hours between failures, every failure a GPU's job meets counted,
host and link ones included) fails every ``M = mtbf_hours x 3600 / gpus`` seconds. A
checkpoint that stops training ``C`` seconds is best taken every

    T = sqrt(2 C M) x (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C     (C < 2M; else T = M)

seconds of training (Daly 2006, "A higher order estimate of the optimum checkpoint interval
for restart dumps", FGCS 22(3); its first term is Young's 1974 sqrt(2 C M)). Between two
checkpoints a failure loses T / 2 on average, and each checkpoint costs C: T balances the two.
``C`` is the measured cost of the run's checkpoints when there is one, else the profile's
estimate: the model's state (parameters and momentum in float32) at
``run.checkpoint_GBps``. Example::

    >>> round(young_daly_s(cost_s=2.0, mtbf_s=3600.0))
    119
    >>> iv = checkpoint_interval(load_profile("dgx-h100"), "resnet50", gpus=64, step_s=0.1)
    >>> iv.steps > 0
    True

    $ python -m nnabla_torus.planning.checkpoint_interval --profile abci --model resnet50
"""
import argparse
import math
import sys
from collections import namedtuple

from ..knobs import add_knob, number
from .machine_profile import add_profile_knob, load_profile, resolve_profile
from .profile_schema import RUN_KEYS, model_of

# What the interval was chosen from: seconds of training between checkpoints and the steps
# they hold (at least 1), the checkpoint cost C and where it came from, the job's MTBF M,
# the GPUs, and the per-GPU MTBF with its source.
Interval = namedtuple("Interval", ["seconds", "steps", "cost_s", "cost_source", "mtbf_s", "gpus",
                                   "mtbf_hours", "mtbf_source", "step_s"])


def young_daly_s(cost_s, mtbf_s):
    """Daly's optimum seconds of work between checkpoints of cost ``cost_s`` for a mean time
    between failures ``mtbf_s`` (Young's sqrt(2 C M) with Daly's higher-order terms)."""
    if cost_s <= 0:
        return 0.0
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - cost_s


def checkpoint_cost_s(prof, model):
    """(seconds, source) of one checkpoint of ``model`` on ``prof`` by the profile's estimate:
    parameters and momentum in float32 (8 bytes per parameter: the model's ``params``, else
    ``grad_bytes`` / 4, float32 gradients) written at ``run.checkpoint_GBps``."""
    rate = _run(prof)["checkpoint_GBps"]
    params = ((prof.extra or {}).get("params") or {}).get(model)
    state = 8 * (params or model_of(prof, model).grad_bytes / 4)
    return state / (rate * 1e9), (f"profile {prof.name}: {state / 1e6:.0f} MB of parameters "
                                  f"and momentum at {rate:g} GB/s")


def _run(prof):
    return (prof.extra or {}).get("run") or RUN_KEYS


def checkpoint_interval(prof, model, gpus, step_s, cost_s=None, mtbf_hours=None):
    """The :class:`Interval` for ``gpus`` GPUs of ``prof`` training ``model`` at ``step_s``
    seconds per optimizer step; ``cost_s`` (a measured checkpoint cost) and ``mtbf_hours``
    (per GPU) replace the profile's. ValueError for a non-positive step time or MTBF."""
    if not step_s > 0:
        raise ValueError(f"step time {step_s!r} s must be > 0")
    mtbf_source = "given" if mtbf_hours is not None else f"profile {prof.name} run.mtbf_hours"
    mtbf_hours = _run(prof)["mtbf_hours"] if mtbf_hours is None else mtbf_hours
    if not mtbf_hours > 0:
        raise ValueError(f"MTBF {mtbf_hours!r} GPU-hours must be > 0")
    cost_source = "measured"
    if cost_s is None:
        cost_s, cost_source = checkpoint_cost_s(prof, model)
    mtbf_s = mtbf_hours * 3600.0 / gpus
    seconds = young_daly_s(cost_s, mtbf_s)
    return Interval(seconds, max(1, round(seconds / step_s)), cost_s, cost_source, mtbf_s, gpus,
                    mtbf_hours, mtbf_source, step_s)


def describe(iv):
    """One line: the interval and its inputs."""
    return (f"checkpoint every {iv.steps} step(s) ({iv.seconds:.0f} s of training at "
            f"{iv.step_s * 1e3:.1f} ms per step): Young/Daly for a checkpoint of {iv.cost_s:.2f} s "
            f"({iv.cost_source}) and a job MTBF of {iv.mtbf_s / 3600:.1f} h ({iv.mtbf_hours:g} "
            f"GPU-hours per GPU, {iv.mtbf_source}, / {iv.gpus} GPUs); expected loss per "
            f"failure {iv.seconds / 2 + iv.cost_s:.0f} s of work, checkpoints cost "
            f"{100 * iv.cost_s / max(iv.seconds, 1e-9):.2f} % of training")


def main(argv=None):
    """Print the interval for a profile's default plan (or --gpus and --step-s)."""
    parser = argparse.ArgumentParser(prog="python -m nnabla_torus.planning.checkpoint_interval",
                                     description=__doc__.split("\n")[0])
    add_profile_knob(parser, help="cluster profile (shipped name or YAML path)")
    add_knob(parser, "--model", "NNABLA_TORUS_CKPT_MODEL", "resnet50", "model in the profile")
    add_knob(parser, "--gpus", "NNABLA_TORUS_CKPT_GPUS", None,
             "GPUs of the job (None: the planner's default plan)", type=number(int, low=1))
    add_knob(parser, "--batch", "NNABLA_TORUS_CKPT_BATCH", None,
             "global batch of the plan, split evenly over --gpus (None: the planner's)",
             type=number(int, low=1))
    add_knob(parser, "--step-s", "NNABLA_TORUS_CKPT_STEP_S", None,
             "seconds per optimizer step (None: the plan's)", type=number(float, low=0,
                                                                         strict=True))
    add_knob(parser, "--checkpoint-cost", "NNABLA_TORUS_CHECKPOINT_COST", None,
             "seconds one checkpoint stops training (None: the profile's estimate)",
             type=number(float, low=0))
    add_knob(parser, "--mtbf-hours", "NNABLA_TORUS_MTBF_HOURS", None,
             "GPU-hours between failures per GPU (None: the profile's run.mtbf_hours)",
             type=number(float, low=0, strict=True))
    args = parser.parse_args(argv)
    name, _ = resolve_profile(args.profile, gpus=True)
    prof = load_profile(name)
    gpus, step_s = args.gpus, args.step_s
    if gpus is None or step_s is None:
        from . import planner
        split = dict(target_batch=args.batch, local_batches=[args.batch // gpus],
                     accum_steps=[1]) if args.batch and gpus else {}
        best = planner.plan(prof, args.model, counts=[gpus] if gpus else None, **split).best
        print(f"plan: {best.gpus} GPUs, {best.algorithm} on {best.grid}, {best.local_batch} x "
              f"{best.accum_steps} per GPU, global batch {best.global_batch}, "
              f"{best.step_time_s * 1e3:.1f} ms per step")
        gpus, step_s = gpus or best.gpus, step_s or best.step_time_s
    print(describe(checkpoint_interval(prof, args.model, gpus, step_s, args.checkpoint_cost,
                                       args.mtbf_hours)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
