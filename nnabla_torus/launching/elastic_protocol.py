"""What nnabla-torus-run and the training script tell each other: exit statuses, the request
line, the environment.

The script exits ``EXIT_RESIZE`` after printing one ``REQUEST_PREFIX`` + JSON line (read by
:func:`parse_request`), or ``EXIT_STOPPED`` after the launcher's Ctrl-C; the launcher tells the
script it runs elastic, its slots, its fixed rank schedule and the restart cost through the
``ENV_*`` variables. Exit statuses, signals: docs/elastic.md.
"""
import json

from .launcher_log import log

EXIT_RESIZE = 75          # the script checkpointed and asks to run on another rank count
EXIT_STOPPED = 76         # the script checkpointed after SIGUSR1 (the launcher's Ctrl-C)
REQUEST_PREFIX = "nnabla-torus-elastic: "   # + JSON {"ranks", "reason", ...} on stdout
# What the launcher tells the script (environment; mpirun_cmd.env_args passes them to every host).
ENV_ELASTIC = "NNABLA_TORUS_ELASTIC"
ENV_SLOTS = "NNABLA_TORUS_ELASTIC_SLOTS"
ENV_RANKS = "NNABLA_TORUS_ELASTIC_RANKS"
ENV_COST = "NNABLA_TORUS_RESTART_COST"


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
