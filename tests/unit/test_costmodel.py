"""Cost model invariants over seeded random parameters, and cases worked by hand."""
import numpy as np
import pytest

from nnabla_torus.planning import costmodel as cm
from nnabla_torus.planning.costmodel import han as cm_han, links as cm_links
from nnabla_torus.planning.costmodel import Compute, Link, Network, Software

RNG = np.random.default_rng(1234)


def random_network(rng, g=None):
    g = int(g or rng.choice([1, 2, 4, 8]))
    algos = cm.ALGORITHMS
    return Network(Link(rng.uniform(1e-7, 1e-4), rng.uniform(1e8, 1e11)),
                   Link(rng.uniform(1e-7, 1e-4), rng.uniform(1e8, 1e11)),
                   rng.uniform(0, 1e-9), g, int(rng.choice([0, 1, g])),
                   int(rng.choice([0, 10000, 1 << 20])),
                   {a: Software(rng.uniform(0, 1e-5), rng.uniform(0, 1e-10)) for a in algos})


def one_level(a, bandwidth, g=10 ** 6):
    """Every rank on one host, no sharing, no reduction cost, no software cost."""
    return Network(Link(a, bandwidth), Link(a, bandwidth), 0.0, g, 0, 0, {})


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("algorithm", cm.ALGORITHMS)
def test_time_grows_with_bytes(seed, algorithm):
    rng = np.random.default_rng(seed)
    net = random_network(rng)
    p = int(rng.integers(2, 65)) * net.gpus_per_host
    sizes = np.sort(rng.uniform(1, 1e9, 50))
    t = cm.allreduce_time(net, algorithm, p, sizes)
    assert np.all(np.diff(t) >= 0) and np.all(t > 0)


@pytest.mark.parametrize("seed", range(20))
def test_torus_on_one_row_or_column_is_the_ring(seed):
    rng = np.random.default_rng(seed)
    net = random_network(rng)
    net = net._replace(software={})   # per-algorithm implementation costs differ by design
    p = int(rng.integers(1, 65)) * net.gpus_per_host
    n = rng.uniform(1, 1e9, 10)
    ring = cm.allreduce_time(net, "ring", p, n)
    np.testing.assert_allclose(cm.allreduce_time(net, "torus2d", p, n, grid_x=p), ring)
    np.testing.assert_allclose(cm.allreduce_time(net, "torus2d", p, n, grid_x=1), ring)


@pytest.mark.parametrize("seed", range(10))
def test_one_level_bandwidth_term_is_the_optimum(seed):
    """With one link level and zero latency every algorithm moves 2(p-1)/p * n bytes."""
    rng = np.random.default_rng(seed)
    bandwidth, n = rng.uniform(1e8, 1e11), rng.uniform(1e3, 1e9)
    x, y = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    p = x * y
    net = one_level(0.0, bandwidth)
    expected = 2 * (p - 1) / p * n / bandwidth
    for algorithm, grid_x in (("ring", None), ("torus2d", x)):
        t = cm.allreduce_time(net, algorithm, p, n, grid_x)
        assert t == pytest.approx(expected, rel=1e-12)


def test_latency_steps_fall_from_2p_to_2x_plus_2y():
    a = 1e-3
    net = one_level(a, 1e30)
    assert cm.allreduce_time(net, "ring", 64, 1.0) == pytest.approx(2 * 63 * a)
    assert cm.allreduce_time(net, "torus2d", 64, 1.0, grid_x=8) == pytest.approx(2 * 14 * a)


