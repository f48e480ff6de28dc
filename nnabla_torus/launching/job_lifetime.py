"""Tie a job's processes to nnabla-torus-run's life: no rank trains on after the launcher.

mpirun runs in a session of its own (so that Ctrl-C reaches the launcher only), and Open MPI 5
puts every local rank in a process group of its own inside that session: killing mpirun's
process group, or mpirun alone with SIGKILL, leaves the ranks training. Two rules close that:

- :func:`end_with_launcher`: mpirun gets SIGTERM when the launcher dies, however it dies
  (Linux ``prctl(PR_SET_PDEATHSIG)``); mpirun then ends its ranks on every host, as on Ctrl-C
  (SIGKILL would not: Open MPI 5's ranks outlive a SIGKILLed mpirun);
- :func:`end_session`: every process still alive in mpirun's session (mpirun, its ranks and
  helpers on this host) is killed when mpirun ended or the launcher ends the job.

Both read Linux interfaces (``prctl``, ``/proc``); elsewhere they do nothing. After a hang-up
(SIGHUP: the terminal or ssh session closed) :func:`leave_terminal` sends what the launcher
would write to the terminal to /dev/null, so that the job can stop with its checkpoint.
"""
import contextlib
import ctypes
import os
import signal
import stat
import sys

PR_SET_PDEATHSIG = 1      # linux/prctl.h
LINUX = sys.platform.startswith("linux")


def end_with_launcher(signum=signal.SIGTERM):
    """A ``preexec_fn`` for ``subprocess.Popen`` that has the child sent ``signum`` when this
    process dies; None off Linux. A launcher that dies before the child's ``prctl`` cannot
    signal it: the child then sends the signal to itself."""
    if not LINUX:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    launcher = os.getpid()

    def preexec():
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != launcher:
            os.kill(os.getpid(), signum)
    return preexec


def session_processes(session):
    """PIDs of the live processes (zombies left out) of session ``session`` on this host,
    from ``/proc/PID/stat``; [] off Linux."""
    if not LINUX:
        return []
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                # after the command name in parentheses: state ppid pgrp session ...
                state, _, _, sid = f.read().rsplit(")", 1)[1].split()[:4]
        except (OSError, IndexError, ValueError):
            continue                              # it ended while we read
        if int(sid) == session and state not in ("Z", "X"):
            found.append(int(pid))
    return found


def end_session(session):
    """SIGKILL every live process of session ``session`` (mpirun's pid: it leads the session
    it was started in, and the process group of that pid) on this host; returns the PIDs
    found in the session (off Linux: [], the process group only)."""
    left = session_processes(session)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def leave_terminal():
    """Point stdout and stderr at /dev/null where they are a terminal (a file or pipe keeps
    them): a hung-up terminal fails every write (EIO), and the launcher would end the job on
    the first. A terminal is told by its device type (``isatty`` fails once hung up)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(os.fstat(fd).st_mode):
                os.dup2(null, fd)
    os.close(null)
