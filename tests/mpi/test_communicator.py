"""The torus communicator under mpirun: exact sums on 1-8 ranks, every grid and algorithm.

Also bad input (an error on every rank), a missing rank (abort naming it) and a killed rank
(the job ends, the dead rank and only it is named). Each launch runs
many cases (``tests/mpi/progs/comm_cases.py``) because an mpirun costs seconds here; a failing
case aborts its launch, and the assertion shows the case and its traceback. The same cases run
on the fake NCCL backend, and on real NCCL when nnabla-ext-cuda sees enough GPUs (else skipped).
"""
import functools
import importlib.util
import re
import subprocess
import sys
import time

import pytest

from nnabla_torus.comm.topology import default_grid, factor_pairs
from nnabla_torus.launching.mpirun_cmd import mpi_library, mpirun_path
from tests.mpirun import DIED, LOST, expect_passed, run_mpi
from tests.slowdown import scaled

PROG = "tests/mpi/progs/comm_cases.py"


@functools.lru_cache(maxsize=None)
def cuda_devices():
    """GPUs visible to nnabla-ext-cuda, or 0 when it is not installed. Counted in a child
    process: importing nnabla_ext.cuda here would initialise CUDA in pytest's process, which
    then outlives every GPU test's ranks (a context on GPU 0 the ranks share)."""
    if importlib.util.find_spec("nnabla_ext") is None or \
            importlib.util.find_spec("nnabla_ext.cuda") is None:
        return 0
    done = subprocess.run([sys.executable, "-c", "from nnabla_ext.cuda import get_device_count;"
                                                 " print(get_device_count())"],
                          capture_output=True, text=True, timeout=300)
    last = done.stdout.strip().splitlines()[-1:] or ["0"]
    return int(last[0]) if done.returncode == 0 and last[0].isdigit() else 0


def nccl_cases(rank_counts):
    """("nccl", ranks) params, marked ``gpu`` and skipped (with the reason) without that many
    GPUs."""
    gpus = cuda_devices()
    return [pytest.param("nccl", r, id=f"nccl-{r}", marks=[pytest.mark.gpu, pytest.mark.skipif(
        gpus < r, reason=f"nccl backend on {r} ranks needs {r} GPUs and nnabla-ext-cuda; "
                         f"{gpus} visible")]) for r in rank_counts]


def backend_cases():
    """(backend, ranks) pairs: MPI on 1-8 ranks; the fake NCCL on 3 and 4; real NCCL on GPUs."""
    cases = [pytest.param("mpi", r, id=f"mpi-{r}") for r in range(1, 9)]
    cases += [pytest.param("fake-nccl", r, id=f"fake-nccl-{r}") for r in (3, 4)]
    return cases + nccl_cases((2, 4, 8))


@pytest.mark.slow
@pytest.mark.parametrize("backend, ranks", backend_cases())
def test_collectives_are_exact_on_every_grid_and_algorithm(backend, ranks):
    env = {"NNABLA_TORUS_BACKEND": backend}
    if backend == "fake-nccl":
        env["SKIP_RESNET50"] = "1"            # already covered on MPI; costs ~30 s here
    out = run_mpi(ranks, [PROG, "correctness"], timeout=240, env=env)
    expect_passed(out, f"comm_cases correctness on {ranks} ranks")
    ok = re.findall(r"^OK (.*) \(", out, re.M)
    for grid in factor_pairs(ranks):   # the default grid's data cases run under "torus2d"
        assert f"torus2d grid={grid}: layout" in ok, grid
        assert (f"torus2d grid={grid}: fused and in-place lists" in ok
                or grid == default_grid(ranks, ranks)[0]), grid
    for algorithm in ("ring", "native", "hierarchical", "torus2d wire_fp16", "auto"):
        assert f"{algorithm}: fused and in-place lists" in ok, algorithm
    assert "auto: routes by size" in ok
    for name in ("torus2d", "native", "hierarchical"):   # NCCL: through MPI on the host
        assert f"{name}: integers" in ok, name
    if backend == "mpi":
        assert "auto: same choice on every rank" in ok
        assert out.count("has no software term for") == 1, out   # said once, on rank 0
        if ranks > 1:
            assert "hierarchical: shared pieces" in ok
        if ranks % 2 == 0 and ranks > 2:
            assert "auto hosts-of-2: routes by size" in ok
            assert "hierarchical hosts-of-2: shared pieces" in ok
    for per_host in (2, 4):
        if ranks % per_host == 0 and ranks > per_host:
            assert f"hierarchical hosts-of-{per_host}: fused and in-place lists" in ok
            assert f"torus2d hosts-of-{per_host}: layout" in ok
    if ranks in (4, 6) and "SKIP_RESNET50" not in env:
        assert "torus2d: ResNet-50 161 gradients" in ok
    assert "torus2d: loss_scaling" in ok and "torus2d: sqnorms" in ok
    if backend == "mpi" and ranks in (4, 6, 8):
        assert "torus2d hosts-of-2 pipelined: division=True inplace=False" in ok
    # A prime world falls back to a ring and says so once (rank 0 only).
    prime = ranks in (2, 3, 5, 7)
    assert out.count(f"world size {ranks} is prime") == prime, out


