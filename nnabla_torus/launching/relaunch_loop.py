"""Run the training job and relaunch it on its requests: nnabla-torus-run's watch loop.

:func:`relaunch` runs the job through the ``run_once`` it is handed (nnabla-torus-run's
:func:`nnabla_torus.launching.elastic.run_once`: one mpirun, its output shown and read), then
acts on how the job ended: status 0 ends the run, ``EXIT_STOPPED`` or a signal stops it, a
resize request (``EXIT_RESIZE``) relaunches on the requested rank count (capped at the slots)
with ``--resume 1`` (:func:`resumed`), anything else stops the launcher with the job's last
lines; ``--max-restarts`` bounds the relaunches.
"""
from .elastic_protocol import EXIT_RESIZE, EXIT_STOPPED
from .launcher_log import log
from .rank_decision import fit_ranks


def resumed(argv):
    """``argv`` with ``--resume 1`` in place of any --resume it has: a relaunch continues from
    the checkpoint the script wrote, whatever the first launch asked for."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--resume":
            skip = True
        elif not word.startswith("--resume="):
            out.append(word)
    return out + ["--resume", "1"]


def relaunch(args, argv, ranks, mpirun_args, env, run_once):
    """Run the job, relaunching it on its requests; the launcher's exit status. ``run_once``:
    (argv, ranks, mpirun_args, env) -> (status, request or None, last lines, interrupted)."""
    restarts = 0
    while True:
        status, request, tail, interrupted = run_once(argv, ranks, mpirun_args, env)
        if interrupted and status not in (0, EXIT_STOPPED):
            log(f"stopped by a signal before the ranks could checkpoint (status {status}; "
                f"during start-up they do not handle SIGUSR1 yet): the newest earlier "
                f"checkpoint, if any, is the one to resume from")
            return 130
        if status == 0:
            log(f"finished after {restarts} restart(s)")
            return 0
        if status == EXIT_STOPPED:
            log("stopped on a signal; the checkpoint is resumable: run the same command with "
                "--resume 1")
            return 130
        if status != EXIT_RESIZE or request is None:
            log(f"the training command exited with status {status} (not a resize request): "
                f"stopping. Last lines:\n" + "\n".join(f"  | {line}" for line in tail))
            return status or 1
        restarts += 1
        if restarts > args.max_restarts:
            log(f"the script asked for restart {restarts}, above --max-restarts "
                f"{args.max_restarts}: stopping (its checkpoint is resumable)")
            return 1
        ranks, note = fit_ranks(int(request["ranks"]), args.total_slots,
                                request.get("global_batch"))
        log(f"decision at epoch {request.get('epoch', 0):.3f}: {request.get('reason', '')}"
            + (f" ({note})" if note else "") + f"; relaunching on {ranks} ranks")
        argv = resumed(argv)
