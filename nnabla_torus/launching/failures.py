"""How a job ended, and whether running it again can help: nnabla-torus-run's failure classes.

:func:`classify` reads the job's exit status and its last lines (the ranks', the
communicator's and mpirun's or srun's, as the launcher saw them) and gives a :class:`Failure`:

- one that **repeats** stops the launcher at once: an output folder another live run holds
  (``run_lock.RunFolderBusy``'s line), a full disk (a "No space left on device" line), the
  script's own error line (``train.py: error: ...``: bad input, a configuration or checkpoint
  error), a usage error (status 2) or divergence (status 3, train.py's ``EXIT_DIVERGED``);
- any other may not repeat and is restarted from the newest checkpoint: a rank killed by a
  signal (mpirun's or srun's report), a lost host (mpirun lost its daemon there, Slurm's node
  failure), a rank the communicator lost, a collective or watchdog timeout (a stopped or hung
  rank), a rank's unhandled exception, or an unexplained status.

The first rule that matches decides, in the order of ``RULES``: a full disk, then the
script's error (it is why the job ended), a timeout before the signal that ends the stopped
rank, a signal before the survivors' reports of the death it caused. Example::

    >>> classify(137, ["prterun noticed that process rank 3 with PID 812 on node h1 exited on",
    ...                "signal 9 (Killed)."]).cause
    'rank 3 killed by signal 9 (Killed)'
"""
import re
from collections import namedtuple

from .elastic_protocol import FOLDER_IN_USE

# A failure: ``repeats`` (stop, do not restart), ``cause`` (one line), ``host`` (where it
# happened, None when no line names it), ``ranks`` (the ranks it names), ``kind`` (the cause
# without its ranks: the same failure when another rank happens to report it first).
Failure = namedtuple("Failure", ["repeats", "cause", "host", "ranks", "kind"])

# Exit statuses of failures that repeat whatever host runs them (examples/imagenet:
# argparse's usage error 2 and divergence.EXIT_DIVERGED 3).
REPEATING_STATUSES = {2: "a usage or configuration error (exit status 2)",
                      3: "divergence: the loss was not finite (exit status 3)"}


def _ranks(text):
    return [int(r) for r in re.findall(r"\d+", text or "")]


