"""The elastic launcher's planning side: hostfiles, slot limits, resize-or-decline, dry run."""
import math
import os
import sys
import time

import pytest

from nnabla_torus.launching import elastic
from nnabla_torus.planning import planner
from nnabla_torus.planning.machine_profile import load_profile
from tests.slowdown import scaled


def test_hostfile_slots_and_errors(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# ABCI\nnode1 slots=4\nnode2 slots=4 max_slots=4\nnode3\n\n")
    assert elastic.read_hostfile(str(path)) == [("node1", 4), ("node2", 4), ("node3", 1)]
    path.write_text("node1 max_slots=2\n")                 # max_slots alone bounds the host
    assert elastic.read_hostfile(str(path)) == [("node1", 2)]
    # Before: Unicode digits accepted (int("\u0664") == 4) and max_slots ignored.
    for line, message in [
            ("node1 slots=four", "hosts:1: slots='four' must be an integer >= 1"),
            ("node1 slots=\u0664", "hosts:1: slots='\u0664' must be an integer >= 1 in ASCII "
                                   "digits"),
            ("node1 slots=8 max_slots=\u0662", "max_slots='\u0662' must be an integer"),
            ("node1 slots=8 max_slots=4", "hosts:1: slots=8 is more than max_slots=4")]:
        path.write_text(line + "\n")
        with pytest.raises(ValueError, match=message):
            elastic.read_hostfile(str(path))
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="names no host"):
        elastic.read_hostfile(str(path))


def test_fit_ranks_uses_what_exists_and_falls_back_to_a_split():
    assert elastic.fit_ranks(4, 8, 64) == (4, "")
    ranks, note = elastic.fit_ranks(8, 6, 64)
    assert ranks == 4
    assert "wanted 8 ranks but only 6 slots exist" in note
    assert "global batch 64 does not split over 6 ranks: falling back to 4" in note


def test_resize_only_when_the_gain_beats_the_restart_cost():
    prof = load_profile("abci")
    phase = 85 * planner.IMAGENET_TRAIN_IMAGES
    paid = planner.plan_resize(prof, "resnet50", 69632, 1088, phase, 30.0, local_batches=[32])
    assert paid.resize and paid.gpus == 2176 and paid.plan.grid == "64x34"
    assert paid.gain_s > 30.0 and paid.reason.startswith("resize: ")
    # The break-even phase: below it the same resize is declined, and the reason says so.
    short = planner.plan_resize(prof, "resnet50", 69632, 1088, paid.break_even_images * 0.9,
                                30.0, local_batches=[32])
    assert not short.resize and short.gpus == 1088
    assert short.reason.startswith("decline: ") and "does not pay" in short.reason
    assert short.break_even_images == pytest.approx(paid.break_even_images)
    assert paid.gain_s * paid.break_even_images / phase == pytest.approx(30.0)


def test_fixed_schedule_overrides_and_first_launch_pays_nothing():
    prof = load_profile("cpu-2core")
    first = planner.plan_resize(prof, "resnet18-w0.125-16px", 32, None, 1438, 6.0, max_gpus=4)
    assert first.resize and first.restart_cost_s == 0 and first.reason.startswith("launch ")
    fixed = planner.plan_resize(prof, "resnet18-w0.125-16px", 64, 1, 1438, 6.0, fixed_gpus=2)
    assert fixed.resize and fixed.gpus == 2 and "fixed GPU-count schedule" in fixed.reason
    keep = planner.plan_resize(prof, "resnet18-w0.125-16px", 64, 2, 1438, 6.0, fixed_gpus=2)
    assert not keep.resize and math.isinf(keep.break_even_images)


