"""nnabla-torus-run after a failure, without mpirun: the failure classes, the restart budget,
the host pool (cool-down, growth, Slurm's down nodes) and the watch loop driven by a fake job."""
import socket
import subprocess
import types

import pytest

from nnabla_torus.launching import membership, relaunch_loop
from nnabla_torus.launching.elastic_protocol import CHECKPOINT_PREFIX, EXIT_RESIZE
from nnabla_torus.launching.failures import classify, placement_of
from nnabla_torus.launching.membership import HostPool, slurm_hosts_up

KILLED = ["prterun noticed that process rank 3 with PID 812 on node h1 exited on",
          "signal 9 (Killed)."]


@pytest.mark.parametrize("status, lines, repeats, cause, host", [
    (1, ["rank 0 on host h0: train.py: error: --data-dir /x is not a folder"], True,
     "train.py: error: --data-dir /x is not a folder", "h0"),
    (2, ["train.py: error: argument --epochs: must be > 0"], True,
     "train.py: error: argument --epochs: must be > 0", None),
    (3, ["step 9: no checkpoint"], True, "divergence: the loss was not finite (exit status 3)",
     None),
    (137, KILLED, False, "rank 3 killed by signal 9 (Killed)", "h1"),
    (70, ["nnabla_torus: rank 0: all_reduce (torus2d) did not finish within 20 s; still "
          "waiting for rank(s) [3] (NNABLA_TORUS_TIMEOUT sets the limit); aborting the job"],
     False, "timeout: rank 0: all_reduce (torus2d) did not finish within 20 s", "h1"),
    (70, ["nnabla_torus: rank 1: lost rank(s) [2] during all_reduce (torus2d, group 'world') "
          "(waiting); aborting (rank 2 ran on h1; mpirun reports how it ended)"], False,
     "lost rank(s) [2] during all_reduce", "h1"),
    (1, ["PRTE has lost communication with a remote daemon.", "",
         "  HNP daemon   : [prterun-sw-1@0,0] on node sw",
         "  Remote daemon: [prterun-sw-1@0,2] on node h1"], False,
     "lost host h1 (mpirun lost its daemon there)", "h1"),
    # --map-by node: rank 2 ran on h0, not on h1 where by-slot placement puts it (before:
    # the line's host was never read, so the guess h1 was left out for the cool-down)
    (70, ["nnabla_torus: rank 0: rank(s) [2] left the script (sys.exit, an early return or an "
          "error handled there) while this rank waits for them in all_reduce (torus2d); they "
          "will not arrive (rank 2 ran on h0); aborting the job"], False,
     "rank(s) [2] left the script", "h0"),
    (137, ["srun: error: node2: task 3: Killed"], False, "task(s) 3 Killed (srun)", "node2"),
    (1, ["nnabla_torus: rank 2 on host h1: unhandled MemoryError: ; aborting the job"], False,
     "rank 2 crashed (MemoryError)", "h1"),
    (9, ["loss 1.0"], False, "exit status 9 (no line of the job says why)", None),
    # before: "rank 0 crashed (WriteError)", restarted until the budget was spent
    (1, ["nnabla_torus: rank 0 on host h0: unhandled WriteError: cannot write out/model.nnp: "
         "No space left on device; 3 MB free; aborting the job"], True,
     "the disk is full: unhandled WriteError: cannot write out/model.nnp: No space left on "
     "device; 3 MB free; aborting the job", "h0"),
    (1, ["rank 1 on host h1: OSError: [Errno 28] No space left on device: 'out/ckpt.npz'"],
     True, "the disk is full: OSError: [Errno 28] No space left on device: 'out/ckpt.npz'",
     "h1"),
])
def test_failures_that_repeat_stop_and_others_restart(status, lines, repeats, cause, host):
    failure = classify(status, lines, placement_of([("h0", 2), ("h1", 2)], 4))
    assert (failure.repeats, failure.cause, failure.host) == (repeats, cause, host)


