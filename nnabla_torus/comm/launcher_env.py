"""What the launcher told this process: who started it, how many tasks, its rank.

Launchers (``srun``, Open MPI's ``mpirun``, hydra's ``mpiexec`` of MPICH and Intel MPI, PBS)
describe the job in environment variables, and the MPI library finds its peers through its own
channel (PMIx, PMI). When the two disagree, for example ``srun -n 8`` of a program whose MPI
cannot talk to Slurm (the pip Open MPI without ``--mpi=pmix``), every process starts a world
of one and trains alone, silently. :func:`world_mismatch` turns that into one line per process
(the communicator's import then exits); :func:`world_warning` says what is odd but harmless (a
world larger than a stale variable says, one process alone in an allocation); :func:`quiet_pmix`
removes the PMIx help-file noise of ``srun --mpi=pmix``. (The hosts and
slots of a Slurm or PBS job: :func:`nnabla_torus.launching.hostlists.allocation`.) Cluster
recipes and what each error means: docs/clusters.md. Example::

    launch = launched()          # Launch(launcher='srun', size=8, rank=3, variable=...)
    world_mismatch(MPI)          # after MPI_Init: (line, place) if MPI's world is not launch.size
"""
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """This process as its launcher numbered it: ``size`` tasks in the job step, ``rank`` (0 ..
    size - 1; None when the launcher does not say) and the variable ``size`` was read from.

    No local rank: the GPU is nnabla's choice, the number of earlier ranks on the same host
    (nnabla-ext-cuda ``multi_process_data_parallel_communicator.cu`` ~401-424), which the
    communicator's ``local_rank`` follows; under srun it equals ``SLURM_LOCALID``
    (tests/slurm)."""
    launcher: str
    size: int
    rank: object
    variable: str


# (size variable, rank variable, launcher), first match wins: an MPI
# launcher started inside a Slurm step (mpirun in sbatch runs its daemons with srun) is the one
# that started the ranks, so its variables come before Slurm's.
#   Open MPI 5 (PRRTE): OMPI_COMM_WORLD_SIZE/_RANK.
#   hydra (MPICH, Intel MPI) and Slurm's pmi2 plugin: PMI_SIZE/PMI_RANK (PMI-1/2 wire
#   protocol); hydra adds MPI_LOCALNRANKS.
#   Slurm's srun: SLURM_STEP_NUM_TASKS/SLURM_PROCID per task of a step (the batch script of
#   sbatch has SLURM_NTASKS but no step: it is one process, not N).
LAUNCHERS = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpirun"),
    ("PMI_SIZE", "PMI_RANK", None),   # named by _pmi_launcher
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun"),
)


def _integer(environ, name):
    text = environ.get(name, "")
    return int(text) if text.strip().isdigit() else None


def _pmi_launcher(environ):
    if "MPI_LOCALNRANKS" in environ:
        return "hydra (mpiexec of MPICH or Intel MPI)"
    return "srun --mpi=pmi2" if "SLURM_STEP_ID" in environ else "a PMI launcher"


def launched(environ=None):
    """The :class:`Launch` the environment describes, or None (started by hand, ``python x.py``,
    or by a launcher that sets none of ``LAUNCHERS``)."""
    environ = os.environ if environ is None else environ
    for size_name, rank_name, who in LAUNCHERS:
        size = _integer(environ, size_name)
        if size is not None and size >= 1:
            return Launch(who or _pmi_launcher(environ), size, _integer(environ, rank_name),
                          size_name)
    return None


def launcher_rank(environ=None):
    """This process's rank as its launcher numbered it, readable before MPI starts: the first
    of the ``LAUNCHERS``' rank variables set, then PMIx's; 0 outside a launcher."""
    environ = os.environ if environ is None else environ
    names = [rank for _, rank, _ in LAUNCHERS] + ["PMIX_RANK"]
    return next((r for r in (_integer(environ, n) for n in names) if r is not None), 0)


def library_name(MPI):
    """The MPI library mpi4py runs on, short: "Open MPI v5.0.11", "MPICH Version: 5.0.2"."""
    first = MPI.Get_library_version().strip().splitlines()[0]
    return " ".join(first.split(",")[0].split())


def mismatch_fix(launch, library, python=None):
    """The fix for a world that is not the launcher's: which launch flag or mpirun to use."""
    python = python or sys.executable
    beside = os.path.join(os.path.dirname(python), "mpirun")
    mpirun = beside if os.path.exists(beside) else "the mpirun of that library"
    if launch.launcher.startswith("srun"):
        # the pip MPICH 5 joins a Slurm step over PMI-2 only ("unsupported PMI version PMIx")
        plugin = "pmix" if library.startswith("Open MPI") else "pmi2"
        extra = (" with I_MPI_PMI_LIBRARY=<Slurm's libpmi2.so>"
                 if library.startswith("Intel") else "")
        return (f"launch with srun --mpi={plugin}{extra} (srun --mpi=list shows what this "
                f"Slurm has; --mpi=pmix needs Slurm's libpmix), or inside the allocation with "
                f"{mpirun} -np {launch.size} {python} ...")
    return (f"launch with the mpirun of the MPI library mpi4py uses ({library}): {mpirun}")


