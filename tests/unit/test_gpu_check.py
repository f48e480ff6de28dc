"""``make gpu-check`` on a machine without GPUs: one line says so, nothing is installed, exit 0."""
import json
import os
import subprocess
import sys

import pytest

from tests.mpirun import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import gpu_check  # noqa: E402


def test_without_gpus_the_check_is_dry_and_passes(tmp_path):
    if gpu_check.gpu_count()[0]:
        pytest.skip("this machine has GPUs: run make gpu-check itself")
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("gpu-check: no GPU here") for line in lines) == 1, done.stdout
    assert "pip install" not in done.stderr and "Collecting" not in done.stdout  # no install
    report = json.loads(out.read_text())
    assert report["gpus"] == 0 and report["verdict"] == "no GPU: dry check only"
    names = [p["piece"] for p in report["pieces"]]
    assert names[0] == "CUDA driver and GPUs" and "NCCL >= 2.10.3" in names, names
    assert all(p["found"] for p in report["pieces"])  # every piece says what it found or the fix
