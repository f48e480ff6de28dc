"""``make gpu-check`` on a machine without GPUs: one line says so, nothing is installed, exit 0."""
import json
import os
import subprocess
import sys

import pytest

from tests.mpirun import REPO
from tests.slowdown import scaled

sys.path.insert(0, os.path.join(REPO, "tools"))
import gpu_check  # noqa: E402


@pytest.mark.slow
def test_without_gpus_the_check_is_dry_and_passes(tmp_path):
    if gpu_check.gpu_count()[0]:
        pytest.skip("this machine has GPUs: run make gpu-check itself")
    out = tmp_path / "gpu_check.json"
    # PYTHONPATH: this tree, not the installed one
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--json", str(out)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, text=True, timeout=scaled(120))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("gpu-check: no GPU here") for line in lines) == 1, done.stdout
    assert "pip install" not in done.stderr and "Collecting" not in done.stdout  # no install
    report = json.loads(out.read_text())
    assert report["gpus"] == 0 and report["verdict"] == "no GPU: dry check only"
    names = [p["piece"] for p in report["pieces"]]
    assert names[0] == "CUDA driver and GPUs" and "NCCL >= 2.10.3" in names, names
    assert all(p["found"] for p in report["pieces"])  # every piece says what it found or the fix


def test_with_gpus_the_verdicts_come_from_the_runs(tmp_path, monkeypatch, capsys):
    """The GPU path's plumbing, with the child runs replaced (no GPU here): commands, JSON,
    verdicts, exit status."""
    import subprocess as sp
    monkeypatch.setattr(gpu_check, "gpu_count", lambda: (4, ""))
    monkeypatch.setattr(gpu_check, "check_pieces",
                        lambda: (4, [("CUDA driver and GPUs", True, "4 GPU(s)")]))
    bench = [dict(algorithm=a, grid=g, bytes=gpu_check.RESNET50_BYTES, time_us=1e4,
                  busbw_GBps=15.0, ratio_to_native=r, correct=True)
             for a, g, r in [("torus2d", "2x2", 0.9), ("native", "-", 1.0)]]
    commands = []

    def run(argv, env, timeout):
        commands.append(argv)
        if "tools/allreduce_bench.py" in argv:
            with open(argv[argv.index("--json") + 1], "w") as f:
                json.dump(bench, f)
        out = ""
        if "tools/train_bench.py" in argv:
            out = "RECORDS " + json.dumps([dict(overlap=o, images_per_sec=100.0 + o,
                                                allreduce_share=0.2) for o in (False, True)])
        return sp.CompletedProcess(argv, 0, out + "\n5 passed", "")
    monkeypatch.setattr(gpu_check, "run", run)
    # The end-to-end, 8-rank and fault runs have checks of their own, run on the fake by
    # tests/examples/test_gpu_e2e.py and tests/mpi/test_gpu_fault.py (issue 47)
    monkeypatch.setattr(gpu_check, "case_verdict", lambda check, *_: (check, "PASS", ""))
    monkeypatch.setattr(gpu_check.cases, "write_jpeg_folder", lambda root, images: root)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--no-install", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["verdict"] == "PASS" and report["allreduce"] == bench
    assert [r["type_config"] for r in report["train"]] == ["float", "float", "half", "half"]
    bench_argv = next(a for a in commands if "tools/allreduce_bench.py" in a)
    assert bench_argv[bench_argv.index("--grids") + 1] == "4x1,2x2,1x4"
    assert bench_argv[bench_argv.index("-np") + 1] == "4"
    text = capsys.readouterr().out
    assert "PASS  all-reduce results exact" in text and "x0.90 of NCCL's all-reduce" in text
    bench[0]["correct"] = False
    assert gpu_check.main(["--no-install", "--json", str(out)]) == 1
    assert json.loads(out.read_text())["verdict"] == "FAIL"


