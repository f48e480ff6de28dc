"""Run the training job and relaunch it on its requests and after failures: nnabla-torus-run's
watch loop.

:func:`relaunch` runs the job through the ``run_once`` it is handed (nnabla-torus-run's
:func:`nnabla_torus.launching.elastic.run_once`: one mpirun, its output shown and read by a
:class:`.job_watch.JobWatch`), then acts on how the job ended: status 0 ends the run,
``EXIT_STOPPED`` or a signal to the launcher stops it, a resize request (``EXIT_RESIZE``)
relaunches on the requested rank count (capped at the slots) with ``--resume 1``
(:func:`resumed`). Any other end is a failure (:func:`.failures.classify`): one that repeats
stops the launcher with its line, and so does the same failure twice in a row (cause, whichever
rank reports it, exit status and step: a run that prints no step line is never taken as one),
and an exit 75
without a valid request line; any other relaunches from the newest checkpoint (from the start
when the job announced none) on the hosts left (:class:`.membership.HostPool` leaves the
failed host out for its cool-down), within the restart budget (:class:`RestartBudget`).
Each restart is logged with its cause, host, steps lost and seconds to recover. What the
launcher cannot learn from the script's lines (no checkpoint announced, no readable step) is
said once (:class:`ContractNotes`).
"""
import collections
import time

from .elastic_protocol import (CHECKPOINT_PREFIX, ENV_SLOTS, EXIT_RESIZE, EXIT_STOPPED,
                               REQUEST_PREFIX)
from .failures import classify, placement_of
from .job_watch import JobWatch
from .launcher_log import log
from .rank_decision import fit_ranks

CONTRACT = "docs/elastic.md#the-contract-with-the-training-script"
TAIL_LINES = 20          # the job's last lines shown when the launcher stops on a failure
HOUR_S = 3600.0


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


class RestartBudget:
    """``--max-restarts`` relaunches in all (resizes and failures), and at most
    ``--restarts-per-hour`` failure restarts in any hour; :meth:`spend` says why not."""

    def __init__(self, max_restarts, per_hour, clock=time.monotonic):
        self.max_restarts, self.per_hour, self.clock = max_restarts, per_hour, clock
        self.count, self.failures = 0, collections.deque()

    def spend(self, failure):
        """Count one relaunch (``failure``: after a failure); None when allowed, else the
        reason it is not."""
        self.count += 1
        if self.count > self.max_restarts:
            return f"restart {self.count} is above --max-restarts {self.max_restarts}"
        if failure:
            now = self.clock()
            while self.failures and self.failures[0] <= now - HOUR_S:
                self.failures.popleft()
            self.failures.append(now)
            if len(self.failures) > self.per_hour:
                return (f"failure {len(self.failures)} within an hour: "
                        f"--restarts-per-hour {self.per_hour} restarts spent")
        return None


def _tail(lines):
    return "\n".join(f"  | {line}" for line in lines[-TAIL_LINES:])


class ContractNotes:
    """The launcher's lines about what the script does not tell it, each said once per run:
    no checkpoint announced (restarts start it from the beginning), no step it can read."""

    def __init__(self):
        self.said = set()

    def say(self, key, text):
        if key not in self.said:
            self.said.add(key)
            log(text)

    def no_checkpoint(self):
        self.say("checkpoint", f"the script announced no checkpoint (a '{CHECKPOINT_PREFIX}"
                 f"{{\"step\": N, ...}}' line after each): this restart and every later one "
                 f"start it from the beginning ({CONTRACT})")

    def unreadable(self, what):
        self.say("progress", f"cannot read this script's progress ({what}): restarts are "
                 f"reported without the steps lost (the lines it reads: {CONTRACT})")


def _recovered(number, failed, started, expected, notes):
    """The callback a relaunch's JobWatch calls when the job trains again: the restart's
    figures (steps lost, seconds from the failure). ``expected``: the step the relaunch
    resumes from when it prints no resume line (the announced checkpoint's, 0 from the start,
    None unknown)."""
    def report(watch):
        since = watch.clock() - started
        reached = failed.step
        resumed_at = watch.resumed if watch.resumed is not None else expected
        if resumed_at is None:
            notes.unreadable("no 'resumed from PATH: step N' line after a resume")
            lost = "steps lost unknown"
        elif reached is None:
            lost = ("steps lost unknown (the failed run printed no progress line holding "
                    "'step N' before it failed: print them more often, as train.py's "
                    "--log-every does)")
        elif reached < resumed_at:
            lost = (f"steps lost unknown (the failed run's step lines stop at step {reached}, "
                    f"before step {resumed_at})")
        else:
            lost = f"{reached - resumed_at} step(s) lost (the failed run reached step {reached})"
        again = "training again" + (f" from step {resumed_at}" if resumed_at is not None else "")
        log(f"restart {number}: {again}: {lost}, {since:.1f} s from the failure")
    return report


