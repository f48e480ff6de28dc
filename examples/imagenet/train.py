"""Data-parallel ImageNet training with nnabla and the nnabla-torus communicator.

With no arguments it builds (once, cached) a small ImageNet-layout dataset from scikit-learn's
handwritten digits and trains a small ResNet-18 on it with the ``digits-cpu`` recipe, through
the same code path as ImageNet: DALI input sharded by rank, torus all-reduce overlapped with
backward, the batch-size controller, the planner, checkpoints::

    mpirun -np 4 python examples/imagenet/train.py          # any machine, no data, 4 CPU ranks
    mpirun -np 4 python examples/imagenet/train.py -C clusters-mlp   # generated tasks:
    mpirun -np 4 python examples/imagenet/train.py -C shapes-cpu     # docs/tasks.md
    mpirun -np 8 python examples/imagenet/train.py --data-dir /data/imagenet --context cudnn
    srun --mpi=pmix -n 8 python examples/imagenet/train.py ...   # Slurm (or train.sbatch)

Every knob is a flag, an environment variable and a recipe key (``python train.py --help``).
Other commands, how the loop reads, the modules beside this file, output, resuming and the
exit statuses: docs/imagenet.md; Slurm and PBS: docs/clusters.md.
"""
import sys
import time

# nnabla calls logging.basicConfig(level=INFO) at import (nnabla/logger.py, line 91 at v1.39.0):
# "Initializing CPU extension..." on every rank, and every library's INFO lines (matplotlib's)
# after it. A root handler configured first makes that call a no-op.
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

from nnabla_torus.files import UnsafeFolder, WriteError
from nnabla_torus.launching import elastic
from nnabla_torus.training.checkpoint_file import CheckpointError
from nnabla_torus.training.run_lock import RunFolderBusy

import checkpoint_policy
import report
import resize
from config import parse_config
from divergence import EXIT_DIVERGED, diverged
from epoch_end import end_of_epoch, validation_due
from run_end import summary
from run_setup import resume_or_start, set_up
from run_step import plan_step, take_step
# Imported from train by tests and tools (train.build_graph, train.open_datasets, ...):
from divergence import count_nonfinite, gradients_finite  # noqa: F401
from run_context import make_context_and_comm  # noqa: F401
from run_setup import open_datasets  # noqa: F401
from solvers import SolverGroup  # noqa: F401
from step import build_graph, train_step  # noqa: F401


# ----------------------------------------------------------------------------------------------
# the loop: set-up (run_setup.py), one step (run_step.py; divergence.py), the end of an epoch
# (epoch_end.py), checkpoints (run_checkpoint.py), the end of the run (run_end.py)

def main(argv=None):
    cfg = parse_config(argv)
    t_start = time.time()
    # MPI started by the communicator's module: fail-fast installed and Open MPI's osc/ucx
    # notices off before MPI starts (importing mpi4py.MPI first would print them per window)
    from nnabla_torus.comm.communicator import MPI
    log = report.RankZeroLog(MPI.COMM_WORLD.rank)
    report.configure_logging(MPI.COMM_WORLD.rank, log)
    run = set_up(cfg, log)
    resume_or_start(run)
    status, request = 0, None
    stream, advisor, progress = run.data.stream, run.planning.advisor, run.progress
    while not finished(run):
        epoch = stream.epoch()
        batch_plan = plan_step(run, epoch)
        if advisor is not None and advisor.due(batch_plan, epoch):
            request = resize.elastic_request(advisor, batch_plan, epoch, cfg.elastic, log)
            if request is not None:
                status = elastic.EXIT_RESIZE
                break
        take_step(run, batch_plan, epoch)
        if diverged(run):
            status = EXIT_DIVERGED
            break
        if validation_due(run, epoch) or finished(run):
            end_of_epoch(run)
        stopping = run.state.stop_requested()      # every rank stops together
        if finished(run) or stopping or checkpoint_policy.due(run):
            checkpoint_policy.timed_save(run)
        if stopping:
            log(f"step {progress.step}: stopped on a signal; checkpoint written, resume with "
                f"--resume 1")
            status = elastic.EXIT_STOPPED
            break
    return summary(run, status, request, t_start)


def finished(run):
    """True once the run has trained its epochs (or --max-steps)."""
    cfg, step = run.settings.cfg, run.progress.step
    return run.data.stream.epoch() >= cfg.epochs or bool(cfg.max_steps and step >= cfg.max_steps)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError, CheckpointError, RunFolderBusy, WriteError,
            UnsafeFolder) as error:
        # A message, not a traceback; abort_job ends every rank even when only this one raised
        # (after sys.exit it would wait in MPI_Finalize while the others wait for it).
        from nnabla_torus.comm import failfast
        failfast.abort_job(f"train.py: error: {error}")
