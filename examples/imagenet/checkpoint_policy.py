"""When train.py writes a checkpoint: every N optimizer steps, or ``--checkpoint-every auto``.

``auto`` times the run's own steps and its first checkpoint (written after ``AUTO_STEPS``
steps), then keeps Young/Daly's interval for them and the profile's MTBF
(:mod:`nnabla_torus.planning.checkpoint_interval`), logged once with its inputs::

    checkpoint every 180 step(s) (52 s of training at 290.1 ms per step): Young/Daly for a
    checkpoint of 0.05 s (measured) and a job MTBF of 12669.2 h (...)

Every rank decides alike: the step time and the checkpoint's cost are the ranks' mean.
"""
import time

import numpy as np

from nnabla_torus.planning.checkpoint_interval import checkpoint_interval, describe
from nnabla_torus.planning.machine_profile import load_profile, resolve_profile
from monitor_series import write_series
from run_checkpoint import save

AUTO = "auto"
AUTO_STEPS = 10        # steps timed before auto's first checkpoint (its cost is measured there)


def due(run):
    """Whether a checkpoint is due after this step (besides the end and a stop)."""
    every, progress = run.settings.cfg.checkpoint_every, run.progress
    if every == AUTO:
        every = progress.auto_checkpoint_every
        if not every:                              # not chosen yet: the first one measures
            return progress.step >= AUTO_STEPS
    return bool(every) and progress.step % every == 0


def timed_save(run):
    """:func:`run_checkpoint.save`; under ``auto`` the first one also chooses the interval."""
    start = time.perf_counter()
    save(run)
    write_series(run.progress.monitors)      # the series up to the checkpoint, as a resume keeps
    progress, cfg = run.progress, run.settings.cfg
    if cfg.checkpoint_every != AUTO or progress.auto_checkpoint_every or not progress.step:
        return
    comm = run.parallel.comm
    # the ranks' mean (a sum over the world), so that every rank keeps the same interval
    cost_s, step_s = comm.allreduce_numpy(np.array(
        [time.perf_counter() - start, progress.train_time / progress.step],
        np.float32)) / comm.size
    planner = run.planning.planner
    prof = planner.prof if planner is not None else load_profile(
        resolve_profile(cfg.profile, gpus=cfg.context != "cpu")[0])
    interval = checkpoint_interval(prof, None, comm.size, float(step_s), cost_s=float(cost_s))
    progress.auto_checkpoint_every = interval.steps
    run.settings.log(f"--checkpoint-every auto: {describe(interval)}")

