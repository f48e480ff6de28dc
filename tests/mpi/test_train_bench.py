"""tools/train_bench.py at 2 ranks writes the agreed JSON records (with and without overlap)."""
import json

from tests.mpirun import run_mpi

KEYS = {"arch", "width", "image_size", "ranks", "local_batch", "step_time_s", "step_time_ci95_s",
        "allreduce_s", "allreduce_share", "images_per_sec", "images_per_sec_per_rank", "overlap"}


def test_train_bench_records(tmp_path):
    out_file = tmp_path / "bench.json"
    out = run_mpi(2, ["tools/train_bench.py", "--width", "0.125", "--image-size", "16",
                      "--classes", "10", "--batch", "4", "--iters", "2", "--warmup", "1",
                      "--bucket-mib", "0.01", "--json", str(out_file)], timeout=120)
    assert "# train_bench" in out
    records = json.loads(out_file.read_text())
    assert [r["overlap"] for r in records] == [False, True]
    for r in records:
        assert KEYS <= set(r), KEYS - set(r)
        assert r["ranks"] == 2 and r["step_time_s"] > 0 and 0 <= r["allreduce_share"] < 1
        assert abs(r["images_per_sec"] - 2 * 4 / r["step_time_s"]) < 1e-6
