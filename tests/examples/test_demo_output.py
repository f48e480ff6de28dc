"""The main job launched as ``make demo`` launches it prints no library banner.

``make demo`` runs ``python -m nnabla_torus.launching.mpirun_cmd -np N examples/imagenet/train.py``
with the user's environment, not tests/mpirun.py's (which sets OMPI_MCA_osc): so the example
itself must start MPI the communicator's way. Importing ``mpi4py.MPI`` first made Open MPI 5
print an osc/ucx error line for every shared-memory window of every rank.
"""
import os
import subprocess
import sys

import pytest

from tests.examples.test_train_plan import TINY, TRAIN
from tests.mpirun import REPO
from tests.slowdown import scaled

BANNERS = ("osc_ucx_component", "Initializing CPU extension", "WARNING: The selected 'osc'",
           "more processes have sent help message")


@pytest.mark.slow
def test_demo_launch_prints_no_library_banner(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    env.update(PYTHONPATH=REPO, NNABLA_TORUS_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "nnabla_torus.launching.mpirun_cmd",
                           "--no-fault-args", "-np", "4", TRAIN, *TINY, "--max-steps", "2",
                           "--output-dir", str(tmp_path / "run")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=scaled(180))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert not [line for line in out.splitlines() if any(b in line for b in BANNERS)], out
    lines = out.splitlines()
    assert lines[0].endswith(f"-np 4 {sys.executable} {TRAIN} " + " ".join(TINY)
                             + f" --max-steps 2 --output-dir {tmp_path / 'run'}"), lines[0]
    assert lines[1].startswith("config (recipe digits-cpu; flag > environment > "), lines[:3]
