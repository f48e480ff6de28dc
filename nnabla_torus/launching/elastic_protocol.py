"""What nnabla-torus-run and the training script tell each other: exit statuses, the request
line, the environment.

The script exits ``EXIT_RESIZE`` after printing one ``REQUEST_PREFIX`` + JSON line (read by
:func:`parse_request`), or ``EXIT_STOPPED`` after the launcher's Ctrl-C; it announces each
checkpoint (``CHECKPOINT_PREFIX``) and the launcher reads its progress lines; the launcher
tells the script it runs elastic, its slots, its fixed rank schedule and the restart cost
through the ``ENV_*`` variables. The contract, line by line: docs/elastic.md.
"""
import json
import re

from .launcher_log import log

EXIT_RESIZE = 75          # the script checkpointed and asks to run on another rank count
EXIT_STOPPED = 76         # the script checkpointed after SIGUSR1 (the launcher's Ctrl-C)
REQUEST_PREFIX = "nnabla-torus-elastic: "   # + JSON {"ranks", "reason", ...} on stdout
# Under --elastic, rank 0 prints this + JSON {"step", "path", "seconds"} after each checkpoint
# (nnabla_torus/training/state.py's State.save): the launcher then relaunches a failed job with
# --resume 1, and knows what a checkpoint costs.
CHECKPOINT_PREFIX = "nnabla-torus-checkpoint: "
# Lines of train.py the launcher reads for a restart's figures: a progress or epoch line
# ("... step 120: ..."), the resume line ("resumed from PATH: step 100, ...") and the global
# batch of a progress line or decision.
STEP_LINE = re.compile(r"\bstep (\d+)\b")
RESUMED_LINE = re.compile(r"\bresumed from \S+: step (\d+)")
BATCH_LINE = re.compile(r"\bglobal batch (\d+)\b")
# What the launcher tells the script (environment; mpirun_cmd.env_args passes them to every host).
ENV_ELASTIC = "NNABLA_TORUS_ELASTIC"
ENV_SLOTS = "NNABLA_TORUS_ELASTIC_SLOTS"
ENV_RANKS = "NNABLA_TORUS_ELASTIC_RANKS"
ENV_COST = "NNABLA_TORUS_RESTART_COST"
# The launcher's identity (host, pid, start): a job's run-folder lock names it, so that the
# next job of the same launcher takes the lock over (nnabla_torus/training/run_lock.py).
ENV_LAUNCH = "NNABLA_TORUS_LAUNCH_ID"
# The words of run_lock.RunFolderBusy ("runs/x is in use by a live run: pid N on host H
# (since ...); ..."): the launcher stops on them at once, as a relaunch would meet them again.
FOLDER_IN_USE = "in use by a live run"


def parse_request(line):
    """The request dict of a ``REQUEST_PREFIX`` line, or None (logged) when it is not one."""
    try:
        request = json.loads(line[len(REQUEST_PREFIX):])
        if isinstance(request, dict) and int(request["ranks"]) >= 1:
            return request
    except (ValueError, KeyError, TypeError):
        pass
    log(f"ignoring a malformed request line (expected JSON with 'ranks' >= 1): {line.strip()!r}")
    return None