# What a job prints when another live run holds its folder (State.start on every rank, failfast)
BUSY = ["Traceback (most recent call last):",
        "nnabla_torus.training.run_lock.RunFolderBusy: rank 1: rank 0 found runs/x in use by a "
        "live run (its line names it)",
        "nnabla_torus: rank 1 on host h0: unhandled RunFolderBusy: rank 1: rank 0 found runs/x "
        "in use by a live run (its line names it); aborting the job",
        "nnabla_torus.training.run_lock.RunFolderBusy: runs/x is in use by a live run: pid 812 "
        "on host a01 (since 2026-12-06 05:00:00); wait for it to end, or use another output "
        "folder",
        "nnabla_torus: rank 0 on host h0: unhandled RunFolderBusy: runs/x is in use by a live "
        "run: pid 812 on host a01 (since 2026-12-06 05:00:00); wait for it to end, or use "
        "another output folder; aborting the job"]
HOLDER = "runs/x is in use by a live run: pid 812 on host a01 (since 2026-12-06 05:00:00)"


@pytest.mark.parametrize("lines, cause, host", [
    (BUSY, HOLDER, "h0"),
    (BUSY[3:4], HOLDER, None),                                    # a traceback's line only
    (["train.py: error: " + HOLDER + "; wait for it to end"], HOLDER, None),   # caught
    (BUSY[2:3], BUSY[2], "h0"),                                   # another rank's line only
])
def test_a_folder_another_live_run_holds_stops_at_once(lines, cause, host):
    """Before: "rank 0 crashed (RunFolderBusy)" (or rank 1), restarted until the first run
    ended and a relaunch took its folder over."""
    failure = classify(1, lines)
    assert (failure.repeats, failure.cause, failure.host) == (True, cause, host)