@pytest.mark.slow
def test_issue33_the_gpu_tests_are_one_marker_and_no_fake_case():
    """``pytest -m gpu`` (what gpu-check runs, and what ``make test`` runs with the rest on a
    GPU node) selects the real-NCCL and device tests: overlap on vs off, fp16 callback, norms
    and SyncBN (test_gpu.py), the communicator on nccl, the mapping, DALI to device; no fake
    case (the old -k "... nccl- ..." matched fake-nccl-3/4)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           *gpu_check.GPU_TESTS], cwd=REPO, capture_output=True, text=True,
                          timeout=scaled(300))
    chosen = [line for line in done.stdout.splitlines() if "::" in line]
    assert chosen and not [c for c in chosen if "fake" in c], chosen
    for wanted in ("test_gpu.py::test_gpu_cases_on_nccl[2]", "[nccl-2]",
                   "test_mapping_on_real_nccl", "test_on_a_gpu_training_labels_land"):
        assert any(wanted in c for c in chosen), (wanted, chosen)


def test_issue33_the_dry_run_prints_every_run_and_the_property_suite_on_nccl(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    """--dry-run prints what a GPU node runs, in order, and exits 0; a property suite in the
    tree (tests/mpi/test_property*.py) runs on NNABLA_TORUS_BACKEND=nccl."""
    (tmp_path / "tests" / "mpi").mkdir(parents=True)
    (tmp_path / "tests" / "mpi" / "test_property_suite.py").write_text("")
    monkeypatch.setattr(gpu_check, "REPO", str(tmp_path))
    runs = gpu_check.planned_runs(4, "gpu_check.json")
    # issue 47: the property suite at the node's rank count (torus2d on grids with two sides
    # > 1, float16 buffers), train.py end to end and the fault case came in after the suite
    assert [r[0] for r in runs] == ["GPU tests (pytest -m gpu)", "property suite on nccl",
                                    "property suite, 4 ranks, torus2d 2x2",
                                    "property suite, 4 ranks, float16 buffers",
                                    "train.py end to end, embedded digits, steps 0-20",
                                    "train.py end to end, embedded digits, resumed, steps 20-40",
                                    "train.py end to end, jpeg folder, steps 0-20",
                                    "train.py end to end, jpeg folder, resumed, steps 20-40",
                                    "kill -9 of rank 3 during an all-reduce",
                                    "SIGSTOP of rank 3 in backward through nnabla's callback",
                                    "allreduce_bench", "ResNet-50 train_bench float",
                                    "ResNet-50 train_bench half"]
    assert runs[1][1][-3:] == ["tests/mpi/test_property_suite.py", "-k", "nccl- and not fake"]
    assert runs[1][2] == {"NNABLA_TORUS_BACKEND": "nccl"}
    monkeypatch.setattr(gpu_check, "REPO", REPO)
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, "tests/mpi/test_gpu.py::test_gpu_cases_on_nccl[2]\n", ""))
    assert gpu_check.main(["--dry-run", "--gpus", "4", "--json", os.devnull]) == 0
    text = capsys.readouterr().out
    assert "GPU tests (pytest -m gpu): " in text and "-np 4" in text
    assert "pytest -m gpu selects 1 test(s)" in text


def test_issue19_a_child_is_echoed_as_it_runs_and_a_timeout_is_a_verdict(capsys):
    """gpu-check's children print while they run (the device tests take minutes), and one
    that outlives its timeout is killed and reported, not a traceback."""
    limit = round(scaled(2))                   # seconds: the child's time to print its line
    prog = "import time; print('first', flush=True); time.sleep(600)"
    done = gpu_check.run([sys.executable, "-c", prog], dict(os.environ), timeout=limit)
    assert done.returncode == 124
    assert done.stdout.splitlines()[0] == "first"
    assert done.stdout.splitlines()[-1].startswith(f"gpu-check: timed out after {limit} s and "
                                                   "killed")
    assert "first" in capsys.readouterr().out


def test_issue19_a_failed_benchmark_does_not_report_the_last_runs_records(tmp_path,
                                                                          monkeypatch):
    """The all-reduce records of an earlier run beside the JSON are removed first: a bench that
    dies writes none, and its verdict is FAIL with 0 records (the old code put the stale
    records, and their INFO lines, in this run's report)."""
    import subprocess as sp
    out = tmp_path / "gpu_check.json"
    stale = tmp_path / "gpu_check_allreduce.json"
    stale.write_text(json.dumps([dict(algorithm="native", grid="-", bytes=1, time_us=1.0,
                                      busbw_GBps=1.0, ratio_to_native=1.0, correct=True)]))
    monkeypatch.setattr(gpu_check, "run", lambda argv, env, timeout: sp.CompletedProcess(
        argv, 1 if "tools/allreduce_bench.py" in argv else 0, "", ""))
    results, verdicts = gpu_check.device_checks(2, {}, str(out))
    assert results["allreduce"] == []
    assert ("all-reduce results exact (torus2d, NCCL)", "FAIL", "0 records") in verdicts


def test_issue19_a_failed_install_says_how_to_go_on(monkeypatch, capsys):
    import subprocess as sp
    monkeypatch.setattr(gpu_check, "gpu_count", lambda: (2, ""))
    monkeypatch.setattr(gpu_check.subprocess, "run",
                        lambda argv, **kw: sp.CompletedProcess(argv, 1, "", ""))
    assert gpu_check.main(["--json", os.devnull]) == 1
    text = capsys.readouterr().out
    assert "installing the [gpu] extra failed (pip exit 1" in text
    assert "python tools/gpu_check.py --no-install" in text