def test_hand_worked_two_hosts():
    """8 ranks, 4 per host, 2x ring over hosts: 14 steps paced by the inter link.

    n = 8 MB: chunk 1 MB; inter hop = 10 us + 1 MB / 1 GB/s = 1.01 ms; intra hop = 1 us +
    1 MB/10 GB/s = 0.101 ms; 7 reduce-scatter + 7 all-gather steps of 1.01 ms, plus 7 adds of
    1 MB at 0.1 ns/B = 0.1 ms each: 14.14 ms + 0.7 ms = 14.84 ms.
    """
    net = Network(Link(1e-6, 10e9), Link(10e-6, 1e9), 1e-10, 4, 4, 0, {})
    assert cm.allreduce_time(net, "ring", 8, 8e6) == pytest.approx(14.84e-3)
    # torus 4x2: rows inside hosts (3+3 steps of 2 MB intra: 1 us + 0.2 ms, adds 0.2 ms x 3),
    # columns across hosts with 4 flows sharing 1 GB/s: 1+1 steps of 1 MB shards:
    # 10 us + 4 ms each, add 0.1 ms once.
    rows = 6 * (1e-6 + 2e6 / 10e9) + 3 * 2e6 * 1e-10
    cols = 2 * (10e-6 + 1e6 * 4 / 1e9) + 1e6 * 1e-10
    assert cm.allreduce_time(net, "torus2d", 8, 8e6, grid_x=4) == pytest.approx(rows + cols)
    assert cm.allreduce_time(net, "hierarchical", 8, 8e6) == pytest.approx(rows + cols)


def test_native_switches_to_recursive_doubling_for_small_messages():
    net = one_level(1e-6, 1e9)._replace(native_switch_bytes=1000)
    small = cm.allreduce_terms(net, "native", 8, 100)
    assert small["reduce_scatter"] == 0 and small["recursive_doubling"] == pytest.approx(
        3 * (1e-6 + 100 / 1e9))
    # 6 ranks: 2 doubling levels plus 2 extra steps for the non-power of two
    assert cm.allreduce_time(net, "native", 6, 100) == pytest.approx(4 * (1e-6 + 100 / 1e9))
    large = cm.allreduce_terms(net, "native", 8, 1e6)
    assert large["recursive_doubling"] == 0
    assert sum(large.values()) == pytest.approx(cm.allreduce_time(net, "ring", 8, 1e6))


@pytest.mark.parametrize("seed", range(30))
def test_closed_form_links_match_explicit_mapping(seed):
    rng = np.random.default_rng(seed)
    g = int(rng.choice([1, 2, 3, 4, 6, 8]))
    x, y = int(rng.integers(1, 13)), int(rng.integers(1, 13))
    for rows in (True, False):
        crosses, flows = cm.grid_links(x, y, g, rows)
        want_c, want_f = cm_links._explicit_links(x, y, g, rows)
        assert bool(crosses) == want_c
        if want_c:
            assert int(flows) == want_f


def test_ring_links_any_mapping():
    # round-robin placement: every ring edge leaves its host
    crosses, flows = cm.ring_links(np.arange(8)[None], np.arange(8) % 2)
    assert crosses and flows == 4


def test_bad_grid_and_algorithm_raise():
    net = one_level(1e-6, 1e9)
    with pytest.raises(ValueError, match="divide"):
        cm.allreduce_time(net, "torus2d", 8, 1e6, grid_x=3)
    with pytest.raises(ValueError, match="unknown"):
        cm.allreduce_time(net, "tree", 8, 1e6)


@pytest.mark.parametrize("seed", range(20))
def test_step_time_and_efficiency(seed):
    rng = np.random.default_rng(seed)
    net = random_network(rng)
    comp = Compute(rng.uniform(0, 0.05), rng.uniform(1e-5, 1e-2), rng.uniform(1, 8), 256,
                   int(rng.uniform(1e5, 1e9)), 0)
    p = np.arange(1, 65) * net.gpus_per_host
    batch = int(rng.integers(1, 257))
    for algorithm in cm.ALGORITHMS:
        eff = cm.scaling_efficiency(net, comp, algorithm, p, batch)
        assert np.all(eff > 0) and np.all(eff <= 1 + 1e-12)
        terms = cm.step_terms(net, comp, algorithm, p, batch)
        # overlap lies between full overlap (max) and none (sum)
        assert np.all(terms["total"] >= np.maximum(terms["compute"], terms["allreduce"]) - 1e-15)
        assert np.all(terms["total"] <= terms["compute"] + terms["allreduce"] + 1e-15)
    assert cm.scaling_efficiency(net, comp, "ring", 1, batch) == pytest.approx(1.0)