# (pattern over the joined last lines, repeats, cause from the match's groups). A rule's ranks
# are its ``ranks`` or ``rank`` group, else the first "rank(s) [...]" of the matched text.
_HOLDER = rf"(?P<line>\S+ is {FOLDER_IN_USE}: pid \S+ on host \S+(?: \(since [^)\n]*\))?)"
RULES = [
    # another live run holds the output folder (run_lock.RunFolderBusy): every relaunch meets
    # it while that run lives, and takes the folder over once it ends. The line naming the
    # reporting rank's host first (failfast's), then the error's own (a traceback's, the
    # script's), then the other ranks' ("rank 0 found runs/x in use by a live run ...").
    (r"[^\n]*?rank (?P<rank>\d+) on host (?P<host>\S+): [^\n]*?" + _HOLDER, True, "{line}"),
    (_HOLDER, True, "{line}"),
    (rf"(?P<line>[^\n]*?rank (?P<rank>\d+) on host (?P<host>\S+): [^\n]*{FOLDER_IN_USE}"
     r"[^\n]*)", True, "{line}"),
    # a full disk (files.WriteError's "cannot write PATH: No space left on device; N MB free",
    # an OSError's "[Errno 28] No space left on device"): every restart writes there again.
    # The line naming the rank's host first (failfast's, after Python's traceback).
    (r"[^\n]*?rank (?P<rank>\d+) on host (?P<host>\S+): (?P<line>[^\n]*No space left on "
     r"device[^\n]*)", True, "the disk is full: {line}"),
    (r"(?P<line>[^\n]*No space left on device[^\n]*)", True, "the disk is full: {line}"),
    # failfast.abort_job's "rank R on host H: train.py: error: ..." (or argparse's line)
    (r"(?:rank (?P<rank>\d+) on host (?P<host>\S+): )?(?P<script>[\w./-]+\.py): error: "
     r"(?P<what>[^\n]*)", True, "{script}: error: {what}"),
    # the communicator's timeouts (waits.overdue, rendezvous, the watchdog): a stopped or hung
    # rank, named when the wait knows which
    (r"nnabla_torus: (?P<line>rank \d+: [^\n]*?did not (?:finish|arrive)[^\n]*?within "
     r"[\d.]+ s)(?:[^\n]*?rank \d+ ran on (?P<host>[^\s;,)]+))?[^\n]*", False,
     "timeout: {line}"),
    # Open MPI 5 (PRRTE): "... process rank 3 with PID 812 on node h1 exited on signal 9 (Killed)"
    (r"process\s+rank\s+(?P<rank>\d+)\s+with\s+PID\s+\d+\s+on\s+node\s+(?P<host>\S+)\s+"
     r"exited\s+on\s+signal\s+(?P<sig>\d+)(?:\s+\((?P<name>[^)]*)\))?",
     False, "rank {rank} killed by signal {sig} ({name})"),
    # Open MPI 5 lost a host's daemon (host down, link cut)
    (r"PRTE has lost communication with a remote daemon\.[\s\S]*?Remote daemon:\s+\S+\s+on\s+"
     r"node\s+(?P<host>\S+)", False, "lost host {host} (mpirun lost its daemon there)"),
    # Open MPI 5: a host's daemon died (a lost host); mpirun may then exit 0 (seen: a host's
    # processes killed, "Daemon exit status: 0")
    (r"A daemon failed to report back[\s\S]*?Remote host:\s+(?P<host>\S+)", False,
     "lost host {host} (its mpirun daemon failed)"),
    # Slurm: a node failure, a task killed
    (r"srun: error: Node failure on (?P<host>[\w.-]+)", False, "lost host {host} (Slurm: node "
     "failure)"),
    (r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO NODE FAILURE", False,
     "a node of the allocation failed (Slurm)"),
    (r"srun: error: (?P<host>[\w.-]+): tasks? (?P<ranks>[\d,-]+): (?P<how>Killed|Terminated|"
     r"Segmentation fault|Aborted)", False, "task(s) {ranks} {how} (srun)"),
    # the communicator: survivors name a dead rank (and its host), or one that left its script
    (r"nnabla_torus: rank \d+: lost rank\(s\) \[(?P<ranks>[\d, ]*)\] during (?P<op>[^\n(;]*?)"
     r"(?: \(|;|$)(?:[^\n]*?rank \d+ ran on (?P<host>[^\s;,)]+))?", False,
     "lost rank(s) [{ranks}] during {op}"),
    # (the host's group holds the text before it: "[^\n]*?(?:...)?" would match it empty)
    (r"nnabla_torus: rank \d+: rank\(s\) \[(?P<ranks>[\d, ]*)\] left the script"
     r"(?:[^\n]*?rank \d+ ran on (?P<host>[^\s;,)]+))?", False,
     "rank(s) [{ranks}] left the script"),
    # failfast: a rank's unhandled exception
    (r"nnabla_torus: rank (?P<rank>\d+) on host (?P<host>\S+): unhandled (?P<kind>\w+)",
     False, "rank {rank} crashed ({kind})"),
]
_COMPILED = [(re.compile(p), repeats, cause) for p, repeats, cause in RULES]


def classify(status, lines, placement=None):
    """The :class:`Failure` of a job that exited with ``status`` (not 75 or 76) after
    printing ``lines`` (its last ones); None for status 0 when no line reports a failure
    (mpirun can exit 0 after losing a host's daemon). ``placement``: rank -> host of the
    launch, to name the host when a line names only ranks (Open MPI fills each host's slots
    in hostfile order)."""
    text = "\n".join(lines)
    for pattern, repeats, cause in _COMPILED:
        found = pattern.search(text)
        if not found:
            continue
        named = found.groupdict()
        groups = {k: (v if v is not None else "?") for k, v in named.items()}
        listed = re.search(r"rank\(s\) \[([\d, ]*)\]", found.group(0))
        ranks = (_ranks(named.get("ranks")) or _ranks(named.get("rank"))
                 or _ranks(listed and listed.group(1)))
        host = named.get("host")
        if host is None and placement and ranks and ranks[0] < len(placement):
            host = placement[ranks[0]]
        unranked = {**groups, **{k: "*" for k in ("rank", "ranks") if k in groups}}
        return Failure(repeats or status in REPEATING_STATUSES, _said(cause, groups), host,
                       ranks, _said(cause, unranked))
    if status == 0:
        return None
    if status in REPEATING_STATUSES:
        return Failure(True, REPEATING_STATUSES[status], None, [], REPEATING_STATUSES[status])
    cause = f"exit status {status} (no line of the job says why)"
    return Failure(False, cause, None, [], cause)


def _said(cause, groups):
    return cause.format(**groups).replace(" (?)", "").replace("[?]", "[]")


def placement_of(hosts, ranks):
    """The host of each of ``ranks`` ranks when mpirun fills ``hosts`` [(host, slots)] in
    order, a host's slots before the next's (Open MPI's default by-slot mapping)."""
    out = [h for h, slots in hosts for _ in range(slots)]
    return out[:ranks]
