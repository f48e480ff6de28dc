"""The launcher's variables: who started this process and how many tasks; the world check's
one line (a fake MPI here; the real srun: tests/slurm); PMIx's quiet mode; the allocation."""
import os
import subprocess
import sys

import pytest

from nnabla_torus.comm import launcher_env
from nnabla_torus.comm.launcher_env import Launch, launched
from nnabla_torus.launching.hostlists import allocation
from tests.slowdown import scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_launcher_is_read_from_its_own_variables_first():
    assert launched({}) is None
    assert launched({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) is None   # sbatch's script
    srun = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1"}
    assert launched(srun) == Launch("srun", 8, 3, "SLURM_STEP_NUM_TASKS")
    # mpirun inside an allocation: its daemons run in a Slurm step of one task per node
    inside = dict(srun, SLURM_STEP_NUM_TASKS="1", OMPI_COMM_WORLD_SIZE="4",
                  OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_LOCAL_RANK="2")
    assert launched(inside) == Launch("Open MPI's mpirun", 4, 2, "OMPI_COMM_WORLD_SIZE")
    hydra = {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "1"}
    assert launched(hydra).launcher.startswith("hydra")
    assert launched({**srun, "PMI_SIZE": "8", "PMI_RANK": "3"}).launcher == "srun --mpi=pmi2"
    assert launcher_env.launcher_rank(srun) == 3
    assert launcher_env.launcher_rank({"PMIX_RANK": "5"}) == 5
    assert launcher_env.launcher_rank({}) == 0


class FakeWorld:
    def __init__(self, size):
        self.size = size

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return 0


class FakeMPI:
    def __init__(self, size, version="Open MPI v5.0.11, package: Open MPI user@localhost"):
        self.COMM_WORLD, self.version = FakeWorld(size), version

    def Get_library_version(self):
        return self.version + "\n"

    def Get_processor_name(self):
        return "node7"


def test_a_world_unlike_the_launchers_is_one_line():
    srun = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "3"}
    assert launcher_env.world_mismatch(FakeMPI(8), srun) is None
    assert launcher_env.world_mismatch(FakeMPI(1), {}) is None
    message, place = launcher_env.world_mismatch(FakeMPI(1), srun)
    assert "\n" not in message
    assert place == "task 3 (MPI rank 0 of 1) on host node7"
    assert message.startswith("nnabla_torus: srun started 8 tasks (SLURM_STEP_NUM_TASKS=8) but "
                              "MPI (Open MPI v5.0.11) sees a world of 1: each task would train "
                              "alone. Fix: launch with srun --mpi=pmix ")
    message, _ = launcher_env.world_mismatch(
        FakeMPI(2, "MPICH Version:\t5.0.2\nMPICH Release date: x"), srun)
    assert "MPI (MPICH Version: 5.0.2) sees a world of 2: the tasks form 4 separate jobs of 2" \
        in message and "srun --mpi=pmi2 (srun --mpi=list" in message
    message, _ = launcher_env.world_mismatch(
        FakeMPI(1, "Intel(R) MPI Library 2021.18 for Linux* OS"),
        {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"})
    assert message.startswith("nnabla_torus: Open MPI's mpirun started 4 tasks")
    assert "Fix: launch with the mpirun of the MPI library mpi4py uses (Intel(R) MPI Library " \
           "2021.18 for Linux* OS)" in message


def test_a_world_larger_than_the_launchers_count_is_a_warning_not_an_abort():
    """MPICH's mpirun -pmi-port inside sbatch -n 2: hydra sets PMI_PORT/PMI_ID but no PMI_SIZE,
    and the SLURM_STEP_NUM_TASKS seen is its proxy step's 1; the world of 2 is right."""
    hydra_in_sbatch = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1",
                       "SLURM_PROCID": "0", "PMI_PORT": "vm:41000", "PMI_ID": "1"}
    mpich = FakeMPI(2, "MPICH Version:\t5.0.2\nMPICH Release date: x")
    assert launcher_env.world_mismatch(mpich, hydra_in_sbatch) is None
    warning = launcher_env.world_warning(mpich, hydra_in_sbatch)
    assert "\n" not in warning and warning.startswith(
        "nnabla_torus: warning: SLURM_STEP_NUM_TASKS=1 says srun started 1 task(s), but MPI "
        "(MPICH Version: 5.0.2) sees a world of 2: a variable of another launcher, ignored")
    assert launcher_env.world_warning(FakeMPI(8), {"SLURM_STEP_NUM_TASKS": "8"}) is None


def test_open_mpis_fault_tolerance_across_hosts_names_the_transport():
    """With mpi_ft_enable Open MPI 5 opens only the ob1 PML (no UCX): said once, where it
    matters (ranks on several hosts), with the override that gives UCX back."""
    on, hosts = {"OMPI_MCA_mpi_ft_enable": "1"}, ["h0", "h0", "h1", "h1"]
    line = launcher_env.fault_tolerance_note(FakeMPI(4), hosts, on)
    assert "\n" not in line and line.startswith(
        "Open MPI fault tolerance is on (mpi_ft_enable): MPI messages between hosts use the ob1 "
        "PML (uct for InfiniBand, else tcp), not UCX; for UCX add --mca mpi_ft_enable 0 after it")
    assert launcher_env.fault_tolerance_note(FakeMPI(4), hosts, {"OMPI_MCA_mpi_ft_enable": "true"})
    assert launcher_env.fault_tolerance_note(FakeMPI(2), ["h0", "h0"], on) is None   # one host
    assert launcher_env.fault_tolerance_note(FakeMPI(4), hosts, {}) is None
    assert launcher_env.fault_tolerance_note(
        FakeMPI(4), hosts, {"OMPI_MCA_mpi_ft_enable": "0"}) is None   # the override
    mpich = FakeMPI(4, "MPICH Version:\t5.0.2\nMPICH Release date: x")
    assert launcher_env.fault_tolerance_note(mpich, hosts, on) is None


def test_the_fault_flag_reaches_the_ranks_as_the_variable_read():
    """mpirun's --mca mpi_ft_enable 1 (FAULT_ARGS) sets OMPI_MCA_mpi_ft_enable in the ranks; a
    later --mca mpi_ft_enable 0 wins."""
    from nnabla_torus.launching.mpirun_cmd import mpi_library, mpirun_command, mpirun_path
    if mpi_library(mpirun_path()) != "openmpi":
        pytest.skip("needs Open MPI's mpirun")
    show = ["-c", "import os; print('ft=' + os.environ.get('OMPI_MCA_mpi_ft_enable', ''))"]
    for extra, value in (((), "ft=1"), (("--mca", "mpi_ft_enable", "0"), "ft=0")):
        done = subprocess.run(mpirun_command(1, show, extra), capture_output=True, text=True,
                              timeout=120)
        assert value in done.stdout.split(), done.stdout + done.stderr


def test_one_rank_alone_in_an_allocation_of_many_tasks_is_warned():
    """salloc -n 4, then python train.py: one process trains, three tasks idle."""
    salloc = {"SLURM_JOB_ID": "12", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "vm"}
    warning = launcher_env.world_warning(FakeMPI(1), salloc)
    assert warning.startswith("nnabla_torus: warning: one process trains alone inside Slurm "
                              "job 12 of 4 tasks (SLURM_NTASKS=4)") and "srun --mpi=pmix" in warning
    assert launcher_env.world_warning(FakeMPI(1), dict(salloc, SLURM_NTASKS="1")) is None
    assert launcher_env.world_warning(FakeMPI(1), {}) is None
    env = dict(os.environ, PYTHONPATH=REPO, **salloc)
    done = subprocess.run([sys.executable, "-c", "import nnabla_torus.comm.communicator"],
                          env=env, capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line for line in done.stderr.splitlines() if "nnabla_torus:" in line] == \
        [warning], done.stderr


def test_a_launcher_variable_without_its_job_stops_a_real_process():
    """One process told it is one of 3 (a mismatched launcher's variable) exits 1 at import,
    with one line, before any collective could wait for the others."""
    env = dict(os.environ, PYTHONPATH=REPO, OMPI_COMM_WORLD_SIZE="3", OMPI_COMM_WORLD_RANK="2")
    done = subprocess.run([sys.executable, "-c", "import nnabla_torus.comm.communicator"],
                          env=env, capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "nnabla_torus:" in line]
    assert len(lines) == 1 and lines[0].startswith("task 2 (MPI rank 0 of 1) on host "), \
        done.stderr
    assert "Open MPI's mpirun started 3 tasks (OMPI_COMM_WORLD_SIZE=3)" in lines[0]


def test_quiet_pmix_picks_native_only_when_slurm_offers_it():
    env = {"PMIX_SECURITY_MODE": "munge,native"}
    launcher_env.quiet_pmix(env)
    assert env["PMIX_MCA_psec"] == "native"
    env = {"PMIX_SECURITY_MODE": "munge,native", "PMIX_MCA_psec": "munge"}
    launcher_env.quiet_pmix(env)
    assert env["PMIX_MCA_psec"] == "munge"            # the user's choice stays
    for offered in ("munge", "native", "native,munge"):     # mpirun offers native alone
        env = {"PMIX_SECURITY_MODE": offered}
        launcher_env.quiet_pmix(env)
        assert "PMIX_MCA_psec" not in env, offered
    env = {}
    launcher_env.quiet_pmix(env)
    assert env == {}


def test_the_allocation_of_a_slurm_or_pbs_job(tmp_path):
    assert allocation({}) is None
    slurm = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "gpu[01-03],cpu7",
             "SLURM_TASKS_PER_NODE": "4(x3),2"}
    assert allocation(slurm) == ("Slurm job 12", [("gpu01", 4), ("gpu02", 4), ("gpu03", 4),
                                                  ("cpu7", 2)])
    with pytest.raises(ValueError, match="names 4 host.s. but SLURM_TASKS_PER_NODE='4.x2.' "
                                         "gives 2 count"):
        allocation(dict(slurm, SLURM_TASKS_PER_NODE="4(x2)"))
    with pytest.raises(ValueError, match="has no SLURM_TASKS_PER_NODE"):
        allocation({"SLURM_JOB_NODELIST": "a"})
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("a0001\na0001\na0001\na0001\na0002\na0002\na0002\na0002\n")
    assert allocation({"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "7.pbs"}) == (
        "PBS job 7.pbs ($PBS_NODEFILE)", [("a0001", 4), ("a0002", 4)])


def test_one_gpu_per_task_under_srun_names_the_binding(monkeypatch):
    """srun --gpus-per-task=1 shows each task only its GPU; nnabla wants GPU <local rank>."""
    import types
    from nnabla_torus.comm.backends import cuda_env
    fake = types.ModuleType("nnabla_ext.cuda.init")
    fake.get_device_count = lambda: 1
    monkeypatch.setitem(sys.modules, "nnabla_ext.cuda", types.ModuleType("nnabla_ext.cuda"))
    monkeypatch.setitem(sys.modules, "nnabla_ext.cuda.init", fake)
    cuda_env.check_device(0, 4)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    with pytest.raises(RuntimeError, match="needs GPU 2 .* check CUDA_VISIBLE_DEVICES$"):
        cuda_env.check_device(2, 4)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    with pytest.raises(RuntimeError, match=r"under srun, --gpus-per-task binds each task to one "
                                           r"GPU: add srun --gpu-bind=none"):
        cuda_env.check_device(2, 4)