def test_accumulation_and_memory_limit():
    net = one_level(1e-6, 1e9)
    comp = Compute(0.01, 0.001, 1.0, 32, 4_000_000, 0)
    one = cm.step_terms(net, comp, "ring", 4, 32, accum_steps=1)
    two = cm.step_terms(net, comp, "ring", 4, 32, accum_steps=2)
    assert two["total"] == pytest.approx(one["total"] + one["compute"])
    with pytest.raises(ValueError, match="memory limit"):
        cm.step_time(net, comp, "ring", 4, 33)


def test_cpu_sharing_slows_oversubscribed_ranks():
    net = Network(Link(1e-6, 1e9), Link(1e-6, 1e9), 0.0, 64, 2, 0, {})
    two, eight = (cm.allreduce_terms(net, "ring", p, 8e6)["all_gather"] for p in (2, 8))
    # 8 ranks on 2 slots: each hop 4x slower; 7 steps of 1 MB vs 1 step of 4 MB
    assert eight == pytest.approx(4 * 7 * (1e-6 + 1e6 / 1e9))
    assert two == pytest.approx(1e-6 + 4e6 / 1e9)


def test_cache_blend_and_oversubscription_wait():
    """1 MiB cache, 4 GB/s in cache, 1 GB/s beyond; 5 ms wait per call above 2 ranks a host."""
    net = Network(Link(0.0, 1e9), Link(0.0, 1e9), 0.0, 64, 2, 0, {}, 5e-3, 1 << 20, 4e9)
    small = 1 << 18   # 2 ranks x 2 x 256 KiB = 1 MiB: all in cache; 2 steps of n/2
    assert cm.allreduce_time(net, "ring", 2, small) == pytest.approx(small / 4e9)
    big = 1 << 20     # working set 4 MiB: a quarter in cache
    assert cm.allreduce_time(net, "ring", 2, big) == pytest.approx(big * (0.25 / 4e9 + 0.75 / 1e9))
    four = cm.allreduce_terms(net, "ring", 4, small)
    assert four["oversubscription_wait"] == pytest.approx(5e-3)
    assert "oversubscription_wait" not in cm.allreduce_terms(net._replace(
        oversubscribed_wait_s=0.0), "ring", 4, small)


def han_net(g=4, slots=4, **kw):
    """intra 10 us + 1 GB/s, inter 20 us + 100 MB/s, adds 0.1 ns/B, han on."""
    return Network(Link(10e-6, 1e9), Link(20e-6, 1e8), 1e-10, g, slots, 10000, {},
                   native_hierarchical=True, **kw)


def test_han_leader_bytes_by_host_count():
    # H = 2: chain in, linear out, 1 segment each way; H = 4: leader 0 sends 3/4 (reduce-
    # scatter) + 3 copies (linear bcast); H = 8: 7/8 + 1 (chain) out, 2 * 7/8 in.
    assert cm_han._han_leader_bytes([2, 3, 4, 8]) == pytest.approx([1, 2 / 3 + 2, 3.75, 1.875])


def test_han_hand_worked_two_hosts():
    """2 hosts x 4 ranks, 256 KiB = 4 segments of m = 64 KiB (copy 65.536 us, add 6.5536 us)."""
    net = han_net()
    copy, add, link = 65.536e-6, 6.5536e-6, 655.36e-6   # m / 1 GB/s, m * 0.1 ns, m / 100 MB/s
    lr = 2 * (10e-6 + copy + add)          # binomial reduce among 4: 2 rounds
    ur = 20e-6 + link + add                # chain of the 2 leaders into leader 0
    ub = 20e-6 + link                      # linear bcast: one copy to the other leader
    lb = 10e-6 + 3 * copy                  # leader copies to 3 ranks
    steady = max(2 * (copy + add), link + 20e-6 + add) + 3 * copy
    t = cm.allreduce_terms(net, "native", 8, 4 * 65536)
    assert t["han_in_host_reduce"] == pytest.approx(lr)
    assert t["han_leaders_reduce"] == pytest.approx(ur)
    assert t["han_leaders_bcast"] == pytest.approx(ub)
    assert t["han_in_host_bcast"] == pytest.approx(lb)
    assert t["han_pipeline"] == pytest.approx(3 * steady)
    assert t["reduce_scatter"] == 0 and t["recursive_doubling"] == 0
    assert cm.allreduce_time(net, "native", 8, 4 * 65536) == pytest.approx(
        lr + ur + ub + lb + 3 * steady)