def relaunch(args, argv, ranks, job_args, env, run_once, pool=None):
    """Run the job, relaunching it on its requests and after failures; the launcher's exit
    status. ``run_once``: (argv, ranks, mpirun_args, env, watch=) -> (status, request or None,
    last lines, interrupted); ``job_args(hosts)``: the mpirun arguments of a launch on
    ``hosts`` ([(host, slots)], None without a host list); ``pool``: a HostPool or None."""
    budget = RestartBudget(args.max_restarts, getattr(args, "restarts_per_hour", 4))
    first_argv, wanted, batch = list(argv), ranks, getattr(args, "global_batch", None)
    checkpointed = "1" in argv[argv.index("--resume") + 1:][:1] if "--resume" in argv else False
    on_train, hosts, notes, previous = None, None, ContractNotes(), None
    newest = None                     # the step of the newest checkpoint a job announced
    while True:
        slots = args.total_slots
        if pool is not None:
            hosts = pool.hosts()
            slots = sum(s for _, s in hosts)
        ranks, note = fit_ranks(wanted, slots, batch)
        if note:
            log(note)
        env[ENV_SLOTS] = str(slots)
        watch = JobWatch(on_resume=on_train)
        status, request, lines, interrupted = run_once(argv, ranks, job_args(hosts), env,
                                                       watch=watch)
        ended = watch.clock()
        checkpointed = checkpointed or watch.checkpoint is not None or watch.resumed is not None
        newest = watch.checkpoint["step"] if watch.checkpoint else newest
        if watch.unread:
            notes.say("checkpoint line", f"cannot read this script's checkpoint line (JSON "
                      f"with an integer 'step' expected): {watch.unread!r}")
        batch = watch.batch or batch
        if interrupted and status not in (0, EXIT_STOPPED):
            log(f"stopped by a signal before the ranks could checkpoint (status {status}; "
                f"during start-up they do not handle SIGUSR1 yet): the newest earlier "
                f"checkpoint, if any, is the one to resume from")
            return 130
        placement = placement_of(hosts, ranks) if hosts else None
        failure = classify(0, lines, placement) if status == 0 else None
        if status == 0 and failure is None:
            log(f"finished after {budget.count} restart(s)")
            return 0
        if status == EXIT_STOPPED:
            log("stopped on a signal; the checkpoint is resumable: run the same command with "
                "--resume 1")
            return 130
        if status == EXIT_RESIZE and request is not None:
            why = budget.spend(failure=False)
            if why:
                log(f"the script asked for a resize: {why}: stopping (its checkpoint is "
                    f"resumable)")
                return 1
            wanted, note = fit_ranks(int(request["ranks"]), slots, request.get("global_batch"))
            batch = request.get("global_batch") or batch
            log(f"decision at epoch {request.get('epoch', 0):.3f}: {request.get('reason', '')}"
                + (f" ({note})" if note else "") + f"; relaunching on {wanted} ranks")
            argv, on_train = resumed(argv), None
            continue
        if status == EXIT_RESIZE:
            log(f"the training command exited with status {EXIT_RESIZE} (a resize) without a "
                f"valid request line ('{REQUEST_PREFIX}{{\"ranks\": M, ...}}'): stopping")
            return status
        failure = failure or classify(status, lines, placement)
        where = (f"host {failure.host}" if failure.host else "host unknown") + (
            f", rank(s) {failure.ranks}" if failure.ranks else "")
        if failure.repeats:
            log(f"the training command exited with status {status} (not a resize request): "
                f"stopping: {failure.cause} ({where}) would repeat on a restart. Last lines:\n"
                + _tail(lines))
            return status or 1
        why = budget.spend(failure=True)
        if why:
            log(f"the training command failed again: {failure.cause} ({where}, exit status "
                f"{status}); stopping: {why}. Last lines:\n" + _tail(lines))
            return status or 1
        same = (status, failure.kind, watch.step)   # whichever rank reported it
        if same == previous and watch.step is not None:
            log(f"the training command failed the same way twice in a row: {failure.cause} "
                f"({where}, exit status {status}, at step {watch.step}); stopping: a restart "
                f"would repeat it. Last lines:\n" + _tail(lines))
            return status or 1
        previous = same
        if watch.step is None:
            notes.unreadable("the failed run printed no 'step N' line")
        if not checkpointed:
            notes.no_checkpoint()
        if pool is not None:
            pool.exclude(failure.host, failure.cause)
        log(f"restart {budget.count} after a failure: {failure.cause} ({where}, exit status "
            f"{status}); relaunching from "
            + (f"the newest checkpoint (step {newest} announced)" if newest is not None
               else "the newest checkpoint" if checkpointed
               else "the start: no checkpoint was written yet"))
        argv = resumed(argv) if checkpointed else first_argv
        expected = (newest if newest is not None else watch.resumed) if checkpointed else 0
        on_train = _recovered(budget.count, watch, watch.failed_at or ended, expected, notes)
