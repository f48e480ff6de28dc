"""Timed simulation: our collectives' messages as flows on a platform built from a cluster profile.

The virtual backend (``sim/virtual.py``) runs the real schedule code of every rank; here
each message it matches becomes a *flow* on a simulated platform, and a rank's own work after a
wait (adding received bytes, per-step software cost) becomes simulated compute time.

Two engines time the platform: ``flow``, our own max-min fair flow model (here), and
``simgrid`` (sim/simgrid.py); ``auto`` picks simgrid when its replay program builds. The
platform's links and routes, the flow model, what compute is charged and what is not
modelled: docs/simulation.md ("The platform and the flow engine in detail").

Example (8 ranks, 2 hosts of 4, torus2d 4x2 on 1 MB)::

    >>> from nnabla_torus.planning.costmodel import Link, Network
    >>> net = Network(Link(1e-6, 1e10), Link(2e-6, 1e9), 0.0, 4, 4, 0, {})
    >>> r = simulate_allreduce(net, "torus2d", 8, 1e6, grid="4x2")
    >>> round(r.seconds * 1e3, 3), r.busiest   # columns: 4 flows of 125 KB share a NIC: 2 x 502 us
    (1.16, 'nic_out[0]')
"""
import math
import time
from collections import namedtuple

import numpy as np

from ..planning import costmodel

from . import simgrid
from .virtual import run_allreduce
from ..knobs import knob_value
from ..comm.collectives import OURS, REGISTRY
from ..comm.topology import parse_grid

Result = namedtuple("Result", [
    "seconds",       # simulated all-reduce time (s)
    "busiest",       # name of the busiest link (largest bytes / (capacity x time))
    "utilisation",   # that link's bytes / (capacity x seconds), 0..1
    "messages",      # messages exchanged
    "wall_s",        # wall-clock seconds the simulation took
    "engine",        # "simgrid" or "flow": the engine that timed it
    "replay_s",      # wall seconds of the SimGrid replay (in wall_s; the rest: recording)
], defaults=["flow", 0.0])
ENGINES = ("auto", "simgrid", "flow")

Faults = namedtuple("Faults", [
    "straggler",      # rank whose own costs (latency, adds, software) are x slowdown, -1: none
    "slowdown",       # factor of the straggler's costs and 1/factor of its flows' rates
    "slow_host",      # host whose NIC runs at slow_rate of its bandwidth, -1: none
    "slow_rate",      # fraction of bandwidth of the slow host's NIC
], defaults=[-1, 1.1, -1, 0.5])