def test_the_folder_words_are_the_run_locks(tmp_path):
    from nnabla_torus.training.run_lock import RunFolderBusy, RunLock
    holder = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run.lock").write_text(
            f'{{"pid": {holder.pid}, "host": "{socket.gethostname()}", "started": "t"}}')
        with pytest.raises(RunFolderBusy) as error:
            RunLock.acquire(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    failure = classify(1, [f"nnabla_torus: rank 0 on host h0: unhandled RunFolderBusy: "
                           f"{error.value}; aborting the job"])
    assert failure.repeats and failure.cause == (
        f"{tmp_path} is in use by a live run: pid {holder.pid} on host {socket.gethostname()} "
        f"(since t)"), failure


def test_the_script_error_decides_over_the_deaths_it_caused():
    """train.py's error ends the job by MPI_Abort: mpirun's lines after it are not a cause."""
    failure = classify(1, ["rank 1 on host h0: train.py: error: bad image"] + KILLED)
    assert failure.repeats and "bad image" in failure.cause


def test_placement_fills_each_host_in_order():
    assert placement_of([("a", 2), ("b", 1), ("c", 4)], 5) == ["a", "a", "b", "c", "c"]


def test_budget_per_hour_and_in_all():
    now = [0.0]
    budget = relaunch_loop.RestartBudget(5, 2, clock=lambda: now[0])
    assert budget.spend(True) is None and budget.spend(True) is None
    assert "failure 3 within an hour: --restarts-per-hour 2" in budget.spend(True)
    now[0] = 3601.0                                   # an hour later the window is empty
    assert budget.spend(True) is None and budget.spend(False) is None
    assert "restart 6 is above --max-restarts 5" in budget.spend(False)


def test_pool_leaves_a_failed_host_out_for_its_cooldown_and_takes_it_back(capsys):
    now, listed = [0.0], [[("h0", 2), ("h1", 2), ("h2", 2)]]
    pool = HostPool(lambda: listed[0], 600, clock=lambda: now[0])
    assert pool.hosts() == listed[0]
    assert pool.exclude("h1", "rank 3 killed by signal 9")
    assert pool.hosts() == [("h0", 2), ("h2", 2)]
    listed[0] = listed[0] + [("h3", 4)]               # the hostfile (or discovery) grew
    assert pool.hosts() == [("h0", 2), ("h2", 2), ("h3", 4)]
    now[0] = 601.0
    assert pool.hosts() == listed[0]
    out = capsys.readouterr().out
    assert "host h1 left out for 600 s (--exclude-cooldown): rank 3 killed by signal 9" in out
    assert "host(s) added: h3" in out and "host h1 is back: its cool-down ended" in out
    assert "added: h1" not in out, out


def test_pool_keeps_the_only_host_and_says_when_none_is_left():
    pool = HostPool(lambda: [("h0", 4)], 600)
    pool.hosts()
    assert not pool.exclude("h0", "killed")           # one host: nothing else to run on
    assert not HostPool(lambda: [("h0", 4)], 0).exclude("h0", "x")
    two = HostPool(lambda: [("h0", 1), ("h1", 1)], 600)
    two.hosts()
    two.exclude("h0", "killed")
    two.hosts()
    two.exclude("h1", "killed")                       # not listed any more: h0 is left
    two.last = [("h0", 1), ("h1", 1)]
    two.exclude("h1", "killed")
    with pytest.raises(ValueError, match="no host left to launch on"):
        two.hosts()


def flaky(*answers):
    """A host source answering ``answers`` in turn: a list, or an exception to raise."""
    calls = []

    def read():
        answer = answers[len(calls)]
        calls.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return read, calls


def test_a_failing_host_source_is_read_again_then_the_last_good_list_is_used(capsys):
    """Before: one failed read at a restart (the discovery command's error, garbage, empty
    output) raised out of the launcher and ended the run."""
    good, waits = [("h0", 2), ("h1", 2)], []
    read, calls = flaky(good, ValueError("host discovery command 'x' exited with status 1"),
                        [("h0", 2), ("h1", 2), ("h2", 2)],
                        *[ValueError("host discovery command 'x' names no host")] * 3)
    pool = HostPool(read, 600, sleep=waits.append)
    assert pool.hosts() == good
    assert pool.hosts() == [("h0", 2), ("h1", 2), ("h2", 2)]     # the second read worked
    assert pool.hosts() == [("h0", 2), ("h1", 2), ("h2", 2)]     # three failed: the last good
    assert len(calls) == 6 and waits == [membership.READ_RETRY_S] * 3
    out = capsys.readouterr().out
    assert ("reading the hosts failed (host discovery command 'x' exited with status 1): "
            "trying again in 5 s (read 1 of 3)") in out, out
    assert ("reading the hosts failed 3 times (host discovery command 'x' names no host): "
            "launching on the last good list (h0:2, h1:2, h2:2)") in out, out


def test_a_half_written_hostfile_keeps_the_hosts_read_at_start(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("h0 slots=2\nh1 slo")                # caught while an editor writes it
    pool = HostPool(lambda: membership.read_hostfile(str(path)), 600,
                    good=[("h0", 2), ("h1", 2)], sleep=lambda s: None)
    assert pool.hosts() == [("h0", 2), ("h1", 2)]
    path.unlink()                                         # gone while being replaced
    assert pool.hosts() == [("h0", 2), ("h1", 2)]
    with pytest.raises(ValueError, match="'slo' is not key=value"):
        path.write_text("h0 slots=2\nh1 slo")
        HostPool(lambda: membership.read_hostfile(str(path)), 600).hosts()   # nothing known


def test_discovery_command_output_is_read_as_a_hostfile(tmp_path):
    assert membership.discovered_hosts("printf 'h0:4\\nh1 slots=2\\n'") == [("h0", 4), ("h1", 2)]
    with pytest.raises(ValueError, match="exited with status 3"):
        membership.discovered_hosts("exit 3")
    with pytest.raises(ValueError, match="names no host"):
        membership.discovered_hosts("true")


def test_slurm_nodes_reported_down_are_left_out(monkeypatch):
    monkeypatch.setattr(membership.shutil, "which", lambda name: "/usr/bin/sinfo")
    seen = []

    def sinfo(argv, **kwargs):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "n1 allocated\nn2 down*\nn3 mixed+drain\n"
                                                    "n4 idle*\n", "")
    hosts = [("n1", 4), ("n2", 4), ("n3", 4), ("n4", 4)]
    assert slurm_hosts_up(hosts, run=sinfo) == [("n1", 4)]
    assert seen[0][:5] == ["sinfo", "-h", "-N", "-n", "n1,n2,n3,n4"]

    def failed(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "no controller")
    assert slurm_hosts_up(hosts, run=failed) == hosts


# -- the watch loop, with a fake job -----------------------------------------------------------
def fake_jobs(*jobs):
    """A run_once that plays ``jobs`` [(status, lines)] in turn, feeding the watch; records
    the launches (argv, ranks, mpirun args)."""
    launches = []

    def run_once(argv, ranks, mpirun_args, env, watch=None):
        status, lines = jobs[len(launches)]
        launches.append((list(argv), ranks, list(mpirun_args)))
        for line in lines:
            watch(line)
        request = ({"ranks": 4, "global_batch": 32, "reason": "grow"} if status == EXIT_RESIZE
                   else None)
        return status, request, lines, False
    return run_once, launches


def flags(**kw):
    return types.SimpleNamespace(**{"max_restarts": 10, "restarts_per_hour": 4,
                                    "total_slots": 8, "global_batch": 32, **kw})


def progress(start, stop, checkpoint=None):
    lines = ([f"resumed from out/ckpt: step {start}, epoch 0.5"] if start else []) + [
        f"12:00:00 step {s}: loss 1.0, global batch 32" for s in range(start + 1, stop + 1)]
    if checkpoint:
        lines.insert(checkpoint - start, CHECKPOINT_PREFIX + f'{{"step": {checkpoint}, '
                     f'"path": "out/ckpt", "seconds": 0.2}}')
    return lines


def test_a_killed_host_restarts_on_the_hosts_left_from_the_checkpoint(capsys):
    run_once, launches = fake_jobs((137, progress(0, 7, checkpoint=5) + KILLED),
                                   (0, progress(5, 10)))
    pool = HostPool(lambda: [("h0", 2), ("h1", 2)], 600)
    status = relaunch_loop.relaunch(flags(), ["train.py", "--resume", "0"], 4,
                                    lambda hosts: [f"{h}:{s}" for h, s in hosts], {}, run_once,
                                    pool)
    out = capsys.readouterr().out
    assert status == 0, out
    assert launches[0] == (["train.py", "--resume", "0"], 4, ["h0:2", "h1:2"])
    assert launches[1] == (["train.py", "--resume", "1"], 2, ["h0:2"])
    assert ("restart 1 after a failure: rank 3 killed by signal 9 (Killed) (host h1, rank(s) "
            "[3], exit status 137); relaunching from the newest checkpoint (step 5 announced)"
            in out), out
    assert "host h1 left out for 600 s" in out
    assert "restart 1: training again from step 5: 2 step(s) lost (the failed run reached " \
           "step 7)" in out, out
    assert "finished after 1 restart(s)" in out


def test_a_failure_before_any_checkpoint_starts_again_from_the_start(capsys):
    run_once, launches = fake_jobs((137, progress(0, 3) + KILLED), (0, progress(0, 10)))
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 0 and launches[1][0] == ["train.py"], launches
    assert "relaunching from the start: no checkpoint was written yet" in out
    assert "training again from step 0: 3 step(s) lost" in out, out


def test_a_failure_that_repeats_stops_at_once_with_one_line(capsys):
    run_once, launches = fake_jobs((1, ["rank 0 on host h0: train.py: error: bad image 7"]))
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 1 and len(launches) == 1
    assert ("stopping: train.py: error: bad image 7 (host h0, rank(s) [0]) would repeat on a "
            "restart" in out), out


def test_the_budget_per_hour_stops_a_failure_that_keeps_coming_back(capsys):
    # killed at another step each time: not the same failure twice in a row
    run_once, launches = fake_jobs(*[(137, progress(0, 2 + i) + KILLED) for i in range(5)])
    status = relaunch_loop.relaunch(flags(restarts_per_hour=2), ["train.py"], 2,
                                    lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 137 and len(launches) == 3, out
    assert [line for line in out.splitlines() if "stopping" in line] == [
        line for line in out.splitlines() if "failed again: rank 3 killed by signal 9" in line
        and "--restarts-per-hour 2 restarts spent" in line], out


def test_resizes_and_failures_share_max_restarts(capsys):
    run_once, launches = fake_jobs((EXIT_RESIZE, []), (137, KILLED), (0, []))
    status = relaunch_loop.relaunch(flags(max_restarts=1), ["train.py"], 2, lambda hosts: [],
                                    {}, run_once)
    assert status == 137 and len(launches) == 2
    assert "restart 2 is above --max-restarts 1" in capsys.readouterr().out


def test_a_restart_goes_on_when_host_discovery_fails_once(capsys, tmp_path):
    script = tmp_path / "discover"                        # garbage on its second run
    script.write_text(f"if [ -e {tmp_path}/ran ]; then echo '%%%'; else touch {tmp_path}/ran; "
                      f"echo h0:2; echo h1:2; fi\n")
    run_once, launches = fake_jobs((137, progress(0, 7, checkpoint=5) + KILLED),
                                   (0, progress(5, 10)))
    pool = HostPool(lambda: membership.discovered_hosts(f"sh {script}"), 600,
                    sleep=lambda s: None)
    status = relaunch_loop.relaunch(flags(), ["train.py"], 4, lambda hosts: [], {}, run_once,
                                    pool)
    out = capsys.readouterr().out
    assert status == 0 and launches[1][1] == 2, out        # on h0, without the failed h1
    assert "launching on the last good list (h0:2, h1:2)" in out, out


def test_mpirun_exiting_0_after_losing_a_host_is_a_failure(capsys):
    """Seen on the emulated cluster: every process of host 1 killed, mpirun printed "A daemon
    failed to report back ... Remote host: h1" and exited 0 (before: "finished")."""
    lost = ["A daemon failed to report back after being spawned. This could", "",
            "  Local host:    vm", "  Remote host:   h1", "  Daemon exit status: 0"]
    assert classify(0, ["done"]) is None
    assert classify(0, lost).cause == "lost host h1 (its mpirun daemon failed)"
    run_once, launches = fake_jobs((0, progress(0, 7, checkpoint=5) + lost),
                                   (0, progress(5, 10)))
    pool = HostPool(lambda: [("h0", 2), ("h1", 2)], 600)
    status = relaunch_loop.relaunch(flags(), ["train.py"], 4, lambda hosts: [], {}, run_once,
                                    pool)
    assert status == 0 and launches[1][1] == 2, capsys.readouterr().out


def test_the_same_failure_twice_in_a_row_stops(capsys):
    """Before: a failure that repeats at the same step (an export that always fails) was
    restarted until --restarts-per-hour was spent (5 launches)."""
    crash = ["nnabla_torus: rank 0 on host h0: unhandled KeyError: 'fc'; aborting the job"]
    run_once, launches = fake_jobs(*[(1, progress(0, 9, checkpoint=5) + crash)] + [
        (1, progress(5, 9) + crash)] * 4)
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 1 and len(launches) == 2, out
    assert ("the training command failed the same way twice in a row: rank 0 crashed "
            "(KeyError) (host h0, rank(s) [0], exit status 1, at step 9); stopping: a restart "
            "would repeat it") in out, out


def test_a_busy_folder_stops_the_launcher_at_its_first_launch(capsys):
    """Before: relaunched 4 times "from the start: no checkpoint was written yet"."""
    run_once, launches = fake_jobs(*[(1, BUSY)] * 5)
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 1 and len(launches) == 1, out
    assert f"stopping: {HOLDER} (host h0, rank(s) [0]) would repeat on a restart" in out, out
    assert "relaunching" not in out, out


def test_the_same_failure_reported_by_another_rank_is_the_same(capsys):
    """Before: the rank that reported first made the causes differ ("rank 0 crashed",
    "rank 1 crashed"): restarted until --restarts-per-hour was spent."""
    crash = "nnabla_torus: rank {} on host h0: unhandled KeyError: 'fc'; aborting the job"
    run_once, launches = fake_jobs(*[(1, progress(0, 9, checkpoint=5) + [crash.format(0)])] + [
        (1, progress(5, 9) + [crash.format(r % 2)]) for r in range(1, 5)])
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 1 and len(launches) == 2, out
    assert ("failed the same way twice in a row: rank 1 crashed (KeyError) (host h0, rank(s) "
            "[1], exit status 1, at step 9)") in out, out


def test_steps_lost_unknown_names_no_flag_of_train_py_as_the_scripts(capsys):
    """Before: "(the failed run printed no step line: --log-every sets how often it does)", a
    flag of examples/imagenet/train.py, not of the user's script."""
    announced = CHECKPOINT_PREFIX + '{"step": 5, "path": "out/ckpt", "seconds": 0.2}'
    run_once, launches = fake_jobs((137, [announced] + KILLED), (0, progress(5, 10)))
    relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert ("training again from step 5: steps lost unknown (the failed run printed no "
            "progress line holding 'step N' before it failed: print them more often, as "
            "train.py's --log-every does)") in out, out


def test_steps_lost_are_never_negative(capsys):
    """Before: "restart 1: training again from step 30: -30 step(s) lost (the failed run
    reached step 0)": the failed run (started on --resume 1) died before its resume line."""
    run_once, launches = fake_jobs((137, ["step 0: the planner's first decision"] + KILLED),
                                   (0, progress(30, 33)))
    status = relaunch_loop.relaunch(flags(), ["train.py", "--resume", "1"], 2,
                                    lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 0, out
    assert ("restart 1: training again from step 30: steps lost unknown (the failed run's step "
            "lines stop at step 0, before step 30)") in out, out


def test_a_resume_without_its_line_is_counted_from_the_announced_checkpoint(capsys):
    """Before: "training again from step 0: 7 step(s) lost" for a relaunch that resumed from
    the checkpoint at step 5 but printed no 'resumed from' line."""
    run_once, launches = fake_jobs((137, progress(0, 7, checkpoint=5) + KILLED),
                                   (0, progress(5, 10)[1:]))
    relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert "training again from step 5: 2 step(s) lost (the failed run reached step 7)" in out
    assert "from step 0" not in out, out


def test_a_script_without_checkpoints_is_told_once_that_restarts_start_it_again(capsys):
    run_once, launches = fake_jobs(*[(137, progress(0, 2 + i) + KILLED) for i in range(3)],
                                   (0, progress(0, 9)))
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 0 and len(launches) == 4, out
    notes = [line for line in out.splitlines() if "announced no checkpoint" in line]
    assert len(notes) == 1 and ("the script announced no checkpoint (a 'nnabla-torus-checkpoint: "
                                '{"step": N, ...}\' line after each): this restart and every '
                                "later one start it from the beginning") in notes[0], out
    assert out.count("relaunching from the start: no checkpoint was written yet") == 3, out


def test_progress_the_launcher_cannot_read_is_said_once_never_as_step_0(capsys):
    """A script whose lines name no step ('iteration 40/100'), resumed by the user's
    --resume 1 and printing no resume line: before, "training again from step 0"."""
    own = [f"iteration {i}/100, loss 0.5" for i in range(40, 44)]
    run_once, launches = fake_jobs((137, own + KILLED), (137, own[:2] + KILLED),
                                   (0, ["step 44: loss 0.4"] + own))
    status = relaunch_loop.relaunch(flags(), ["train.py", "--resume", "1"], 2,
                                    lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == 0, out
    notes = [line for line in out.splitlines() if "cannot read this script's progress" in line]
    assert len(notes) == 1 and "(the failed run printed no 'step N' line)" in notes[0], out
    assert "restart 2: training again: steps lost unknown" in out, out
    assert "from step 0" not in out, out


def test_an_unreadable_checkpoint_line_is_said_once(capsys):
    bad = CHECKPOINT_PREFIX + "written out/ckpt-5"
    run_once, launches = fake_jobs((137, progress(0, 7) + [bad] + KILLED),
                                   (137, progress(0, 3) + [bad] + KILLED), (0, progress(0, 9)))
    relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert out.count("cannot read this script's checkpoint line (JSON with an integer 'step' "
                     f"expected): {bad!r}") == 1, out


def test_a_resize_exit_without_its_request_line_stops(capsys):
    """Before: exit 75 without a valid request was taken as a failure and restarted."""
    def run_once(argv, ranks, mpirun_args, env, watch=None):
        launches.append(argv)
        return EXIT_RESIZE, None, ["nnabla-torus-elastic: grow please"], False
    launches = []
    status = relaunch_loop.relaunch(flags(), ["train.py"], 2, lambda hosts: [], {}, run_once)
    out = capsys.readouterr().out
    assert status == EXIT_RESIZE and len(launches) == 1, out
    assert "exited with status 75 (a resize) without a valid request line" in out, out
