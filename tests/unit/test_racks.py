"""The optional rack level: hand-worked spine hops, profiles checked, two levels unchanged."""
import numpy as np
import pytest

from nnabla_torus.planning import costmodel as cm
from nnabla_torus.planning import planner
from nnabla_torus.planning.costmodel import Link, Network
from nnabla_torus.planning.machine_profile import load_profile, profile_from_dict, profile_to_dict

# 1 rank per host, 2 hosts per rack; free NVLink, 1 us + 1 GB/s between hosts, spine 2 us at
# 1 GB/s per host with 4:1 oversubscription: a rack's uplink carries 2 x 1 GB/s / 4 = 0.5 GB/s.
TWO_LEVEL = Network(Link(0.0, 1e15), Link(1e-6, 1e9), 0.0, 1, 0, 0, {})
RACKS = TWO_LEVEL._replace(hosts_per_rack=2, spine=Link(2e-6, 1e9), oversubscription=4.0)


def ms(terms):
    return {k: round(float(v) * 1e3, 6) for k, v in terms.items()}


def test_ring_across_two_racks_is_paced_by_the_uplink():
    # 4 ranks, 4 MB: 3 steps of 1 MB per phase. Hosts: 1 us + 1 MB / 1 GB/s = 1.001 ms;
    # the ring leaves each rack once: 2 us + 1 MB / 0.5 GB/s = 2.002 ms per step.
    assert ms(cm.allreduce_terms(TWO_LEVEL, "ring", 4, 4e6)) == {
        "reduce_scatter": 3.003, "all_gather": 3.003}
    assert ms(cm.allreduce_terms(RACKS, "ring", 4, 4e6)) == {
        "reduce_scatter": 6.006, "all_gather": 6.006}


def test_torus_columns_cross_the_spine_rows_stay_in_the_rack():
    # 2x2: rows {0,1} {2,3} are racks; columns {0,2} {1,3} leave each rack 2 at a time.
    # Rows: 1 step of 2 MB between hosts: 1 us + 2 ms. Columns: 1 step of 1 MB (the 2 MB
    # shard halved): hosts 1.001 ms, uplink 2 us + 2 x 1 MB / 0.5 GB/s = 4.002 ms.
    assert cm.rack_links(RACKS, 2, 2, rows=True) == (False, 1)
    assert cm.rack_links(RACKS, 2, 2, rows=False) == (True, 2)
    assert ms(cm.allreduce_terms(RACKS, "torus2d", 4, 4e6, grid_x=2)) == {
        "row_reduce_scatter": 2.001, "column_reduce_scatter": 4.002,
        "column_all_gather": 4.002, "row_all_gather": 2.001}
    # 4x1 (one ring of 4) crosses the spine on its 3 steps of 1 MB with one flow a rack.
    assert ms(cm.allreduce_terms(RACKS, "torus2d", 4, 4e6, grid_x=4))["row_reduce_scatter"] \
        == 6.006


