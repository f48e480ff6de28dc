"""Which hosts the next launch runs on: nnabla-torus-run's one place for membership.

A :class:`HostPool` reads its source again before every launch (a hostfile that was edited, a
host discovery command whose output grew, the Slurm allocation's nodes that are still up) and
leaves out the hosts that failed less than ``cooldown_s`` ago (Horovod elastic's blacklist, with
a cool-down): a host that comes back, or is listed again, is used at the next launch. A read
that fails after the first (a discovery command's error, garbage or empty output, a hostfile
caught half written) is tried ``READ_TRIES`` times in all, ``READ_RETRY_S`` apart, then the
last good list is used: a flaky source never ends the run. Example::

    pool = HostPool(lambda: read_hostfile("hosts"), cooldown_s=600)
    pool.exclude("node3", "rank 5 killed by signal 9")
    hosts = pool.hosts()          # [(host, slots)] without node3 for 600 s
"""
import shutil
import subprocess
import time

from .hostlists import allocation, parse_hostlines, read_hostfile
from .launcher_log import log

DISCOVERY_TIMEOUT_S = 60     # a discovery command (or sinfo) that takes longer is an error
READ_TRIES = 3               # reads of a failing host source before the last good list is used
READ_RETRY_S = 5.0           # seconds between two of them
# Slurm node states (sinfo %T, lower case, flags after "+") that cannot run a task.
SLURM_DOWN = ("down", "drain", "fail", "not_responding", "power_down", "powered_down",
              "maint", "reboot")


class HostPool:
    """The hosts of the next launch: ``read()`` ([(host, slots)], called before every launch)
    minus the hosts excluded less than ``cooldown_s`` seconds ago (0: never excluded).
    ``good``: the hosts read at start, used when the first read fails."""

    def __init__(self, read, cooldown_s, clock=time.monotonic, good=None, sleep=time.sleep):
        self.read, self.cooldown_s, self.clock, self.sleep = read, cooldown_s, clock, sleep
        self.excluded = {}           # host -> (until, cause)
        self.last = None             # the hosts the previous call returned
        self.good = good             # the last list read without an error

    def exclude(self, host, cause):
        """Leave ``host`` out of the launches of the next ``cooldown_s`` seconds; returns
        whether it was (not with a cool-down of 0, nor when it is the only host listed)."""
        listed = [h for h, _ in self.last or []]
        if not self.cooldown_s or host is None or listed == [host] or host not in listed:
            return False
        self.excluded[host] = (self.clock() + self.cooldown_s, cause)
        log(f"host {host} left out for {self.cooldown_s:g} s (--exclude-cooldown): {cause}")
        return True

    def hosts(self):
        """[(host, slots)] to launch on now; logs hosts added, gone, left out and back."""
        listed, now = self._read(), self.clock()
        back = [h for h, (until, _) in self.excluded.items() if until <= now]
        for host in back:
            del self.excluded[host]
            log(f"host {host} is back: its cool-down ended")
        usable = [(h, s) for h, s in listed if h not in self.excluded]
        if self.last is not None:
            before = {h for h, _ in self.last} | set(back)
            added = [h for h, _ in usable if h not in before]
            gone = sorted(before - {h for h, _ in listed})
            if added:
                log(f"host(s) added: {', '.join(added)}")
            if gone:
                log(f"host(s) no longer listed: {', '.join(gone)}")
        if not usable:
            waiting = ", ".join(f"{h} ({until - now:.0f} s)" for h, (until, _) in
                                sorted(self.excluded.items()))
            raise ValueError(f"no host left to launch on: every listed host is left out "
                             f"after a failure ({waiting}); lower --exclude-cooldown or list "
                             f"more hosts")
        self.last = usable
        return usable

    def _read(self):
        """``read()``, tried ``READ_TRIES`` times when it fails (ValueError, OSError), then the
        last good list; the error when there is none."""
        for attempt in range(1, READ_TRIES + 1):
            try:
                self.good = self.read()
                return self.good
            except (ValueError, OSError) as e:
                if self.good is None:
                    raise
                if attempt < READ_TRIES:
                    log(f"reading the hosts failed ({e}): trying again in {READ_RETRY_S:g} s "
                        f"(read {attempt} of {READ_TRIES})")
                    self.sleep(READ_RETRY_S)
                    continue
                log(f"reading the hosts failed {READ_TRIES} times ({e}): launching on the last "
                    f"good list ({', '.join(f'{h}:{s}' for h, s in self.good)})")
        return self.good


def discovered_hosts(command):
    """[(host, slots)] printed by the shell ``command`` (hostfile lines, as Horovod's
    ``--host-discovery-script`` prints ``host:slots``); ValueError naming the command."""
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True,
                              timeout=DISCOVERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ValueError(f"host discovery command {command!r} did not finish within "
                         f"{DISCOVERY_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise ValueError(f"host discovery command {command!r} exited with status "
                         f"{done.returncode}: {done.stderr.strip()[-200:]}")
    return parse_hostlines(done.stdout.splitlines(), f"host discovery {command!r}",
                           f"host discovery command {command!r}")


def slurm_hosts_up(hosts, run=subprocess.run):
    """``hosts`` [(host, slots)] of a Slurm allocation without the nodes Slurm reports down,
    drained or failing (``sinfo``); all of them when sinfo is missing or fails (logged)."""
    if not hosts or shutil.which("sinfo") is None:
        return hosts
    try:
        done = run(["sinfo", "-h", "-N", "-n", ",".join(h for h, _ in hosts), "-o", "%N %T"],
                   capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        log(f"sinfo failed ({e}): using every node of the allocation")
        return hosts
    if done.returncode != 0:
        log(f"sinfo failed ({done.stderr.strip()[-200:]}): using every node of the allocation")
        return hosts
    down = {name for name, state in (line.split()[:2] for line in done.stdout.splitlines()
                                     if len(line.split()) >= 2)
            if set(state.rstrip("*~#!%$@^-").lower().split("+")) & set(SLURM_DOWN)
            or state.endswith("*")}                # "*": the node is not responding
    if down:
        log(f"Slurm reports node(s) {', '.join(sorted(down))} down: leaving them out")
    return [(h, s) for h, s in hosts if h not in down]


def host_source(args):
    """The ``read()`` of a :class:`HostPool` for the launcher's flags, or None (one machine,
    ``--slots``): the discovery command, else the hostfile, else the allocation's nodes that
    Slurm still reports up (PBS's $PBS_NODEFILE as it is)."""
    if getattr(args, "host_discovery_script", None):
        return lambda: discovered_hosts(args.host_discovery_script)
    if args.hostfile:
        return lambda: read_hostfile(args.hostfile)
    if args.hosts:
        def from_allocation():
            source, hosts = allocation()
            return slurm_hosts_up(hosts) if source.startswith("Slurm") else hosts
        return from_allocation
    return None
