"""Under a real Slurm (single node, started by tools/slurm_up.sh; skipped with its reason where
that is impossible: not root, no apt-get): ``srun --mpi=pmix`` at 2 and 4 ranks (ranks, local
ranks and sums; an nnabla-examples-style script equal to one process; no PMIx help-file
noise), ``srun --mpi=pmi2`` of the MPICH venv, ``srun`` without PMIx stopping every task with
one line within seconds, the shipped examples/imagenet/train.sbatch (srun and mpirun inside)
to a finished run with ``sbatch --wait``, nnabla-torus-run taking its hosts and slots from
an ``salloc`` allocation, and a user's own loop on the public API (examples/own_loop) under
``srun --mpi=pmix`` as under mpirun, resumed on another task count. Every job has a hard
timeout (the test's, which kills srun/salloc or cancels the batch job, and Slurm's
``--time``)."""
import json
import os
import re
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tests.examples.train_output import summary_of
from tests.mpirun import (REPO, expect_passed_on_every_rank, library_python, run_killable,
                          run_mpi)
from tests.slowdown import scaled

SLURM_UP = os.path.join(REPO, "tools", "slurm_up.sh")
SLURM_UP_TIMEOUT_S = 900      # apt-get update + install on a slow mirror
NOISE = "Sorry!  You were supposed to get help"


@pytest.fixture(scope="module")
def slurm(request, tmp_path_factory):
    """The environment of the jobs; Slurm brought up (or found up) first, its time reported."""
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", SLURM_UP], capture_output=True, text=True,
                              timeout=scaled(SLURM_UP_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        pytest.fail(f"tools/slurm_up.sh took over {scaled(SLURM_UP_TIMEOUT_S):.0f} s")
    if done.returncode == 2:      # impossible here (not root, no apt-get): skip, saying why
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tests/slurm: {done.stdout.strip().splitlines()[-1]} "
                            f"[{time.monotonic() - started:.1f} s]")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               NNABLA_TORUS_CACHE_DIR=str(tmp_path_factory.mktemp("auto_cache")))
    for name in [n for n in env if n.startswith(("SLURM_", "PMIX_", "OMPI_COMM_WORLD"))]:
        del env[name]            # a test session started inside a job: ours are new jobs
    return env


def run(cmd, env, timeout, name=None):
    """(exit status, output, seconds) of ``cmd``; on timeout the batch job ``name`` (if any)
    is cancelled too."""
    def cancel():
        ids = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                             text=True).stdout.split()
        subprocess.run(["scancel", *ids])
    started = time.monotonic()
    status, out = run_killable(cmd, env, timeout, cancel if name else None)
    return status, out, time.monotonic() - started


@pytest.mark.parametrize("ranks", [2, 4])
def test_srun_pmix_ranks_are_slurms_and_sums_exact(slurm, ranks):
    status, out, _ = run(["srun", "--mpi=pmix", "-n", str(ranks), "--time=3", sys.executable,
                          "tests/slurm/progs/slurm_ranks.py"],
                         dict(slurm, NNABLA_TORUS_ALGORITHM="torus2d"), timeout=150)
    assert status == 0, out
    expect_passed_on_every_rank(out, "slurm_ranks", ranks)
    assert NOISE not in out, out


@pytest.mark.slow
def test_srun_pmix_runs_an_nnabla_examples_style_script_as_one_process_would(slurm, tmp_path):
    prog = "tests/mpi/progs/nnabla_style_train.py"
    status, out, _ = run(["srun", "--mpi=pmix", "-n", "4", "--time=3", sys.executable, prog,
                          "--batch-size", "2", "--out", str(tmp_path / "srun")],
                         slurm, timeout=180)
    assert status == 0 and "PASSED nnabla_style_train on 4 ranks" in out, out
    assert NOISE not in out, out
    status, out, _ = run([sys.executable, prog, "--batch-size", "8", "--out",
                          str(tmp_path / "one")], slurm, timeout=120)
    assert status == 0, out
    import nnabla as nn
    params = []
    for path in [tmp_path / "one" / "params_rank0.h5"] + [
            tmp_path / "srun" / f"params_rank{r}.h5" for r in range(4)]:
        nn.clear_parameters()
        nn.load_parameters(str(path))
        params.append({k: v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()})
    nn.clear_parameters()
    for name, want in params[0].items():
        for rank in range(4):
            assert np.array_equal(params[1 + rank][name], params[1][name]), (name, rank)
        assert np.max(np.abs(params[1][name] - want)) <= 1e-5 * (1 + np.max(np.abs(want))), name


@pytest.mark.slow
def test_srun_pmi2_runs_the_mpich_venv(slurm):
    """The pip MPICH joins a Slurm step over PMI-2 (with --mpi=pmix it aborts in MPI_Init:
    "unsupported PMI version PMIx")."""
    python = library_python("mpich")
    status, out, _ = run(["srun", "--mpi=pmi2", "-n", "2", "--time=3", python,
                          "tests/slurm/progs/slurm_ranks.py"],
                         dict(slurm, NNABLA_TORUS_ALGORITHM="torus2d"), timeout=150)
    assert status == 0, out
    expect_passed_on_every_rank(out, "slurm_ranks", 2)