def test_han_eight_hosts_small_and_large_bcast():
    """8 hosts x 2: libnbc bcast is binomial below 64 KiB and an 8 KiB chain from 64 KiB."""
    net = han_net(g=2, slots=2)
    small = cm.allreduce_terms(net, "native", 16, 4096)
    assert small["han_leaders_bcast"] == pytest.approx(3 * (20e-6 + 4096 / 1e8))
    # reduce-scatter + gather: 2 lg 8 = 6 rounds, 2 * 7/8 of the bytes into leader 0
    assert small["han_leaders_reduce"] == pytest.approx(6 * 20e-6 + 1.75 * 4096 / 1e8
                                                        + 7 / 8 * 4096 * 1e-10)
    assert small["han_in_host_reduce"] == pytest.approx(10e-6 + 4096 / 1e9 + 4096 * 1e-10)
    assert small["han_pipeline"] == 0
    large = cm.allreduce_terms(net, "native", 16, 65536)
    assert large["han_leaders_bcast"] == pytest.approx(7 * 20e-6 + (65536 + 6 * 8192) / 1e8)


def test_han_pipeline_paced_by_the_leaders_link():
    """Many segments: T grows by max(lr, up) + lb per 64 KiB, up = b(H) m / B + rounds * a."""
    for g, p, bytes_per_segment, rounds in ((4, 8, 1.0, 1), (2, 8, 3.75, 4), (2, 16, 1.875, 7)):
        net = han_net(g=g, slots=g)
        h = p // g
        t = [cm.allreduce_time(net, "native", p, k * 65536) for k in (100, 101)]
        adds = 65536 * 1e-10 * (1 if h == 2 else (h - 1) / h)
        up = bytes_per_segment * 655.36e-6 + rounds * 20e-6 + adds
        assert t[1] - t[0] == pytest.approx(up + (g - 1) * 65.536e-6)


@pytest.mark.parametrize("seed", range(20))
def test_han_changes_nothing_on_one_host_or_one_rank_per_host(seed):
    rng = np.random.default_rng(seed)
    net = random_network(rng)
    han = net._replace(native_hierarchical=True)
    n = rng.uniform(1, 1e9, 10)
    p = int(rng.integers(2, net.gpus_per_host + 1)) if net.gpus_per_host > 1 else 1
    np.testing.assert_allclose(cm.allreduce_time(han, "native", p, n),
                               cm.allreduce_time(net, "native", p, n))
    one = net._replace(gpus_per_host=1)
    np.testing.assert_allclose(cm.allreduce_time(one._replace(native_hierarchical=True), "native",
                                                 8, n), cm.allreduce_time(one, "native", 8, n))
    for algorithm in ("ring", "torus2d", "hierarchical"):   # han is native's only
        np.testing.assert_allclose(cm.allreduce_time(han, algorithm, 4 * net.gpus_per_host, n),
                                   cm.allreduce_time(net, algorithm, 4 * net.gpus_per_host, n))


@pytest.mark.parametrize("seed", range(20))
def test_han_bounds(seed):
    """At least the bytes into leader 0 over its link; grows with n past the first segment."""
    rng = np.random.default_rng(seed)
    g = int(rng.choice([2, 3, 4, 8]))
    net = random_network(rng, g)._replace(native_hierarchical=True)
    h = int(rng.integers(2, 17))
    n = np.sort(rng.uniform(65536, 1e9, 20))
    t = cm.allreduce_time(net, "native", h * g, n)
    assert np.all(t >= 2 * (h - 1) / h * n / net.inter.bandwidth_Bps * (1 - 1e-12))
    assert np.all(np.diff(t) >= 0)


