"""mpirun_cmd tells the MPI library from ``mpirun --version`` and gives each its own flags.

The version texts are the first lines the three libraries' launchers print (Open MPI 5.0.11,
MPICH 5.0.2's hydra, Intel MPI 2021.18.1 from their PyPI wheels).
"""
import os
import stat
import sys

import pytest

from nnabla_torus.launching import mpirun_cmd
from tests.slowdown import scaled

VERSIONS = {
    "openmpi": "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/",
    "mpich": "HYDRA build details:\n    Version:                                 5.0.2",
    "impi": "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)",
}


@pytest.mark.parametrize("library", sorted(VERSIONS))
def test_the_library_is_read_from_its_version_text(library):
    assert mpirun_cmd.library_of_version(VERSIONS[library]) == library


def test_an_unknown_launcher_is_other_and_gets_no_flags():
    assert mpirun_cmd.library_of_version("srun 23.02") == "other"
    assert mpirun_cmd.launch_args("other", environ={}, root=True) == []


def test_open_mpi_flags_for_root_and_without_the_fault_flag():
    assert mpirun_cmd.launch_args("openmpi", environ={}, root=True) == [
        "--oversubscribe", "--mca", "mpi_ft_enable", "1", "--allow-run-as-root"]
    assert mpirun_cmd.launch_args("openmpi", fault=False, environ={}, root=False) == [
        "--oversubscribe"]


def test_mpich_needs_no_flags():
    assert mpirun_cmd.launch_args("mpich", environ={}, root=True) == []


def test_intel_mpi_uses_shared_memory_unless_a_fabric_is_set():
    assert mpirun_cmd.launch_args("impi", environ={}, root=False) == [
        "-genv", "I_MPI_FABRICS", "shm"]
    assert mpirun_cmd.launch_args("impi", environ={"I_MPI_FABRICS": "shm:ofi"}) == []


