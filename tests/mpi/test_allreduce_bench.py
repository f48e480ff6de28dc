"""tools/allreduce_bench.py at 3 ranks: exact sums of odd sizes split over several arrays, the
per-array(us) column and its JSON records (``--arrays N``: each call all-reduces a list)."""
import json

import pytest

from tests.mpirun import run_mpi


@pytest.mark.parametrize("inplace", ["1", "0"])
def test_arrays_split_the_bytes_and_report_per_array_overhead(tmp_path, inplace):
    out_file = tmp_path / "bench.json"
    out = run_mpi(3, ["tools/allreduce_bench.py", "--sizes", "68,1156", "--arrays", "17",
                      "--inplace", inplace, "--algorithms", "auto,torus2d,ring", "--iters", "2",
                      "--warmup", "1", "--json", str(out_file)], timeout=120)
    assert "arrays 17, inplace " + inplace in out and "per-array(us)" in out, out
    assert "# Out of bounds values : 0 OK" in out, out
    records = json.loads(out_file.read_text())
    assert {r["bytes"] for r in records} == {68, 1156}          # 17 and 289 floats
    assert {r["algorithm"] for r in records} == {"auto", "torus2d", "ring", "native"}
    for r in records:
        assert r["correct"] and r["arrays"] == 17 and r["inplace"] == (inplace == "1"), r
        assert isinstance(r["per_array_us"], float), r


@pytest.mark.parametrize("inplace", ["0", "1"])
def test_per_array_bench_times_each_length_and_keeps_the_values(inplace):
    """tools/research/per_array_bench.py (one rank): a row per list length; it raises if the no-op
    exchange changed any array (pack and unpack must give every value back)."""
    out = run_mpi(1, ["tools/research/per_array_bench.py", "--arrays", "1,17,300", "--repeats", "2",
                      "--inplace", inplace], timeout=120)
    assert f"inplace {inplace}" in out, out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert [int(r[0]) for r in rows] == [1, 17, 300], out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), out