def world_mismatch(MPI, environ=None):
    """``(message, place)`` when MPI's world has fewer ranks than its launcher started, else
    None: one line naming the launcher, its task count, the MPI library and the fix, and this
    task (for ``failfast.abort_job(message, 1, place=place)``, which the communicator's import
    calls). None too when no launcher variable is set, and when the world is larger than the
    launcher's count: tasks that trained alone make smaller worlds, never a larger one, so a
    larger world means a variable left by another launcher (:func:`world_warning`).
    """
    launch = launched(environ)
    world = MPI.COMM_WORLD.Get_size()
    if launch is None or launch.size <= world:
        return None
    library = library_name(MPI)
    consequence = ("each task would train alone" if world == 1 else
                   f"the tasks form {launch.size / world:g} separate jobs of {world}")
    task = "?" if launch.rank is None else launch.rank
    return (f"nnabla_torus: {launch.launcher} started {launch.size} tasks ({launch.variable}="
            f"{launch.size}) but MPI ({library}) sees a world of {world}: {consequence}. "
            f"Fix: {mismatch_fix(launch, library)}",
            f"task {task} (MPI rank {MPI.COMM_WORLD.Get_rank()} of {world}) on host "
            f"{MPI.Get_processor_name()}")


def world_warning(MPI, environ=None):
    """One line when the world is not what the launcher variables suggest but nothing is wrong
    enough to stop the job, else None (the communicator logs it once, on rank 0):

    - a world *larger* than the launcher's count: a variable this process inherited from an
      enclosing launcher, not its own (MPICH's ``mpirun -pmi-port`` inside ``sbatch`` sets
      ``PMI_PORT``/``PMI_ID`` but no ``PMI_SIZE``, and the ``SLURM_STEP_NUM_TASKS`` seen is that
      of hydra's proxy step);
    - a world of one with no launcher, inside a Slurm allocation of N > 1 tasks (``salloc -n 4``
      then ``python train.py``, or the batch script itself): one process trains while the
      allocation's other tasks sit idle, on a login or batch node.
    """
    environ = os.environ if environ is None else environ
    launch = launched(environ)
    world = MPI.COMM_WORLD.Get_size()
    if launch is not None and launch.size < world:
        return (f"nnabla_torus: warning: {launch.variable}={launch.size} says {launch.launcher} "
                f"started {launch.size} task(s), but MPI ({library_name(MPI)}) sees a world of "
                f"{world}: a variable of another launcher, ignored; training on {world} ranks")
    tasks = _integer(environ, "SLURM_NTASKS")
    if launch is None and world == 1 and tasks and tasks > 1:
        python = sys.executable
        return (f"nnabla_torus: warning: one process trains alone inside Slurm job "
                f"{environ.get('SLURM_JOB_ID', '?')} of {tasks} tasks (SLURM_NTASKS={tasks}); "
                f"the other tasks sit idle. Fix: srun --mpi=pmix {python} ... (srun --mpi=list "
                f"shows what this Slurm has), or mpirun -np {tasks} {python} ...")
    return None


def fault_tolerance_note(MPI, host_names, environ=None):
    """One line when Open MPI's fault tolerance is on and the ranks span hosts, else None.

    ``mpirun --mca mpi_ft_enable 1`` (``FAULT_ARGS``) and ``--with-ft ulfm`` set
    ``OMPI_MCA_mpi_ft_enable``; then Open MPI 5 opens only the ob1 PML (measured:
    ``pml_base_verbose``): the ucx and cm PMLs and every MTL are disabled (Open MPI docs,
    features/ulfm.rst, "Modified, Untested and Disabled Components"). MPI messages between
    hosts then use ob1's BTLs: uct (InfiniBand) where UCX finds its devices, else tcp.
    ``host_names``: every rank's ``MPI.Get_processor_name()``.
    """
    environ = os.environ if environ is None else environ
    enabled = environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in ("1", "true")
    if not enabled or len(set(host_names)) < 2 or "Open MPI" not in library_name(MPI):
        return None
    return ("Open MPI fault tolerance is on (mpi_ft_enable): MPI messages between hosts use "
            "the ob1 PML (uct for InfiniBand, else tcp), not UCX; for UCX add --mca "
            "mpi_ft_enable 0 after it (nnabla-torus-run --mpirun-args '--mca mpi_ft_enable 0')"
            ", and a lost rank is then named by mpirun only")


def quiet_pmix(environ=None):
    """Under ``srun --mpi=pmix``, select PMIx's ``native`` security component before MPI starts.

    Slurm offers ``PMIX_SECURITY_MODE=munge,native``; a PMIx built without munge (the pip Open
    MPI's) tries munge first and prints a "Sorry! You were supposed to get help about
    find-available:not-valid ... help-pmix-mca-base.txt" block per rank (its help files are
    looked for under its build prefix, /opt/openmpi). ``native`` authenticates the local
    connection to slurmd by the socket's peer credentials, which Slurm accepts. Nothing when the
    user chose (``PMIX_MCA_psec`` set), when native is not offered, or when it is offered first
    (Open MPI's own mpirun offers ``native`` alone).
    """
    environ = os.environ if environ is None else environ
    modes = environ.get("PMIX_SECURITY_MODE", "").split(",")
    if "native" in modes[1:]:
        environ.setdefault("PMIX_MCA_psec", "native")