def bad_input_lines(out, ranks, case):
    """This case's error line of every rank, as {rank: text}."""
    lines = dict(re.findall(rf"^rank (\d+): {case}: (.*)$", out, re.M))
    assert sorted(map(int, lines)) == list(range(ranks)), f"{case}: not every rank reported\n{out}"
    return {int(r): text for r, text in lines.items()}


BAD_INPUT = {  # case: text every rank's error must contain
    "shape_changes_after_agreement": "ValueError: all_reduce (torus2d, group 'world'): ranks "
                                     "called it with different arguments",
    "auto_routes_differ": "ValueError: all_reduce (auto, group 'world'): ranks called it with "
                          "different arguments",
    "shapes_differ": "ValueError: all_reduce (torus2d, group 'world'): ranks called it with "
                     "different arguments",
    "dtypes_differ": "different arguments",
    "cached_list_reshaped_on_one_rank": "different arguments",
    "list_lengths_differ": "different arguments",
    "flags_differ": "different arguments",
    "operations_differ": "different arguments",
    "algorithms_differ": "different arguments",
    "wire_formats_differ": "different arguments",
    "pieces_differ": "ValueError: all_reduce (torus2d, group 'world'): ranks called it with "
                     "different arguments",
    "negative_pieces": "ValueError: environment variable NNABLA_TORUS_PIPELINE_BYTES='-1' is not "
                       "a valid value: must be an integer >= 0",
    "all_gather_list_differs": "ValueError: all_gather (group 'world'): ranks called it with "
                               "different arguments",
    "all_gather_list_wrong_everywhere": "ValueError: all_gather needs 4 arrays of shape (5,) in "
                                        "ndarray_list, got [(4,), (4,), (4,), (4,)]",
    "reduce_scatter_list_differs": "different arguments",
    "grid_does_not_fit": "ValueError: grid 3x3 has 9 ranks but the world has 4; use X*Y == 4: "
                         "one of 4x1, 2x2, 1x4",
    "malformed_grid": "ValueError: grid '2by2' is not of the form XxY",
    "unknown_algorithm": "ValueError: unknown all-reduce algorithm 'tree'; choose one of "
                         "torus2d, ring, hierarchical, native, auto",
    "unknown_algorithm_env": "unknown all-reduce algorithm 'bogus'",
    "hosts_do_not_divide": "ValueError: NNABLA_TORUS_RANKS_PER_HOST=3 does not divide the world "
                           "size 4",
    "shared_row_first_call_differs": "ValueError: all_reduce (torus2d, group 'world'): ranks "
                                     "called it with different arguments",
    "shared_row_small_vs_large": "different arguments",
    "shared_row_shapes_differ": "different arguments",
    "shared_row_empty_vs_data": "different arguments",
    "not_a_member": "is not a member of group",
    "unknown_group": "ValueError: unknown group 'nosuch'",
    # One rank with another backend has other settings (before: IndexError on rank 0).
    "backends_differ": "ValueError: init: ranks were given different settings",
}


def test_bad_input_raises_on_every_rank_and_leaves_the_communicator_usable():
    ranks = 4
    out = run_mpi(ranks, [PROG, "bad-input"], timeout=120)
    for case, text in BAD_INPUT.items():
        for rank, line in bad_input_lines(out, ranks, case).items():
            assert text in line, f"rank {rank}, {case}: {line}"
    # the fields that differ, labelled (before: each rank's call as an unlabelled tuple)
    for case, mine, theirs in (
            ("shape_changes_after_agreement", "(('float32', (17,)),)", "(('float32', (18,)),)"),
            ("shapes_differ", "(('float32', (17,)), ('float32', (3,)))",
             "(('float32', (18,)), ('float32', (3,)))"),
            ("dtypes_differ", "(('float32', (17,)),)", "(('float16', (17,)),)")):
        expected = f"|   arrays: {mine} on rank(s) [0, 1, 2]; {theirs} on rank(s) [3]"
        assert all(line.endswith(expected) for line in bad_input_lines(out, ranks, case).values())
    backends = bad_input_lines(out, ranks, "backends_differ")
    assert all("backend: 'mpi' on rank(s) [0, 1, 2]; 'fake-nccl' on rank(s) [3]" in line and
               "segment_bytes: 4194304 on rank(s) [0, 1, 2]; unset on rank(s) [3]" in line
               for line in backends.values()), backends
    members = bad_input_lines(out, ranks, "not_a_member")
    assert all(f"rank {r} is not a member of group 'only{(r + 1) % ranks}'" in members[r]
               for r in range(ranks))
    assert out.count("still works") == ranks, out


