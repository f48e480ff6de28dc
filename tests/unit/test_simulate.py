"""Timed simulation: max-min fair flows, agreement with the closed form where flows do not
contend, what contention and faults change, and bad input (never a hang)."""
import io
import time

import numpy as np
import pytest

from nnabla_torus.planning import costmodel
from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.sim.virtual import WallLimit
from nnabla_torus.planning.costmodel import Link, Network
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.sim.simulate import Faults, max_min_rates, simulate_allreduce
from tests.slowdown import scaled

@pytest.fixture(autouse=True)
def flow_engine(monkeypatch):
    """These tests are the flow engine's (tests/unit/test_simgrid.py has SimGrid's)."""
    monkeypatch.setenv("NNABLA_TORUS_SIM_ENGINE", "flow")


@pytest.mark.parametrize("seed", range(20))
def test_max_min_rates_are_feasible_and_bottlenecked(seed):
    rng = np.random.default_rng(seed)
    links_n, flows = int(rng.integers(2, 8)), int(rng.integers(1, 30))
    capacity = np.append(rng.uniform(1, 10, links_n), np.inf)
    links = np.full((flows, 3), links_n)
    for f in range(flows):
        chosen = rng.choice(links_n, int(rng.integers(1, min(3, links_n) + 1)), replace=False)
        links[f, :len(chosen)] = chosen
    caps = np.where(rng.random(flows) < 0.2, rng.uniform(0.1, 3, flows), np.inf)
    rate = max_min_rates(links, caps, capacity)
    load = np.bincount(links.ravel(), weights=np.repeat(rate, 3), minlength=links_n + 1)
    assert np.all(load[:-1] <= capacity[:-1] * (1 + 1e-9))
    for f in range(flows):   # each flow is capped, or crosses a full link where it is largest
        on = [link for link in links[f] if link < links_n]
        full = [link for link in on if load[link] >= capacity[link] * (1 - 1e-9)
                and rate[f] >= rate[(links == link).any(axis=1)].max() * (1 - 1e-9)]
        assert rate[f] >= caps[f] * (1 - 1e-9) or full, (f, rate, links)


def net_of(rng, g):
    return Network(Link(rng.uniform(1e-6, 1e-4), rng.uniform(1e9, 1e11)),
                   Link(rng.uniform(1e-6, 1e-4), rng.uniform(1e8, 1e10)),
                   rng.uniform(0, 1e-10), g, g, 0, {})


@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_closed_form_on_symmetric_platforms(seed):
    """Rings whose members all see the same links: the fluid model is the closed form."""
    rng = np.random.default_rng(seed)
    g = int(rng.choice([1, 2, 4]))
    hosts = int(rng.integers(2, 5))
    p, n = g * hosts, float(rng.uniform(1e4, 1e8))
    net = net_of(rng, g)
    cases = [("ring", None, None), ("hierarchical", None, None)]
    if g > 1:
        cases.append(("torus2d", f"{g}x{hosts}", g))
    for algorithm, grid, x in cases:
        sim = simulate_allreduce(net, algorithm, p, n, grid=grid).seconds
        model = float(costmodel.allreduce_time(net, algorithm, p, n, x))
        assert sim == pytest.approx(model, rel=0.05), (algorithm, grid, p, g)


def test_shared_nic_halves_each_flow():
    # 2 hosts x 2: torus 2x2 columns send 2 flows out of each host at once
    net = Network(Link(0.0, 1e12), Link(0.0, 1e9), 0.0, 2, 2, 0, {})
    r = simulate_allreduce(net, "torus2d", 4, 4e6, grid="2x2")
    # rows: 2 x 2 MB / 1e12; columns: 2 phases of 1 MB, 2 flows -> 2 ms each
    assert r.seconds == pytest.approx(4e-3 + 4e6 / 1e12, rel=1e-6)
    assert r.busiest.startswith("nic_") and r.utilisation == pytest.approx(1.0, rel=2e-3)