def test_dry_run_sony_on_abci_hostfile(tmp_path, capsys):
    hosts = tmp_path / "abci.hosts"
    hosts.write_text("".join(f"node{i} slots=4\n" for i in range(1088)))
    status = elastic.main(["--hostfile", str(hosts), "--profile", "abci", "--model", "resnet50",
                           "--schedule", "0:34816,5:69632", "--local-batch", "32",
                           "--dataset-size", "1281167", "--epochs", "90", "--dry-run"])
    out = capsys.readouterr().out
    assert status == 0
    # 32x34 (not 64x17) since the abci profile has racks: fewer column flows per rack uplink.
    assert "launch at epoch 0: 1088 ranks, torus2d on 32x34, 32 x 1 per rank" in out, out
    assert "launch at epoch 5: 2176 ranks, torus2d on 64x34, 32 x 1 per rank" in out, out
    assert "restart of 30.0 s" in out
    # With a restart dearer than the predicted gain the same run stays on 1,088.
    elastic.main(["--hostfile", str(hosts), "--profile", "abci", "--model", "resnet50",
                  "--schedule", "0:34816,5:69632", "--local-batch", "32", "--dataset-size",
                  "1281167", "--epochs", "90", "--restart-cost", "120", "--dry-run"])
    out = capsys.readouterr().out
    assert "launch at epoch 5" not in out and "the restart does not pay" in out, out


def test_the_header_states_the_slots_the_launches_use(capsys):
    """Before: "profile cpu-2core (...): 1 hosts x 8 GPUs" under --slots 2, read as 8 ranks."""
    elastic.main(["--slots", "2", "--schedule", "0:32", "--profile", "cpu-2core", "--dry-run"])
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("profile cpu-2core (named by --profile / NNABLA_TORUS_PROFILE) for "
                           "the cost model: 1 host(s) x 8 GPUs; the launches use at most 2 "
                           "slot(s) (--slots)"), header


def test_bad_launcher_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit, match="no training command"):
        elastic.main(["--slots", "2", "--ranks-schedule", "0:1"])
    with pytest.raises(SystemExit, match="--dry-run needs --schedule"):
        elastic.main(["--slots", "2", "--dry-run"])
    with pytest.raises(SystemExit, match="--hostfile or --slots, not both"):
        elastic.main(["--slots", "2", "--hostfile", "x", "--", "python", "t.py"])


def test_dry_run_on_fewer_slots_than_wanted_says_so(tmp_path, capsys):
    hosts = tmp_path / "three.hosts"
    hosts.write_text("".join(f"node{i} slots=4\n" for i in range(3)))
    flags = ["--hostfile", str(hosts), "--profile", "abci", "--model", "resnet50",
             "--local-batch", "32", "--dataset-size", "1281167", "--epochs", "90", "--dry-run"]
    elastic.main(flags + ["--schedule", "0:384,5:768"])
    out = capsys.readouterr().out
    assert "the planner wants 24 ranks but only 12 slots exist: planning within them" in out
    assert "launch at epoch 0: 12 ranks, " in out and "32 x 1 per rank, global batch 384" in out
    # 34,816 does not split over 12 slots at 32 per rank: an error naming the nearest batch
    # (before: the plan of 12 ranks at another batch, printed as a launch of 8 ranks).
    with pytest.raises(SystemExit) as ended:
        elastic.main(flags + ["--schedule", "0:34816,5:69632"])
    assert ("epoch 0: global batch 34816 cannot be split as GPUs x per-GPU batch x "
            "accumulation steps over the candidates (GPU counts 1,2,3,4,8,12, per-GPU batches "
            "32" in str(ended.value.code)), ended.value.code
    assert "the nearest feasible global batch is 3072" in str(ended.value.code)


def test_bad_numbers_are_refused_where_parsed(capsys):
    for flag, value in (("--slots", "0"), ("--max-restarts", "-1"), ("--restart-cost", "-5"),
                        ("--epochs", "0")):
        with pytest.raises(SystemExit):
            elastic.main([flag, value, "--dry-run", "--schedule", "0:32"])
        assert f"argument {flag}: must be" in capsys.readouterr().err