def test_srun_without_pmix_stops_every_task_with_one_line(slurm):
    """Before: two independent one-rank trainings, nothing said."""
    status, out, seconds = run(["srun", "-n", "2", "--time=2", sys.executable,
                                "tests/slurm/progs/slurm_ranks.py"], slurm, timeout=60)
    assert status != 0, out
    lines = [line for line in out.splitlines() if "nnabla_torus:" in line]
    assert len(lines) == 2, out
    for task, line in zip(sorted(range(2)), sorted(lines)):
        assert line.startswith(f"task {task} (MPI rank 0 of 1) on host "), line
        assert ("nnabla_torus: srun started 2 tasks (SLURM_STEP_NUM_TASKS=2) but MPI (Open MPI"
                in line and "sees a world of 1: each task would train alone. Fix: launch with "
                "srun --mpi=pmix" in line), line
    assert "PASSED" not in out, out
    assert seconds < 30, (seconds, out)
    print(f"srun -n 2 without PMIx: exit {status} after {seconds:.1f} s:\n{lines[0]}")


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["run", "srun", "mpirun"])
def test_the_shipped_sbatch_script_trains_to_the_end(slurm, tmp_path, launch):
    """examples/imagenet/train.sbatch as shipped (nnabla-torus-run), with srun --mpi=pmix and
    with LAUNCH=mpirun;
    the command line overrides only what a 2-core node without GPUs needs (one node, CPUs per
    task, no GPUs, a short time limit)."""
    name = f"nnabla-torus-test-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "job.out"
    # Open MPI binds a rank per core and refuses 4 ranks on the 2 cores behind the 8 CPUs
    # this Slurm declares ("A request was made to bind ..."); a real node has the cores.
    env = dict(slurm, LAUNCH=launch, PRTE_MCA_hwloc_default_binding_policy="none")
    status, out, seconds = run(
        ["sbatch", "--wait", f"--job-name={name}", f"--output={log}", "--nodes=1",
         "--ntasks-per-node=4", "--cpus-per-task=1", "--gpus-per-task=0", "--time=5",
         "examples/imagenet/train.sbatch",
         "--train-images", "512", "--image-size", "16", "--local-batch", "16",
         "--batch-schedule", "0:64", "--epochs", "2", "--warmup-epochs", "0.5",
         "--progress", "0", "--output-dir", str(tmp_path / "run")],
        env, timeout=240, name=name)
    text = log.read_text() if log.exists() else ""
    assert status == 0, out + text
    assert re.search(rf"nnabla-torus: job \d+, 4 ranks on \S+, launched with {launch}", text), \
        text
    summary = summary_of(text)
    assert summary["ranks"] == 4 and summary["epochs"] == 2.0, summary
    assert summary["val_top1"] > 0.2, summary            # chance: 0.1
    assert NOISE not in text, text
    assert (tmp_path / "run" / "model.h5").exists()
    print(f"sbatch train.sbatch ({launch}): {seconds:.1f} s, " + json.dumps(
        {k: summary[k] for k in ("ranks", "val_top1", "wall_s", "algorithm", "grid")}))


def test_the_elastic_launcher_takes_hosts_and_slots_from_the_allocation(slurm):
    """salloc -n 4: 4 slots from SLURM_JOB_NODELIST/SLURM_TASKS_PER_NODE; the job starts on 1
    rank and its request for 8 is capped at them."""
    status, out, _ = run(
        ["salloc", "-n", "4", "--time=3", sys.executable, "-m", "nnabla_torus.launching.elastic",
         "--ranks-schedule", "0:1", "--", "python", "tests/mpi/progs/elastic_fake.py", "grow",
         "8"], slurm, timeout=150)
    assert status == 0, out
    assert re.search(r"Slurm job \d+: 1 host\(s\) \(\S+:4\), 4 slots", out), out
    assert "-np 1 " in out and "wanted 8 ranks but only 4 slots exist: using 4" in out, out
    assert "relaunching on 4 ranks" in out and "RAN ON 4" in out, out
    print(out)
    assert "finished after 1 restart(s)" in out, out


def test_the_elastic_launcher_inside_a_job_step_uses_the_jobs_slots(slurm):
    """srun -n 1 nnabla-torus-run inside an allocation of 4 tasks: 4 slots, not the step's 1
    (Slurm overwrites SLURM_TASKS_PER_NODE in a step)."""
    status, out, _ = run(
        ["salloc", "-n", "4", "--time=3", "srun", "-n", "1", sys.executable, "-m",
         "nnabla_torus.launching.elastic", "--ranks-schedule", "0:4", "--", "python",
         "tests/mpi/progs/elastic_fake.py", "grow", "4"], slurm, timeout=150)
    assert status == 0, out
    assert re.search(r"Slurm job \d+ \(from inside its step \d+: [^)]+\): 1 host\(s\) \(\S+:4\), "
                     r"4 slots", out), out
    assert "RAN ON 4" in out, out