def fake_launcher(folder, name, version):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\ncat <<'EOF'\n{version}\nEOF\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def test_the_command_runs_the_venvs_launcher_with_its_flags(tmp_path):
    """Intel MPI's mpirun is a script that wants mpiexec.hydra on PATH: the command runs the
    mpiexec.hydra beside it, and the version is asked with its folder first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = str(bin_dir / "python")
    os.symlink(sys.executable, python)
    mpirun = bin_dir / "mpirun"                 # the script, as Intel ships it (shortened)
    mpirun.write_text("#!/bin/sh\nmpiexec.hydra \"$@\"\n")
    mpirun.chmod(0o755)
    hydra = fake_launcher(str(bin_dir), "mpiexec.hydra", VERSIONS["impi"])
    cmd = mpirun_cmd.mpirun_command(3, ["prog.py"], python=python)
    assert cmd[0] == hydra
    assert cmd[-3:] == ["3", python, "prog.py"] and cmd[-4] == "-np"
    if "I_MPI_FABRICS" not in os.environ:
        assert cmd[1:4] == ["-genv", "I_MPI_FABRICS", "shm"]


def test_no_mpirun_names_every_way_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError) as error:
        mpirun_cmd.mpirun_path(str(tmp_path / "python"))
    for option in ("[openmpi]", "[mpich]", "[impi]", "MPI=mpich make venv", "system MPI"):
        assert option in str(error.value), option


def test_environment_flags_per_library():
    env = {"A": "1", "B": "x y"}
    assert mpirun_cmd.env_args("openmpi", env, ["A", "B"]) == ["-x", "A", "-x", "B"]
    for hydra in ("mpich", "impi"):
        assert mpirun_cmd.env_args(hydra, env, ["A", "B"]) == [
            "-genv", "A", "1", "-genv", "B", "x y"]
    assert mpirun_cmd.env_args("other", env, ["A"]) == []


def test_hosts_are_written_in_each_librarys_format(tmp_path):
    hosts = [("node01", 4), ("node02", 2)]
    flag, path = mpirun_cmd.hostfile_args("openmpi", hosts, str(tmp_path))
    assert flag == "--hostfile"
    assert open(path).read() == "node01 slots=4\nnode02 slots=2\n"
    for hydra in ("mpich", "impi"):
        flag, path = mpirun_cmd.hostfile_args(hydra, hosts, str(tmp_path))
        assert flag == "-machinefile"
        assert open(path).read() == "node01:4\nnode02:2\n"
    with pytest.raises(ValueError, match="--mpirun-args"):
        mpirun_cmd.hostfile_args("other", hosts, str(tmp_path))


def test_nnabla_torus_mpirun_runs_a_users_script_as_root_and_oversubscribed(tmp_path):
    """The console script runs a script of the user's on more ranks than this machine has
    cores, as whoever runs the tests (root in CI and containers), with no flag of their own."""
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(sys.executable), "nnabla-torus-mpirun")
    if not os.path.exists(script):
        pytest.skip(f"{script} not installed (pip install -e . puts it there)")
    program = tmp_path / "hello.py"
    program.write_text("from mpi4py import MPI\nprint('RANK', MPI.COMM_WORLD.Get_rank(), 'OF', "
                       "MPI.COMM_WORLD.Get_size())\n")
    ranks = (os.cpu_count() or 1) + 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    done = subprocess.run([script, "-np", str(ranks), str(program)], env=env,
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("RANK")) == \
        sorted(f"RANK {r} OF {ranks}" for r in range(ranks)), done.stdout


def test_a_bad_np_environment_value_is_one_line(monkeypatch, capsys):
    """NP=x was a ValueError traceback from int()."""
    monkeypatch.setenv("NP", "x")
    with pytest.raises(SystemExit):
        mpirun_cmd.main(["prog.py"])
    assert "environment variable NP='x': must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("environ, fault", [
    ({}, False),
    ({"SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "4"}, False),
    ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}, True),
    ({"PRTE_MCA_prte_default_hostfile": "/etc/mpi.hosts"}, True),
])
def test_the_wrapper_adds_the_fault_flag_only_where_ranks_may_span_hosts(monkeypatch, capsys,
                                                                          environ, fault):
    """Before: always added; on one host Open MPI then warned "The selected 'osc' module 'sm'
    is not tested for post-failure operation" at every run."""
    for name in os.environ:
        if name.startswith(("SLURM_", "PBS_")) or name in mpirun_cmd.HOSTFILE_ENVS:
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(mpirun_cmd, "mpi_library", lambda mpirun: "openmpi")
    ran, bases = [], []
    monkeypatch.setattr(mpirun_cmd.subprocess, "call", lambda cmd, env: ran.append(cmd) or
                        bases.append(env.get("PRTE_MCA_prte_tmpdir_base")) or 0)
    assert mpirun_cmd.main(["-np", "2", "prog.py"]) == 0
    assert (bases[0] is None) == fault          # a private session base on one host only
    assert ("mpi_ft_enable" in ran[0]) == fault and ("mpi_ft_enable" in capsys.readouterr().out
                                                      ) == fault, ran
    assert mpirun_cmd.main(["--no-fault-args", "-np", "2", "prog.py"]) == 0
    assert "mpi_ft_enable" not in ran[1]


# -- Open MPI's session folder ------------------------------------------------------------------
def test_a_job_on_this_host_gets_a_private_session_base_removed_after():
    env = {"PATH": os.environ["PATH"]}
    with mpirun_cmd.private_session_base(env) as job_env:
        base = job_env["PRTE_MCA_prte_tmpdir_base"]
        assert job_env["OMPI_MCA_orte_tmpdir_base"] == base
        assert stat.S_IMODE(os.stat(base).st_mode) == 0o700 and os.listdir(base) == []
    assert not os.path.exists(base)
    assert env == {"PATH": os.environ["PATH"]}          # the caller's dict is left as it was


@pytest.mark.parametrize("env, args", [
    ({"PRTE_MCA_prte_tmpdir_base": "/scratch/me"}, []),             # the user's own base
    ({}, ["--hostfile", "hosts"]),                                 # other hosts
    ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}, []),  # 2 hosts
], ids=["user-base", "hostfile", "slurm-2-hosts"])
def test_the_session_base_is_left_alone_for_a_user_base_or_other_hosts(env, args):
    with mpirun_cmd.private_session_base(env, args) as job_env:
        assert job_env == env