class Platform:
    """Links, routes and compute costs of ``ranks`` ranks on ``net`` (see the module doc).

    ``nbytes``: the all-reduce's size (the intra-host bandwidth depends on it through the
    cost model's cache term); ``sw``: the algorithm's costmodel.Software.
    """

    def __init__(self, net, ranks, nbytes, sw=costmodel.NO_SOFTWARE, faults=Faults()):
        g = net.gpus_per_host
        self.net, self.ranks, self.g, self.faults = net, ranks, g, faults
        self.hosts = -(-ranks // g)
        self.per_rack = getattr(net, "hosts_per_rack", 0) or self.hosts
        self.racks = -(-self.hosts // self.per_rack)
        on_host = min(ranks, g)
        self.share = float(costmodel.rank_share(ranks, g, net.slots_per_host))
        intra = float(costmodel.intra_bandwidth(net, on_host, nbytes))
        bus = intra * (min(net.slots_per_host, on_host) if net.slots_per_host else on_host)
        names, caps = [], []

        def level(name, count, cap):
            start = len(caps)
            names.extend(f"{name}[{i}]" for i in range(count))
            caps.extend([cap] * count)
            return start
        self.port_out = level("port_out", ranks, intra)
        self.port_in = level("port_in", ranks, intra)
        self.bus = level("bus", self.hosts, bus)
        self.nic_out = level("nic_out", self.hosts, net.inter.bandwidth_Bps)
        self.nic_in = level("nic_in", self.hosts, net.inter.bandwidth_Bps)
        if self.racks > 1:
            uplink = self.per_rack * net.spine.bandwidth_Bps / net.oversubscription
            self.up = level("up", self.racks, uplink)
            self.down = level("down", self.racks, uplink)
        self.names = names
        self.capacity = np.array(caps + [np.inf])   # last: a link no flow is limited by
        if faults.slow_host >= 0:
            if faults.slow_host >= self.hosts:
                raise ValueError(f"slow host {faults.slow_host} outside 0..{self.hosts - 1}")
            for first in (self.nic_out, self.nic_in):
                self.capacity[first + faults.slow_host] *= faults.slow_rate
        if faults.straggler >= ranks:
            raise ValueError(f"straggler rank {faults.straggler} outside 0..{ranks - 1}")
        self.reduce_s = net.reduce_s_per_byte
        self.sw = sw

    def route(self, src, dst):
        """(link indices, latency s, rate cap B/s) of a message from rank ``src`` to ``dst``."""
        hs, hd = src // self.g, dst // self.g
        net = self.net
        if hs == hd:
            links = (self.port_out + src, self.bus + hs, self.port_in + dst)
            latency = net.intra.latency_s / self.share
        elif hs // self.per_rack == hd // self.per_rack:
            links, latency = (self.nic_out + hs, self.nic_in + hd), net.inter.latency_s
        else:
            rs, rd = hs // self.per_rack, hd // self.per_rack
            links = (self.nic_out + hs, self.up + rs, self.down + rd, self.nic_in + hd)
            latency = net.spine.latency_s
        cap = np.inf
        if self.faults.straggler in (src, dst):
            latency *= self.faults.slowdown
            cap = self.capacity[list(links)].min() / self.faults.slowdown
        return links, latency, cap

    def cost(self, rank, reduce_bytes, send_bytes, sends, scale=1.0):
        """Seconds ``rank`` computes after a wait: adds, and the software cost of a step
        (``scale``: simulated bytes per byte given)."""
        seconds = reduce_bytes * scale * self.reduce_s
        if sends:
            seconds += self.sw.step_s + send_bytes * scale * self.sw.s_per_byte
        seconds /= self.share
        return seconds * self.faults.slowdown if rank == self.faults.straggler else seconds


def max_min_rates(links, caps, capacity):
    """Max-min fair rates (B/s) of flows crossing ``links`` (int array flows x k, padded with
    the index of an infinite link), each also limited by its own ``caps`` (progressive filling).

    >>> max_min_rates(np.array([[0, 2], [0, 1], [1, 2]]), np.full(3, np.inf),
    ...               np.array([10.0, 4.0, np.inf])).tolist()
    [8.0, 2.0, 2.0]
    """
    rate = np.zeros(len(links))
    active = np.ones(len(links), bool)
    left = capacity.astype(float).copy()
    while active.any():
        count = np.bincount(links[active].ravel(), minlength=len(left))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, left / count, np.inf)
        level = min(share.min(), caps[active].min())
        saturated = share <= level * (1 + 1e-9)
        hit = active & (saturated[links].any(axis=1) | (caps <= level * (1 + 1e-9)))
        rate[hit] = level
        np.subtract.at(left, links[hit].ravel(), level)
        left[-1] = np.inf
        active &= ~hit
    return rate


class FlowNetwork:
    """The flows in flight on a Platform and their max-min fair rates; the virtual World's
    ``network``. ``scale``: simulated bytes per byte of the small real buffers.

    Rates change only when a flow starts or ends, so a flow's finish time is fixed between
    such changes and the flows are moved only then (not at every event of the World). A
    flow that starts on links no other flow uses, or ends leaving its links empty, changes
    no other rate; only otherwise are all rates recomputed (progressive filling).
    """

    def __init__(self, platform, scale=1.0):
        self.platform, self.scale = platform, float(scale)
        self.world = None      # set by attach
        self.t = 0.0           # time at which ``left`` was last brought up to date
        self.left = np.zeros(0)
        self.rate = np.zeros(0)
        self.finish = np.zeros(0)
        self.caps = np.zeros(0)
        self.links = np.zeros((0, 4), int)
        self.pending = []      # (links, latency, cap, bytes, done) started since last update
        self.active = []       # (latency, done) of the flows in self.left, same order
        self.users = np.zeros(len(platform.capacity), int)   # active flows per link
        self.carried = np.zeros(len(platform.capacity))      # bytes per link

    def attach(self, world):
        self.world = world

    def start(self, src, dst, nbytes, done):
        links, latency, cap = self.platform.route(src, dst)
        size = nbytes * self.scale
        if size <= 0:
            self.world.at(self.world.now + latency, done)
            return
        for link in links:
            self.carried[link] += size
        self.pending.append((links, latency, cap, size, done))

    def _move_to(self, t):
        self.left = self.left - self.rate * (t - self.t)
        self.t = t

    def _rates(self):
        self.rate = max_min_rates(self.links, self.caps, self.platform.capacity)

    def _add_pending(self):
        self._move_to(self.world.now)
        pad = len(self.platform.capacity) - 1
        rows = np.full((len(self.pending), 4), pad)
        for i, entry in enumerate(self.pending):
            rows[i, :len(entry[0])] = entry[0]
        caps = np.array([e[2] for e in self.pending])
        used = np.bincount(rows.ravel(), minlength=len(self.users))
        used[-1] = 0
        free = used.max() <= 1 and not self.users[used > 0].any()
        self.users += used
        rates = np.minimum(caps, self.platform.capacity[rows].min(axis=1))
        self.links = np.concatenate([self.links, rows])
        self.left = np.concatenate([self.left, [e[3] for e in self.pending]])
        self.caps = np.concatenate([self.caps, caps])
        self.active += [(e[1], e[4]) for e in self.pending]
        self.pending = []
        if free:   # alone on its links: nobody else's rate changes
            self.rate = np.concatenate([self.rate, rates])
        else:
            self._rates()
        self.finish = self.t + self.left / self.rate

    def next_time(self):
        """Simulated time of the next flow to finish its transfer (inf: none in flight)."""
        if self.pending:
            self._add_pending()
        return float(self.finish.min()) if len(self.finish) else math.inf

    def advance(self, t):
        """At time ``t``: schedule the delivery of the flows that finished by then."""
        if self.pending:
            self._add_pending()
        if not len(self.finish):
            return
        over = self.finish <= t + 1e-12 * max(t, 1e-9)
        if not over.any():
            return
        self._move_to(t)
        for i in np.flatnonzero(over):
            latency, done = self.active[i]
            self.world.at(t + latency, done)
        gone = self.links[over].ravel()
        np.subtract.at(self.users, gone, 1)
        self.users[-1] = 0
        keep = ~over
        self.active = [a for a, k in zip(self.active, keep) if k]
        self.left, self.links, self.caps = self.left[keep], self.links[keep], self.caps[keep]
        self.rate = self.rate[keep]
        if len(self.left) and self.users[gone[gone < len(self.users) - 1]].any():
            self._rates()   # the finished flows shared links with flows still running
        self.finish = self.t + self.left / self.rate

    def cost(self, rank, reduce_bytes, send_bytes, sends):
        return self.platform.cost(rank, reduce_bytes, send_bytes, sends, self.scale)


def check_fits(net, algorithm, ranks, grid, hosts=None):
    """Raise ValueError unless ``ranks`` (and ``grid``) fit the profile's simulated world."""
    if algorithm not in OURS:
        raise ValueError(f"cannot simulate algorithm {algorithm!r}: choose "
                         f"{', '.join(OURS[:-1])} or {OURS[-1]} (native is the library's own "
                         f"algorithm)")
    g = net.gpus_per_host
    if ranks < 2:
        raise ValueError(f"simulate at least 2 ranks, got {ranks}")
    if hosts is not None and ranks > hosts * g:
        raise ValueError(f"{ranks} ranks do not fit the simulated world: the profile has "
                         f"{hosts} hosts x {g} GPUs = {hosts * g}; use at most that many")
    if ranks % min(g, ranks):
        raise ValueError(f"{ranks} ranks do not fill hosts of {g} GPUs (ranks are placed host "
                         f"by host); use a multiple of {g}")
    if grid is not None and REGISTRY[algorithm].takes_grid:
        grid = parse_grid(grid) if isinstance(grid, str) else grid
        if grid.size != ranks:
            raise ValueError(f"grid {grid} has {grid.size} ranks, the simulated world "
                             f"{ranks}; use X*Y == {ranks}")


def resolve_engine(engine=None):
    """"simgrid" or "flow": ``engine`` (None: NNABLA_TORUS_SIM_ENGINE, default auto); auto is
    simgrid when its replay program builds here (nnabla_torus.sim.simgrid.available), else flow."""
    def choice(text):
        if text not in ENGINES:
            raise ValueError(f"simulation engine {text!r} is not one of {', '.join(ENGINES)}")
        return text
    engine = knob_value(engine, "engine", "NNABLA_TORUS_SIM_ENGINE", "auto", choice)
    if engine == "auto":
        return "simgrid" if simgrid.available() else "flow"
    return engine


def simulate_allreduce(net, algorithm, ranks, nbytes, grid=None, faults=Faults(), hosts=None,
                       max_wall=None, engine=None):
    """Simulate one all-reduce of ``nbytes`` over ``ranks`` ranks of ``net``; returns Result.

    Runs the real schedule of ``algorithm`` (ring | torus2d | hierarchical; ``grid`` "XxY"
    for torus2d, default: the communicator's) with float32 buffers of ranks x pieces
    elements, each byte standing for nbytes / (that buffer's bytes) simulated bytes.
    ``hosts``: the profile's host count (checked); ``max_wall``: wall seconds before
    virtual.WallLimit; ``engine``: flow (FlowNetwork, timed as it runs), simgrid (recorded,
    then replayed by nnabla_torus.sim.simgrid) or auto (see resolve_engine).
    """
    check_fits(net, algorithm, ranks, grid, hosts)
    engine = resolve_engine(engine)
    g = min(net.gpus_per_host, ranks)
    pipe = net.torus_pipeline_bytes
    pieces = max(1, math.ceil(nbytes / pipe)) if pipe and REGISTRY[algorithm].pipelined else 1
    count = ranks * pieces
    real_bytes = 4 * count
    sw = costmodel.software_of(net, algorithm)
    platform = Platform(net, ranks, nbytes, sw, faults)
    bufs = [np.ones(count, np.float32) for _ in range(ranks)]
    scale, pipeline_bytes = nbytes / real_bytes, real_bytes // pieces if pieces > 1 else 1 << 62
    start = time.monotonic()
    replay_s = 0.0
    if engine == "simgrid":
        seconds, carried, messages, _, replay_s = simgrid.simulate(
            platform, bufs, algorithm, grid, g, scale, pipeline_bytes, max_wall)
    else:
        network = FlowNetwork(platform, scale)
        seconds, world = run_allreduce(bufs, algorithm, grid, g, network, max_wall=max_wall,
                                       pipeline_bytes=pipeline_bytes)
        carried, messages = network.carried, world.messages
    if not all(b[0] == ranks and b[-1] == ranks for b in bufs):
        raise RuntimeError(f"simulated {algorithm} on {ranks} ranks did not sum correctly")
    waits = costmodel.call_waits(net, ranks, g, ranks > net.gpus_per_host)
    seconds += float(sum(waits.values())) if waits else 0.0
    use = carried[:-1] / (platform.capacity[:-1] * seconds)
    top = int(np.argmax(use))
    return Result(seconds, platform.names[top], float(use[top]), messages,
                  time.monotonic() - start, engine, replay_s)


def rerank(prof, model, plans, max_wall=None, engine=None):
    """Simulate each planner Plan's all-reduce (``engine``: see simulate_allreduce); returns
    [(plan, simulated all-reduce s, simulated step s)] fastest simulated step first
    (``native`` plans are skipped: the simulation runs our algorithms only).

    The step time is the cost model's (costmodel.step_terms: compute, overlap exponent,
    accumulation) with the closed-form all-reduce replaced by the simulated one.
    """
    comp = prof.models[model]
    rows = []
    for plan in plans:
        if plan.algorithm not in OURS or plan.gpus < 2:
            continue
        grid = plan.grid if REGISTRY[plan.algorithm].takes_grid else None
        sim = simulate_allreduce(prof.network, plan.algorithm, plan.gpus, comp.grad_bytes,
                                 grid=grid, hosts=prof.hosts, max_wall=max_wall,
                                 engine=engine).seconds
        t_c = float(costmodel.compute_time(comp, plan.gpus, plan.local_batch,
                                           prof.network.gpus_per_host))
        step = ((plan.accum_steps - 1) * t_c + float(costmodel.overlap(t_c, sim, comp.gamma))
                + costmodel.finite_check_s(comp))      # what nnabla adds to every algorithm
        rows.append((plan, sim, step))
    return sorted(rows, key=lambda row: row[2])
