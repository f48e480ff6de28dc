"""The end of a training run: what it leaves and the status it exits with.

A resize request (a checkpoint and the request line for the launcher), a stop on a signal or
a divergence (the JSON summary line) return their exit status; a finished run leaves, on
rank 0, its batch prior, the model, the plots, the closing summary and the JSON summary line.
Example (train.main does this)::

    return summary(run, status, request, t_start)
"""
import json
import time

from nnabla_torus.launching import elastic

import report
from divergence import EXIT_DIVERGED
from models import export_model
from run_checkpoint import save
from run_prior import leave_prior


def summary(run, status, request, t_start):
    """End the run: a resize request (checkpoint, request line), a stop or a divergence (the
    JSON summary line) returns ``status``; a finished run writes the model, the plots, the
    closing summary and the JSON summary line (rank 0)."""
    comm, log = run.parallel.comm, run.settings.log
    if run.parallel.reducer is not None:
        run.parallel.reducer.close()
    if log.progress is not None:
        log.progress.close()
    report.write_series(run.progress.monitors)
    if status == elastic.EXIT_RESIZE:
        save(run)
        if comm.rank == 0:
            print(elastic.REQUEST_PREFIX + json.dumps(request), flush=True)
    if status == EXIT_DIVERGED and comm.rank == 0:
        print(json.dumps(report.summary_json(run, time.time() - t_start)), flush=True)
    if status:
        comm.barrier()               # rank 0's checkpoint is on disk before any rank exits
        run.state.close()            # the folder's lock: the relaunch takes it
        comm.close()                 # NCCL communicators freed before the interpreter exits
        return status
    wall = time.time() - t_start
    if comm.rank == 0:
        output_dir = run.settings.cfg.output_dir
        if run.planning.batch.noise is not None:
            leave_prior(run, comm.settings.cache_dir, output_dir, log)
        export_model(run.net.model, run.settings.cfg.image_size, output_dir, log)
        plots = report.write_plots(output_dir, log)
        for line in report.closing_summary(run, wall, plots):
            log(line)
        print(json.dumps(report.summary_json(run, wall)), flush=True)
    run.state.close()
    comm.close()                     # NCCL communicators freed before the interpreter exits
