"""One live run per output folder: a lock file held for the run's life.

``RunLock.acquire(directory)`` creates ``directory/run.lock`` (JSON: pid, host, start time,
the launcher's job id) or raises :class:`RunFolderBusy`, one line naming the live run's pid
and host. A lock is stale, and is taken over with a logged line, when its holder cannot be
live:

1. it names this host and a pid no live process has (a crash, ``kill -9``), or
2. it comes from an earlier job of this same nnabla-torus-run launcher (``ENV_LAUNCH``; the
   launcher starts a job only after the previous one ended), or
3. it names another host and was not refreshed for ``STALE_AFTER_S`` seconds (the holder
   refreshes it at each checkpoint and progress line: ``touch``).

Example::

    lock = RunLock.acquire("runs/x", log=print)   # RunFolderBusy when a live run holds it
    ...                                           # lock.touch() now and then
    lock.release()
"""
import contextlib
import json
import os
import socket
import time

from nnabla_torus.files import atomic_open
from nnabla_torus.launching.elastic_protocol import ENV_LAUNCH, FOLDER_IN_USE

LOCK_NAME = "run.lock"
STALE_AFTER_S = 3600.0    # another host's lock not refreshed for this long is stale


class RunFolderBusy(RuntimeError):
    """A live run holds the folder's lock."""


def pid_alive(pid):
    """Whether a process with ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's live process
        return True
    return True


class RunLock:
    """The lock of one run folder, held by this process (see the module docstring)."""

    def __init__(self, path, record):
        self.path, self.record = path, record

    @classmethod
    def acquire(cls, directory, log=print, now=None):
        """Take ``directory``'s lock (taking over a stale one, with a line) or raise
        RunFolderBusy naming the live holder."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, LOCK_NAME)
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "job": os.environ.get(ENV_LAUNCH, "")}
        mine = f"{path}.{record['host']}.{record['pid']}"
        with atomic_open(mine) as f:
            json.dump(record, f)
        try:
            for _ in range(3):                # a racing taker may win each round
                try:
                    os.link(mine, path)       # fails when the lock exists: atomic, NFS too
                    return cls(path, record)
                except FileExistsError:
                    pass
                holder, age = read_holder(path, now)
                why = stale_reason(holder, age, record)
                if why is None:
                    raise RunFolderBusy(
                        f"{directory} is {FOLDER_IN_USE}: pid {holder.get('pid')} on host "
                        f"{holder.get('host')} (since {holder.get('started')}); wait for it "
                        f"to end, or use another output folder")
                if holder.get("pid") == record["pid"] and holder.get("host") == record["host"]:
                    return cls(path, holder)  # this process holds it already
                with contextlib.suppress(FileNotFoundError):
                    os.rename(path, f"{mine}.stale")   # only one taker renames it
                    if read_holder(f"{mine}.stale")[0] != holder:   # a racing taker's fresh
                        os.rename(f"{mine}.stale", path)         # lock: give it back
                        continue
                    os.remove(f"{mine}.stale")
                    log(f"run lock: took over {path} from pid {holder.get('pid')} on host "
                        f"{holder.get('host')}: {why}")
            raise RunFolderBusy(f"{directory}: could not take {path} (other runs kept taking "
                                f"it); start one run at a time in a folder")
        finally:
            os.remove(mine)

    def touch(self):
        """Refresh the lock's time (a sign of life for other hosts)."""
        with contextlib.suppress(OSError):
            os.utime(self.path)

    def release(self):
        """Remove the lock if it is still this process's."""
        holder, _ = read_holder(self.path)
        if holder == self.record:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)


def read_holder(path, now=None):
    """(record, seconds since its last refresh) of the lock at ``path``; an unreadable one is
    ({}, age), a vanished one ({}, 0.0)."""
    try:
        age = (time.time() if now is None else now) - os.path.getmtime(path)
        with open(path) as f:
            return json.load(f), age
    except FileNotFoundError:
        return {}, 0.0
    except (OSError, ValueError):
        return {}, age


def stale_reason(holder, age, record):
    """Why the lock of ``holder`` (refreshed ``age`` s ago) is stale for ``record``, or None
    while its run may be live."""
    if not holder and age == 0.0:
        return "it was released meanwhile"
    if holder.get("host") == record["host"] and isinstance(holder.get("pid"), int):
        if holder["pid"] == record["pid"]:
            return "this process"
        return None if pid_alive(holder["pid"]) else "that process is gone"
    if holder.get("job") and holder.get("job") == record["job"]:
        return "an earlier job of this nnabla-torus-run"
    if age > STALE_AFTER_S:
        return f"not refreshed for {age:.0f} s (over {STALE_AFTER_S:.0f} s)"
    return None
