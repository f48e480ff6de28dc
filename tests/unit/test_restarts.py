"""nnabla-torus-run after a failure, without mpirun: the failure classes, the restart budget,
the host pool (cool-down, growth, Slurm's down nodes) and the watch loop driven by a fake job."""
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
    (137, ["srun: error: node2: task 3: Killed"], False, "task(s) 3 Killed (srun)", "node2"),
    (1, ["nnabla_torus: rank 2 on host h1: unhandled MemoryError: ; aborting the job"], False,
     "rank 2 crashed (MemoryError)", "h1"),
    (9, ["loss 1.0"], False, "exit status 9 (no line of the job says why)", None),
])
def test_failures_that_repeat_stop_and_others_restart(status, lines, repeats, cause, host):
    failure = classify(status, lines, placement_of([("h0", 2), ("h1", 2)], 4))
    assert (failure.repeats, failure.cause, failure.host) == (repeats, cause, host)


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
    run_once, launches = fake_jobs(*[(137, progress(0, 2) + KILLED)] * 5)
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
