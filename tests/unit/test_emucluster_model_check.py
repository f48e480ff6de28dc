"""tools/emucluster_model_check.py: the per-placement model agrees with the cost model."""
import json

import numpy as np
import pytest

from nnabla_torus.planning import costmodel
from nnabla_torus.planning.machine_profile import load_profile
from tools import emucluster_model_check as check

MiB = 1 << 20


@pytest.mark.parametrize("hosts,per_host", [(2, 4), (4, 2), (8, 2)])
def test_block_placement_matches_costmodel(hosts, per_host):
    net = check.emulated_network(load_profile("cpu-2core"), 1e9, 1e-4, per_host)
    p = hosts * per_host
    placement = check.host_of_rank(hosts, per_host, "by-host")
    for n in (64 << 10, MiB, 100 * MiB):
        for x in [d for d in range(1, p + 1) if p % d == 0]:
            ours = check.mapped_time(net, "torus2d", p, n, x, placement)
            assert ours == pytest.approx(float(costmodel.allreduce_time(net, "torus2d", p, n, x)))
        ours = check.mapped_time(net, "ring", p, n, p, placement)
        assert ours == pytest.approx(float(costmodel.allreduce_time(net, "ring", p, n)))


def test_host_link_bytes_follow_the_formulas():
    n = 100 * MiB
    by_host = check.host_of_rank(2, 4, "by-host")
    assert check.host_link_bytes(8, 8, n, by_host) == pytest.approx(2 * 7 / 8 * n)  # ring
    assert check.host_link_bytes(8, 4, n, by_host) == pytest.approx(n)  # torus 4x2: 2(Y-1)/Y n
    round_robin = check.host_of_rank(2, 4, "round-robin")
    assert np.array_equal(round_robin, [0, 1, 0, 1, 0, 1, 0, 1])
    # round-robin: every ring edge crosses, 4 of the 8 edges leave each host at once
    assert check.host_link_bytes(8, 8, n, round_robin) == pytest.approx(4 * 2 * 7 / 8 * n)


def test_table_from_benchmark_json(tmp_path, capsys):
    records = [dict(algorithm=a, grid=g, ranks=8, bytes=MiB, time_us=20000.0, busbw_GBps=0.09)
               for a, g in (("ring", "8x1"), ("torus2d", "4x2"), ("native", "-"))]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(records))
    assert check.main([str(path), "--hosts", "2", "--ranks-per-host", "4",
                       "--map", "round-robin"]) == 0
    out = capsys.readouterr().out
    assert "round-robin" in out and out.count("\n") == 6    # header, columns, 3 rows, summary
    native = [line for line in out.splitlines() if line.strip().startswith("native")][0]
    assert native.split()[4] == "-"                         # no model for this placement
    with pytest.raises(SystemExit, match="ranks != hosts x ranks-per-host = 4"):
        check.main([str(path), "--hosts", "2", "--ranks-per-host", "2"])
