"""examples/imagenet/train.sbatch's launch lines, run by bash with stand-ins for the venv's
python and mpirun (the whole script under a real Slurm: tests/slurm/test_slurm.py)."""
import glob
import os
import re
import subprocess

import pytest

from tests.mpirun import REPO

SCRIPT = os.path.join(REPO, "examples", "imagenet", "train.sbatch")


def launch_env(tmp_path, launch):
    """The environment the script's launcher sees, as its stand-in printed it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "mpirun"):
        stand_in = bin_dir / name
        stand_in.write_text("#!/bin/sh\nenv > \"$ENV_OUT\"\n")
        stand_in.chmod(0o755)
    out = tmp_path / "env.txt"
    env = dict(os.environ, SLURM_SUBMIT_DIR=REPO, SLURM_JOB_ID="7", SLURM_NTASKS="8",
               SLURM_JOB_NODELIST="n[1-2]", SLURM_GPUS_PER_TASK="1",
               SLURM_TRES_PER_TASK="cpu:8,gres/gpu:1", VENV=str(tmp_path), LAUNCH=launch,
               ENV_OUT=str(out))
    subprocess.run(["bash", SCRIPT], env=env, check=True, capture_output=True, timeout=60)
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)


@pytest.mark.parametrize("launch", ["run", "mpirun"])
def test_issue66_mpiruns_daemon_step_gets_every_gpu_of_its_node(tmp_path, launch):
    """sbatch's --gpus-per-task=1 reaches srun through SLURM_GPUS_PER_TASK (srun(1), input
    environment); mpirun starts its remote daemons with srun (PRRTE plm/slurm), so with it
    set the ranks on the other nodes would see one GPU each. The launchers run without it."""
    env = launch_env(tmp_path, launch)
    assert "SLURM_GPUS_PER_TASK" not in env and "SLURM_TRES_PER_TASK" not in env, env
    assert env["SLURM_JOB_ID"] == "7"


def test_issue66_one_gpu_binding_rule_everywhere():
    """srun's --gpu-bind=closest (or per_task) leaves each task its own GPU, where nnabla's
    communicator picks GPU <local rank> (ext .cu ~401-424): the docs and the shipped script
    give --gpu-bind=none only."""
    files = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True) + [SCRIPT]
    binds = set()
    for f in files:
        commands = [line for line in open(f).read().replace("\\\n", " ").splitlines()
                    if not line.lstrip().startswith("#")]     # a continued srun line is one
        binds |= {(os.path.relpath(f, REPO), value) for line in commands
                  for value in re.findall(r"\bsrun\s[^`\n]*?--gpu-bind=([\w:]+)", line)}
    assert binds and {value for _, value in binds} == {"none"}, sorted(binds)