def test_one_process_alone_in_an_allocation_is_warned(slurm):
    """salloc -n 4 then python: one line says the other 3 tasks sit idle, and the fix."""
    status, out, _ = run(["salloc", "-n", "4", "--time=3", sys.executable, "-c",
                          "import nnabla_torus.comm.communicator"], slurm, timeout=150)
    assert status == 0, out
    assert re.search(r"nnabla_torus: warning: one process trains alone inside Slurm job \d+ of 4 "
                     r"tasks \(SLURM_NTASKS=4\)", out), out


def rank_pid(rank, marker):
    """The pid of the process of MPI rank ``rank`` whose command line holds ``marker``."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except OSError:
            continue
    return None


def test_the_sbatch_script_restarts_after_a_killed_task(slurm, tmp_path):
    """train.sbatch as shipped (nnabla-torus-run inside, --no-kill): rank 3 SIGKILLed at step
    12 of 24 (checkpoints every 4): the job restarts from step 12 and finishes."""
    name = f"nnabla-torus-test-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "job.out"
    env = dict(slurm, VENV=sys.prefix, PRTE_MCA_hwloc_default_binding_policy="none")
    job = subprocess.Popen(
        ["sbatch", "--wait", f"--job-name={name}", f"--output={log}", "--nodes=1",
         "--ntasks-per-node=4", "--cpus-per-task=1", "--gpus-per-task=0", "--time=6",
         "examples/imagenet/train.sbatch", "--train-images", "512", "--image-size", "16",
         "--local-batch", "16", "--batch-schedule", "0:64", "--epochs", "3",
         "--warmup-epochs", "0.5", "--checkpoint-every", "4", "--log-every", "1",
         "--output-dir", str(tmp_path / "run")], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    started, killed, back = time.monotonic(), None, None
    try:
        while job.poll() is None and time.monotonic() - started < scaled(300):
            text = log.read_text() if log.exists() else ""
            if killed is None and " step 12:" in text:
                pid = rank_pid(3, "examples/imagenet/train.py")
                if pid:
                    os.kill(pid, 9)
                    killed = time.monotonic()
            if killed and back is None and "training again" in text:
                back = time.monotonic()
            time.sleep(0.2)
        out, _ = job.communicate(timeout=max(1, scaled(300) - (time.monotonic() - started)))
    finally:
        if job.poll() is None:
            ids = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                                 text=True).stdout.split()
            subprocess.run(["scancel", *ids])
            job.kill()
    text = log.read_text()
    assert killed and job.returncode == 0, out + text
    assert "restart 1 after a failure: rank 3 killed by signal 9" in text, text
    # The kill races the step-12 checkpoint: resumed from 8 or 12, at most one interval lost
    lost = re.search(r"restart 1: training again from step (8|12): (\d) step\(s\) lost", text)
    assert lost and int(lost.group(2)) <= 4, text
    summary = summary_of(text)
    assert summary["steps"] == 24 and summary["ranks"] == 4, summary
    print(f"sbatch, rank 3 killed at step 12: exit 0 after {time.monotonic() - started:.1f} s, "
          f"{back - killed:.1f} s from the kill to training again; "
          + [line for line in text.splitlines() if "training again" in line][0])


@pytest.mark.slow
def test_srun_pmix_runs_the_own_loop_example_as_mpirun_does_and_resumes_on_2(slurm, tmp_path):
    """examples/own_loop/train.py, a user's loop on the public API (nnabla_torus.training):
    under ``srun --mpi=pmix -n 4`` its params.h5 equals, bitwise, that of ``mpirun -np 4``
    (same seed); then ``srun -n 2 --resume 1`` continues the checkpoint on 2 ranks."""
    import nnabla as nn

    script = ["examples/own_loop/train.py", "--seed", "5", "--epochs", "1"]
    status, srun_out, _ = run(["srun", "--mpi=pmix", "-n", "4", "--time=4", sys.executable,
                               *script, "--output-dir", str(tmp_path / "srun")],
                              slurm, timeout=240)
    assert status == 0 and "global batch 64" in srun_out, srun_out
    assert NOISE not in srun_out, srun_out
    out = run_mpi(4, [*script, "--output-dir", str(tmp_path / "mpirun")], timeout=240)
    params = []
    for folder in ("srun", "mpirun"):
        nn.clear_parameters()
        nn.load_parameters(str(tmp_path / folder / "params.h5"))
        params.append({k: v.d.copy() for k, v in nn.get_parameters(grad_only=False).items()})
    nn.clear_parameters()
    assert params[0].keys() == params[1].keys() and all(
        np.array_equal(params[0][k], params[1][k]) for k in params[0]), out

    status, out, _ = run(["srun", "--mpi=pmix", "-n", "2", "--time=4", sys.executable,
                          "examples/own_loop/train.py", "--seed", "5", "--epochs", "2",
                          "--resume", "1", "--output-dir", str(tmp_path / "srun")],
                         slurm, timeout=240)
    assert status == 0 and "resumed from " in out and "global batch 64" in out, out
