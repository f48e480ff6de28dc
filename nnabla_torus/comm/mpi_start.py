"""Start MPI as the communicator needs it: quietly, with fail-fast on, in the launcher's world.

The communicator imports this module before anything that imports mpi4py, so the settings MPI
reads at start are in place when it starts. Then :mod:`nnabla_torus.comm.failfast` is installed
(an error on one rank ends the job, errors before ``init()`` too), and every process whose MPI
world is not the one its launcher started stops (:func:`.launcher_env.world_mismatch`); rank 0
warns of a world that is odd but harmless (:func:`.launcher_env.world_warning`).
"""
import os

# Open MPI 5's one-sided UCX component prints an error line for every window it declines
# (no UCX network here); our windows are all shared memory (osc/sm). Read at MPI start, so
# this only helps when the communicator is imported first; mpirun --mca osc ^ucx always does.
os.environ.setdefault("OMPI_MCA_osc", "^ucx")
from . import launcher_env  # noqa: E402
launcher_env.quiet_pmix()   # srun --mpi=pmix: no help-file noise per rank (read at MPI start)
from mpi4py import MPI  # noqa: E402  (starts MPI)

from . import failfast  # noqa: E402
from .job_log import WARNING, note  # noqa: E402

failfast.install()  # MPI has started (mpi4py.MPI): from here on, one rank's error ends the job
_mismatch = launcher_env.world_mismatch(MPI)  # srun -n 8 without PMI: 8 one-rank worlds
if _mismatch:
    failfast.abort_job(_mismatch[0], 1, place=_mismatch[1])   # one line each, then exit
_world_warning = launcher_env.world_warning(MPI)   # a stale variable; one rank in salloc -n 4
if _world_warning and MPI.COMM_WORLD.Get_rank() == 0:
    note(_world_warning, WARNING)