def test_call_waits_per_extra_rank_on_several_hosts_only():
    net = Network(Link(1e-6, 1e9), Link(1e-6, 1e9), 0.0, 4, 1, 0, {}, 25e-6,
                  oversubscribed_hosts_wait_s=2e-3)
    one_host = cm.allreduce_terms(net, "ring", 4, 4096)
    assert one_host["oversubscription_wait"] == pytest.approx(25e-6)
    assert one_host["oversubscription_hosts_wait"] == 0
    # 2 hosts x 4 ranks on 1 slot each: o = 4, 3 other ranks per core, per call not per step
    for algorithm in cm.ALGORITHMS:
        assert cm.allreduce_terms(net, algorithm, 8, 4096)[
            "oversubscription_hosts_wait"] == pytest.approx(3 * 2e-3)
    half = net._replace(slots_per_host=0.5)   # 2 ranks on half a core each: o = 8
    assert cm.allreduce_terms(half, "ring", 8, 4096)[
        "oversubscription_hosts_wait"] == pytest.approx(7 * 2e-3)
    roomy = net._replace(slots_per_host=4)    # no oversubscription, no wait
    assert "oversubscription_wait" not in cm.allreduce_terms(
        roomy._replace(oversubscribed_wait_s=0.0), "ring", 8, 4096)
    assert cm.allreduce_terms(roomy, "ring", 8, 4096)["oversubscription_hosts_wait"] == 0


def test_profiles_name_the_native_they_model():
    from nnabla_torus.planning.machine_profile import (load_profile, profile_from_dict,
                                                       profile_to_dict)
    abci, cpu = load_profile("abci"), load_profile("cpu-2core")
    assert not abci.network.native_hierarchical          # NCCL: one flat algorithm
    assert abci.network.oversubscribed_hosts_wait_s == 0
    assert cpu.network.native_hierarchical                # Open MPI 5: coll/han on 2+ hosts
    again = profile_from_dict(profile_to_dict(cpu)).network
    assert again.native_hierarchical and again.oversubscribed_hosts_wait_s == pytest.approx(
        cpu.network.oversubscribed_hosts_wait_s)
    raw = profile_to_dict(cpu)
    raw["native_hierarchical"] = "yes"
    with pytest.raises(ValueError, match="native_hierarchical"):
        profile_from_dict(raw)


# -- pipelined torus2d ------------------------------------------------------------------------
def pipelined_net(pipeline_bytes=8 << 20):
    return Network(Link(20e-6, 2e9), Link(50e-6, 0.125e9), 1e-10, 4, 4, 10000, {},
                   torus_pipeline_bytes=pipeline_bytes)


def test_pipelined_torus_overlaps_only_where_rows_stay_in_a_host():
    piped, flat = pipelined_net(), pipelined_net(0)
    n = 100 << 20
    # 2 hosts x 4, grid 4x2: rows in a host, columns across: faster, but not below the column.
    t_piped = float(cm.allreduce_time(piped, "torus2d", 8, n, 4))
    t_flat = float(cm.allreduce_time(flat, "torus2d", 8, n, 4))
    terms = cm.allreduce_terms(flat, "torus2d", 8, n, 4)
    column = float(terms["column_reduce_scatter"] + terms["column_all_gather"])
    assert column < t_piped < t_flat
    # One host, rows across hosts (8x1 = ring-like rows), 1xN: no pieces, the same time.
    for p, x in ((4, 2), (8, 8), (8, 1)):
        assert float(cm.allreduce_time(piped, "torus2d", p, n, x)) == pytest.approx(
            float(cm.allreduce_time(flat, "torus2d", p, n, x)))
    # A buffer no larger than one piece: K = 1, no overlap term.
    small = cm.allreduce_terms(piped, "torus2d", 8, 1 << 20, 4)
    assert float(small["pipeline_overlap"]) == 0.0
    assert float(sum(small.values())) == pytest.approx(
        float(cm.allreduce_time(flat, "torus2d", 8, 1 << 20, 4)))


def test_pipelined_torus_by_hand():
    """K = 4 pieces, column-bound: T = rows + column of one piece + 3 more columns."""
    net = Network(Link(0.0, 1e9), Link(0.0, 1e8), 0.0, 2, 2, 0, {}, torus_pipeline_bytes=1e6)
    # row: 1 step of 0.5 MB at 1 GB/s = 0.5 ms each way; column: 1 step of 0.25 MB with 2
    # flows per host at 0.1 GB/s = 5 ms each way.
    assert float(cm.allreduce_time(net, "torus2d", 4, 4e6, 2)) == pytest.approx(
        (0.5 + 5 + 5 + 0.5 + 3 * 10) * 1e-3)