@pytest.mark.parametrize("case, listed, ranks", [
    ("order", "rank {last}: group 'order' with ranks ", 2),
    ("order", "rank {last}: group 'order' with ranks ", 4),
    ("members", "rank 0: group 'members' with ranks [0, 1]", 4)])   # 2 never waits for 3
def test_new_group_lists_that_differ_are_named_at_once(ranks, case, listed):
    """Before: new_group blocked until the timeout, then the next bcast was blamed."""
    start = time.monotonic()
    out = run_mpi(ranks, [PROG, "groups-differ"], timeout=60,
                  env={"CASE": case, "NNABLA_TORUS_TIMEOUT": "30"})
    name = f"group_{case}s_differ" if case == "order" else "group_members_differ"
    for rank, line in bad_input_lines(out, ranks, name).items():
        assert f"ValueError: new_group '{case}': members passed different groups" in line, line
        assert listed.format(last=ranks - 1) in line, line
    assert time.monotonic() - start < scaled(25)


def test_a_refused_shared_window_falls_back_and_says_why_once():
    out = run_mpi(4, [PROG, "shm-refused"], timeout=120)
    expect_passed(out, "comm_cases shm-refused on 4 ranks")
    assert out.count("shared-memory path off for ranks [0, 1, 2, 3] (rank 0: "
                     "MPI.Win.Allocate_shared failed: ") == 1, out   # then the library's words


@pytest.mark.parametrize("check, missing", [("1", 2), ("1", 0), ("0", 2)])
def test_a_missing_rank_aborts_the_job_quickly_and_is_named(check, missing):
    """Rank ``missing`` never calls all_reduce: the others give up after NNABLA_TORUS_TIMEOUT=3 s.

    With the argument check (default) rank 0 names the missing rank, or, when rank 0 is the one
    missing, the others name it; without the check, the ring neighbours of the missing rank name
    it while waiting for data.
    """
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:       # run_mpi raises on a non-zero exit
        run_mpi(4, [PROG, "missing-rank"], timeout=60,
                env={"NNABLA_TORUS_TIMEOUT": "3", "NNABLA_TORUS_CHECK": check,
                     "MISSING_RANK": str(missing)})
    elapsed = time.monotonic() - start
    out = str(failed.value)
    assert re.match(r"exit [1-9]\d*: ", out), out[:2000]  # not "timeout after": no hang
    assert "all_reduce returned" not in out and "PASSED" not in out, out
    assert "MPI_ABORT was invoked" in out or "aborting the job" in out, out
    if check == "1" and missing != 0:
        assert f"rank(s) [{missing}] did not arrive at all_reduce" in out, out
    else:
        assert re.search(rf"still waiting for rank\(s\) \[{missing}\]", out), out
    named = set(map(int, re.findall(r"still waiting for rank\(s\) \[(\d+)\]", out)))
    assert named <= {missing} or check == "0", out   # only the missing rank is named
    assert "NNABLA_TORUS_TIMEOUT" in out, out
    assert elapsed < 40, f"took {elapsed:.0f} s to abort"
    assert "lost rank" not in out, out    # a late rank is not a dead one


@pytest.mark.parametrize("victim", [3, 0])
def test_a_killed_rank_ends_the_job_and_is_named(victim):
    """Rank ``victim`` SIGKILLs itself inside an all-reduce loop: every process ends, non-zero,
    within the timeout, and the output names the dead rank and no survivor.

    On one host the survivors wait on shared memory, which cannot see a death, so mpirun (which
    notices the exit at once) names it; across hosts they name it too (test_emucluster.py).
    """
    timeout = 20
    start = time.monotonic()
    with pytest.raises(AssertionError) as failed:       # run_mpi raises on a non-zero exit
        run_mpi(4, ["tests/mpi/progs/emu_fault.py", "--size", "1M", "--victim", str(victim),
                    "--kill-at", "3"], timeout=60, env={"NNABLA_TORUS_TIMEOUT": str(timeout)})
    elapsed = time.monotonic() - start
    out = str(failed.value)
    assert re.match(r"exit [1-9]\d*: ", out), out[:2000]  # not "timeout after": no hang
    assert f"KILL {victim} " in out and "DONE" not in out, out
    if mpi_library(mpirun_path()) == "openmpi":
        assert [int(r) for r in DIED.findall(out)] == [victim], out
    else:   # hydra: MPICH names a PID only, Intel MPI every rank it then killed too
        assert "BAD TERMINATION" in out, out
    assert all(lost == str(victim) for _, lost in LOST.findall(out)), out
    assert "MPI_ABORT was invoked" not in out, out       # no survivor blamed by mpirun
    assert elapsed < timeout, f"took {elapsed:.0f} s to end"