# -- the launcher owns its job ----------------------------------------------------------------
def fake_job(monkeypatch, code):
    """Make run_once launch ``python -c code`` instead of mpirun."""
    monkeypatch.setattr(elastic, "mpirun_command", lambda ranks, argv, extra: [
        sys.executable, "-c", code, *argv])


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def running(pid):
    """Whether ``pid`` is alive and not a zombie (an orphan's zombie may wait for init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_job_output_that_is_not_utf8_is_shown_replaced(monkeypatch, capsys):
    """Before: UnicodeDecodeError, the launcher exited and left mpirun running."""
    fake_job(monkeypatch, "import sys; sys.stdout.buffer.write(b'loss \\xff\\xfe ok\\n')")
    status, request, tail, _ = elastic.run_once([], 1, [], dict(os.environ))
    assert status == 0 and request is None and tail == ["loss \ufffd\ufffd ok"]


def test_each_launch_gets_a_private_open_mpi_session_base_removed_after(monkeypatch):
    """A SIGKILLed mpirun's session folder, named after its pid, stops a later mpirun that gets
    the same pid (tests/mpi/test_session_folder.py); each launch gets a base of its own."""
    fake_job(monkeypatch, "import os; base = os.environ['PRTE_MCA_prte_tmpdir_base']; "
                          "print(base, os.path.isdir(base), os.listdir(base))")
    env = dict(os.environ)
    for name in [n for n in env if n.startswith(("SLURM_", "PBS_", "PRTE_MCA", "OMPI_MCA"))]:
        del env[name]
    bases = []
    for _ in range(2):
        status, _, tail, _ = elastic.run_once([], 1, [], env)
        base, isdir, entries = tail[-1].split(" ", 2)
        assert (status, isdir, entries) == (0, "True", "[]")
        assert not os.path.exists(base) and base not in bases
        bases.append(base)
    assert "PRTE_MCA_prte_tmpdir_base" not in env


def test_a_malformed_request_line_is_reported_not_fatal(monkeypatch, capsys):
    fake_job(monkeypatch, f"print({elastic.REQUEST_PREFIX!r} + '{{ranks: 2'); exit(75)")
    status, request, _, _ = elastic.run_once([], 1, [], dict(os.environ))
    assert (status, request) == (75, None)
    assert "ignoring a malformed request line" in capsys.readouterr().out


def test_an_error_in_the_launcher_ends_the_job_it_started(monkeypatch, tmp_path, capsys):
    """Our stdout breaks (a pipe to `head` that exited) while the job runs: the job's process
    group is killed and the reason said, within seconds (before: the job ran on alone)."""
    pid_file = tmp_path / "pid"
    fake_job(monkeypatch, f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()))"
                          f"; print('started', flush=True); time.sleep(60)")

    class BrokenStdout:
        def write(self, text):                # the launcher's own lines pass
            if text == "started\n":
                raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass
    monkeypatch.setattr(sys, "stdout", BrokenStdout())
    start = time.monotonic()
    with pytest.raises(BrokenPipeError, match="Broken pipe"):
        elastic.run_once([], 1, [], dict(os.environ))
    assert time.monotonic() - start < scaled(20)
    assert not alive(int(pid_file.read_text()))
    assert ("nnabla-torus-run: ended the job (mpirun pid" in capsys.readouterr().err)


def test_ended_jobs_leave_no_rank_in_a_process_group_of_its_own(monkeypatch, tmp_path):
    """Open MPI 5 puts each rank in a process group of its own: before, killing mpirun's
    process group left the ranks running. A "rank" here: a child in its own group."""
    pid_file = tmp_path / "pid"
    fake_job(monkeypatch, "import os, subprocess, sys; child = subprocess.Popen([sys.executable,"
                          " '-c', 'import time; time.sleep(60)'], preexec_fn=os.setpgrp, "
                          "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
                          f"open({str(pid_file)!r}, 'w').write(str(child.pid)); "
                          "print('started', flush=True); os._exit(9)")   # mpirun dies first
    status, _, tail, _ = elastic.run_once([], 1, [], dict(os.environ))
    assert status == 9 and tail[0] == "started", tail
    deadline = time.monotonic() + 5                 # SIGKILL takes effect when it runs next
    while running(int(pid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(int(pid_file.read_text()))


def test_relaunches_always_resume():
    """Before: an explicit --resume 0 was kept, so every relaunch trained from step 0."""
    assert elastic.resumed(["train.py", "--resume", "0", "-b", "8"]) == \
        ["train.py", "-b", "8", "--resume", "1"]
    assert elastic.resumed(["train.py", "--resume=0"]) == ["train.py", "--resume", "1"]
    assert elastic.resumed(["train.py"]) == ["train.py", "--resume", "1"]
