"""auto's cached table (nnabla_torus/comm/auto/cache.py): the first job measures and says so,
the next reuses the file without measuring, a changed key measures again, a corrupt file warns
and measures, and every rank uses the same table."""
import glob
import json
import os
import re

import pytest

from tests.mpirun import run_mpi

PROG = "tests/mpi/progs/auto_cache_case.py"
MEASURING = "auto: measuring its size ranges once"


def tables(out, ranks):
    found = re.findall(r"rank (\d) algorithm auto table ('[^']*') source ('[^']*')", out)
    assert sorted(int(r) for r, _, _ in found) == list(range(ranks)), out[-3000:]
    assert len({(t, s) for _, t, s in found}) == 1, out[-3000:]   # every rank agrees
    return found[0][1], found[0][2]


@pytest.mark.slow
def test_the_table_is_measured_once_then_read_from_the_cache(tmp_path):
    env = {"NNABLA_TORUS_CACHE_DIR": str(tmp_path)}
    first = run_mpi(4, [PROG], timeout=180, env=env)
    assert MEASURING in first and first.count(MEASURING) == 1, first[-3000:]
    table, source = tables(first, 4)
    assert source == "'measured at init'"
    [path] = glob.glob(str(tmp_path / "auto-table-*.json"))

    again = run_mpi(4, [PROG], timeout=180, env=env)
    assert MEASURING not in again, again[-3000:]
    assert tables(again, 4) == (table, f"'cached in {path}'")

    # another key (ranks per host): another file, measured again
    other = run_mpi(4, [PROG], timeout=180, env={**env, "NNABLA_TORUS_RANKS_PER_HOST": "2"})
    assert MEASURING in other, other[-3000:]
    assert len(glob.glob(str(tmp_path / "auto-table-*.json"))) == 2

    with open(path, "w") as f:
        f.write("{not json")
    corrupt = run_mpi(4, [PROG], timeout=180, env=env)
    assert "auto: ignoring the unreadable cached table" in corrupt, corrupt[-3000:]
    assert MEASURING in corrupt and tables(corrupt, 4)[1] == "'measured at init'"


@pytest.mark.slow
def test_a_damaged_cached_table_warns_and_measures(tmp_path):
    """Before: an unknown algorithm, fewer algorithms than ranges or string bounds in the
    cached file ended every later job at its first all_reduce, until deleted by hand."""
    env = {"NNABLA_TORUS_CACHE_DIR": str(tmp_path)}
    run_mpi(2, [PROG], timeout=120, env=env)
    [path] = glob.glob(str(tmp_path / "auto-table-*.json"))
    with open(path) as f:
        saved = json.load(f)
    for bounds, names, problem in (
            ([131072], ["native", "tree"], "algorithm 'tree' is not one of"),
            ([131072, 4194304], ["native", "torus2d"], "2 algorithms for 2 bounds"),
            (["128K"], ["native", "torus2d"], "bounds ['128K'] must be ascending positive")):
        with open(path, "w") as f:
            json.dump(dict(saved, bounds=bounds, names=names), f)
        out = run_mpi(2, [PROG], timeout=120, env=env)
        assert f"auto: ignoring the damaged cached table {path} ({problem}" in out, out[-3000:]
        assert MEASURING in out and tables(out, 2)[1] == "'measured at init'"
    with open(path) as f:
        assert json.load(f)["bounds"] != ["128K"]        # measured again and saved over it


def test_an_unwritable_cache_folder_warns_and_the_job_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = run_mpi(2, [PROG], timeout=120, env={"NNABLA_TORUS_CACHE_DIR": str(blocker / "sub")})
    assert "auto: could not cache the measured table" in out, out[-3000:]
    tables(out, 2)
    assert not os.path.isdir(blocker)