def test_straggler_and_slow_link_slow_the_right_algorithms():
    net = Network(Link(5e-6, 5e10), Link(6e-6, 2.5e10), 3.3e-12, 4, 4, 0, {})
    n = 51114064
    base = {a: simulate_allreduce(net, a, 32, n, grid="4x8" if a == "torus2d" else None).seconds
            for a in ("ring", "torus2d")}
    for a, t in base.items():
        grid = "4x8" if a == "torus2d" else None
        # rank 11 sends across hosts, where the ring and the torus columns are slowest
        slow = simulate_allreduce(net, a, 32, n, grid=grid, faults=Faults(straggler=11)).seconds
        assert t < slow <= t * 1.1 * (1 + 1e-9)
        half = simulate_allreduce(net, a, 32, n, grid=grid, faults=Faults(slow_host=3)).seconds
        assert half > t * 1.2    # host 3's NIC carries every inter-host byte of its ranks


def test_oversubscribed_spine_slows_columns_that_cross_racks():
    prof = load_profile("abci")
    net = prof.network._replace(hosts_per_rack=2)
    full = net._replace(oversubscription=1.0)
    kw = dict(grid="16x4")   # columns of 4 cross 2 racks of 8 ranks
    t3 = simulate_allreduce(net, "torus2d", 64, 51114064, **kw)
    t1 = simulate_allreduce(full, "torus2d", 64, 51114064, **kw)
    assert t3.seconds > t1.seconds and t3.busiest.startswith(("up", "down"))


def test_grid_or_ranks_that_do_not_fit_are_refused():
    net = load_profile("abci").network
    with pytest.raises(ValueError, match="grid 64x34 has 2176 ranks, the simulated world 1088"):
        simulate_allreduce(net, "torus2d", 1088, 1e6, grid="64x34")
    with pytest.raises(ValueError, match="do not fit the simulated world: the profile has 2 "
                                         "hosts x 4 GPUs = 8"):
        simulate_allreduce(net, "ring", 16, 1e6, hosts=2)
    with pytest.raises(ValueError, match="cannot simulate algorithm 'native'"):
        simulate_allreduce(net, "native", 8, 1e6)
    with pytest.raises(ValueError, match="straggler rank 99 outside 0..7"):
        simulate_allreduce(net, "ring", 8, 1e6, faults=Faults(straggler=99))


def test_max_wall_stops_a_large_platform_quickly():
    net = load_profile("abci").network
    start = time.monotonic()
    with pytest.raises(WallLimit, match="exceeded --max-wall 0.2 s.*raise --max-wall"):
        simulate_allreduce(net, "ring", 1088, 51114064, max_wall=0.2)
    assert time.monotonic() - start < scaled(10)


def test_plan_cli_simulate_reranks_and_shows_both_times():
    out = io.StringIO()
    # our algorithms only: the planner now prefers native within the model's error (issue 48),
    # and the simulation skips native plans
    args = plan_cli.build_parser().parse_args(
        ["--profile", "abci", "--gpus", "8,16,32", "--local-batch", "32", "--simulate", "2",
         "--algorithms", "ring,torus2d,hierarchical"])
    plan_cli.run(args, out)
    text = out.getvalue()
    assert "re-ranked by simulated step time" in text
    rows = text.split("sim_step_s  model_step_s\n")[1].strip().splitlines()
    assert len(rows) == 2
    steps = [float(r.split()[5]) for r in rows]
    assert steps == sorted(steps)


def test_plan_cli_max_wall_is_a_clear_error():
    with pytest.raises(SystemExit, match="exceeded --max-wall"):
        plan_cli.main(["--profile", "abci", "--gpus", "1024", "--local-batch", "32",
                       "--simulate", "1", "--max-wall", "0.1"])


def test_validation_table_agrees_with_the_closed_form():
    """tools/research/simulate.py validate: every emulated topology within 5 % of the closed
    form."""
    from tools.research import simulate as tool
    out = io.StringIO()
    tool.validate(None, out)
    rows = [r for r in out.getvalue().splitlines() if r.startswith("| ") and "hosts x" in r]
    assert len(rows) == sum(len(v) for v in tool.MEASURED_100MIB.values())
    for row in rows:
        closed = float(row.split("|")[7].strip().rstrip("%"))
        assert abs(closed) <= 5.0, row


def test_paper_cases_need_a_racks_level():
    from tools.research import simulate as tool
    with pytest.raises(SystemExit, match="profile cpu-2core has no racks level"):
        tool.main(["paper", "--profile", "cpu-2core", "--ranks", "8", "--grid", "4x2"])


def test_partial_hosts_are_refused():
    net = load_profile("abci").network
    with pytest.raises(ValueError, match="10 ranks do not fill hosts of 4 GPUs"):
        simulate_allreduce(net, "hierarchical", 10, 1e6)