def test_odd_rack_mapping_counts_flows_explicitly():
    # 6 ranks, racks of 4 (2 hosts x 2): rows of 3 straddle racks; the explicit ring walk.
    net = TWO_LEVEL._replace(gpus_per_host=2, hosts_per_rack=2, spine=Link(0, 1e9))
    grid = np.arange(6).reshape(2, 3)
    assert cm.rack_links(net, 3, 2, rows=True) == cm.ring_links(grid, np.arange(6) // 4)
    assert cm.rack_links(net, 3, 2, rows=False) == cm.ring_links(grid.T, np.arange(6) // 4)


@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_one_rack_for_every_host_changes_nothing(algorithm):
    abci = load_profile("abci").network
    two = abci._replace(hosts_per_rack=0, spine=None, oversubscription=1.0)
    one_rack = abci._replace(hosts_per_rack=1088)
    p = np.array([4, 8, 136, 544, 1088, 2176, 4352])
    n = np.array([4e3, 5.1e7])[:, None]
    assert np.array_equal(cm.allreduce_time(two, algorithm, p, n),
                          cm.allreduce_time(one_rack, algorithm, p, n))


def test_cpu_profile_has_two_levels():
    net = load_profile("cpu-2core").network
    assert (net.hosts_per_rack, net.spine, net.oversubscription) == (0, None, 1.0)


def test_abci_grid_choice_and_allreduce_with_and_without_racks():
    prof = load_profile("abci")
    assert (prof.network.hosts_per_rack, prof.network.oversubscription) == (34, 3.0)
    flat = prof._replace(network=prof.network._replace(hosts_per_rack=0, spine=None))
    grad = prof.models["resnet50"].grad_bytes
    picks = {}
    for name, p in (("two", flat), ("three", prof)):
        for gpus in (1088, 2176):
            best = planner.plan(p, "resnet50", counts=[gpus], target_batch=32 * gpus,
                                local_batches=[32], accum_steps=[1]).best
            picks[name, gpus] = best.grid
    # 1,088 GPUs = 8 racks: the rows of 64 (16 hosts) straddle racks, so the 17 columns'
    # 64 flows per rack share a third of the rack's bandwidth; rows of 32 halve them.
    assert picks == {("two", 1088): "64x17", ("three", 1088): "32x34",
                     ("two", 2176): "64x34", ("three", 2176): "64x34"}
    t2 = cm.allreduce_time(flat.network, "torus2d", 2176, grad, 64)
    t3 = cm.allreduce_time(prof.network, "torus2d", 2176, grad, 64)
    assert 1.0 < t3 / t2 < 1.05                       # ~5.6 -> ~5.7 ms: latency-bound columns
    # A rack-long row (X = 136) pushes 136 column flows through one uplink: 3x the host NICs.
    assert cm.rack_links(prof.network, 136, 16, rows=False) == (True, 136)
    assert cm.allreduce_time(prof.network, "torus2d", 2176, grad, 136) > \
        cm.allreduce_time(flat.network, "torus2d", 2176, grad, 136)


def rack_profile(**racks):
    raw = profile_to_dict(load_profile("abci"))
    raw["racks"].update(racks)
    return raw


@pytest.mark.parametrize("racks, message", [
    ({"hosts_per_rack": 33}, r"racks.hosts_per_rack=33 does not fit hosts=1088: .*divides "
                             r"hosts; set hosts to racks x hosts_per_rack"),
    ({"hosts_per_rack": 2000}, r"racks.hosts_per_rack=2000 does not fit hosts=1088"),
    ({"oversubscription": 0.5}, r"racks.oversubscription: 0.5 must be a number >= 1"),
    ({"hosts_per_rack": 8.5}, r"racks.hosts_per_rack: 8.5 must be an integer >= 1"),
    ({"uplinks": 8}, r"profile racks: unknown key\(s\) \['uplinks'\]"),
])
def test_inconsistent_rack_level_is_an_error_naming_the_key(racks, message):
    with pytest.raises(ValueError, match=message):
        profile_from_dict(rack_profile(**racks))


def test_rack_level_round_trips_through_the_file_form():
    prof = load_profile("abci")
    again = profile_from_dict(profile_to_dict(prof))
    assert again.network == prof.network and again.extra["run"] == prof.extra["run"]


@pytest.mark.parametrize("rows", [True, False])
def test_closed_form_links_match_the_ring_walk_for_every_small_grid(rows):
    # Racks of any size against grids of any shape: straddling rows and short columns.
    for g in range(1, 14):
        x, y = np.meshgrid(np.arange(1, 14), np.arange(1, 14))
        crosses, flows = cm.grid_links(x, y, g, rows)
        for xi, yi, c, f in zip(x.ravel(), y.ravel(), crosses.ravel(), flows.ravel()):
            walk = np.arange(xi * yi).reshape(yi, xi)
            want = cm.ring_links(walk if rows else walk.T, np.arange(xi * yi) // g)
            assert (bool(c), int(f) if c else 0) == want, (g, xi, yi)


def test_explain_says_which_phase_crosses_the_spine():
    from nnabla_torus.cli import plan as plan_cli
    prof = load_profile("abci")
    best = planner.plan(prof, "resnet50", counts=[2176], target_batch=69632,
                        local_batches=[32], accum_steps=[1]).best
    lines = plan_cli.explain(prof, "resnet50", best._replace(grid="4x544"), 1281167, 90)
    assert "  row phases: inside each host; inside each rack" in lines
    assert ("  column phases: cross hosts, 4 flow(s) out of a host; cross the spine, 4 flow(s) "
            "out of a rack") in lines
