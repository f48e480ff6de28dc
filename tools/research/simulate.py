"""Simulated all-reduce times: validation against the emulated cluster, and the paper's scale.

Runs our own collective code on virtual ranks (nnabla_torus.sim.virtual) timed by
SimGrid (nnabla_torus.sim.simgrid: recorded, then replayed) or by the flow model of
nnabla_torus.sim.simulate (--sim-engine), and prints markdown tables::

    python tools/research/simulate.py validate            # emulated 2x4, 4x2, 8x2 hosts at 1 Gbit/s
    python tools/research/simulate.py paper --ranks 2176  # ABCI: spine, straggler, slow link cases
    python tools/research/simulate.py paper --ranks 1088 --grid 32x34 --sim-engine flow

``validate`` compares the 100 MiB medians of docs/measurements/allreduce-emulated-cluster.md
(measured with tools/allreduce_bench.py under tools/emucluster, 2 cores shared by all emulated
hosts) with the simulation and the closed-form cost model, both on the network
tools/emucluster_model_check.py builds for that run (cpu-2core's intra-host, software and
reduction costs, 1 Gbit/s inter-host links, 20 us latency, 2/H cores per host).
"""
import argparse
import sys
import time

import numpy as np

from nnabla_torus.comm.collectives import OURS, registry_entry
from nnabla_torus.planning import costmodel
from nnabla_torus.knobs import TIMEOUT_MAX_S, add_knob, number
from nnabla_torus.planning.machine_profile import add_profile_knob, load_profile, resolve_profile
from nnabla_torus.sim.simulate import ENGINES, Faults, resolve_engine, simulate_allreduce

import _tools  # noqa: F401  (tools/ on sys.path, for emucluster_model_check)
from emucluster_model_check import emulated_network

MiB = 1 << 20
RESNET50_FP16_BYTES = 25_557_032 * 2
# docs/measurements/allreduce-emulated-cluster.md: 100 MiB medians at 1 Gbit/s (hosts, ranks per
# host) -> [(algorithm, grid or None, measured seconds)]; native (coll/han) is not simulated.
MEASURED_100MIB = {
    (2, 4): [("ring", None, 1.75), ("torus2d", "4x2", 1.05), ("torus2d", "2x4", 1.50),
             ("hierarchical", None, 1.69)],
    (4, 2): [("ring", None, 1.77), ("torus2d", "2x4", 1.61), ("torus2d", "4x2", 2.25),
             ("hierarchical", None, 2.42)],
    (8, 2): [("ring", None, 2.32), ("torus2d", "2x8", 2.44), ("torus2d", "8x2", 2.59),
             ("hierarchical", None, 3.12)],
    # One rank per emulated host (2026-11-30, medians of 6 calls; docs/simulation.md,
    # "Validation"): the CPU binds less (2 hosts: one rank per core), so the network model
    # should fit best here.
    (2, 1): [("ring", None, 0.892), ("torus2d", "1x2", 0.894)],
    (4, 1): [("ring", None, 1.421), ("torus2d", "2x2", 1.803)],
}
CASES = ("base", "full-bisection", "straggler", "slow-link")


def closed_form(net, algorithm, ranks, nbytes, grid):
    x = int(grid.split("x")[0]) if grid else None
    return float(costmodel.allreduce_time(net, algorithm, ranks, nbytes, x))


def validate(args, out):
    prof = load_profile("cpu-2core")
    engine = resolve_engine(args.sim_engine if args else None)
    print(f"# engine: {engine}", file=out)
    print("| topology | algorithm (grid) | measured | simulated | closed form | sim vs meas "
          "| sim vs closed | busiest link |", file=out)
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", file=out)
    for (hosts, per_host), rows in MEASURED_100MIB.items():
        net = emulated_network(prof, 1e9, 20e-6, per_host, 2.0 / hosts)
        p = hosts * per_host
        for algorithm, grid, measured in rows:
            r = simulate_allreduce(net, algorithm, p, 100 * MiB, grid=grid, engine=engine)
            model = closed_form(net, algorithm, p, 100 * MiB, grid)
            print(f"| {hosts} hosts x {per_host} | {algorithm}{f' ({grid})' if grid else ''} "
                  f"| {measured:.2f} s | {r.seconds:.2f} s | {model:.2f} s "
                  f"| {r.seconds / measured - 1:+.0%} | {r.seconds / model - 1:+.1%} "
                  f"| {r.busiest} {r.utilisation:.0%} |", file=out)


def case_network(net, case, ranks):
    """(Network, Faults) of a paper-scale case. The faults sit 46 % into the job (host 250 of
    544 at 2,176 ranks); the straggler is that host's second GPU."""
    host = (ranks // net.gpus_per_host) * 250 // 544
    if case == "full-bisection":
        return net._replace(oversubscription=1.0), Faults()
    if case == "straggler":
        return net, Faults(straggler=host * net.gpus_per_host + 1)
    if case == "slow-link":
        return net, Faults(slow_host=host)
    return net, Faults()


def paper(args, out):
    prof = load_profile(resolve_profile(args.profile, gpus=True)[0])
    net = prof.network
    if not getattr(net, "hosts_per_rack", 0) and set(args.cases) & {"base", "full-bisection"}:
        raise SystemExit(f"profile {prof.name} has no racks level (racks: hosts_per_rack, "
                         f"spine, oversubscription): the spine cases need it")
    engine = resolve_engine(args.sim_engine)
    print(f"# {args.ranks} ranks of {prof.name}, {args.bytes} bytes (ResNet-50 FP16 "
          f"gradients by default); simulated ms, busiest link, closed-form ms; engine: {engine}",
          file=out)
    print("| case | algorithm (grid) | simulated | busiest link (use) | closed form "
          "| messages | wall s | replay s | CPU s |", file=out)
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", file=out)
    for case in args.cases:
        case_net, faults = case_network(net, case, args.ranks)
        for algorithm in args.algorithms:
            grid = args.grid if registry_entry(algorithm).takes_grid else None
            cpu = time.process_time()
            r = simulate_allreduce(case_net, algorithm, args.ranks, args.bytes, grid=grid,
                                   faults=faults, hosts=prof.hosts, max_wall=args.max_wall,
                                   engine=engine)
            cpu = time.process_time() - cpu
            model = closed_form(case_net, algorithm, args.ranks, args.bytes, grid)
            print(f"| {case} | {algorithm}{f' ({grid})' if grid else ''} "
                  f"| {r.seconds * 1e3:.2f} ms | {r.busiest} ({r.utilisation:.0%}) "
                  f"| {model * 1e3:.2f} ms | {r.messages} | {r.wall_s:.0f} | {r.replay_s:.0f} "
                  f"| {cpu:.0f} |", file=out,
                  flush=True)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="emulated-cluster topologies against the measured "
                                        "medians (docs/measurements/allreduce-emulated-cluster.md)")
    p = sub.add_parser("paper", help="ring, torus2d, hierarchical on a profile, with faults")
    for command in (v, p):
        add_knob(command, "--sim-engine", "NNABLA_TORUS_SIM_ENGINE", "auto",
                 "simulation engine: simgrid (SimGrid replay), flow (our flow model) or auto "
                 "(simgrid when libsimgrid-dev and g++ are here)", choices=ENGINES)
    add_profile_knob(p, help="cluster profile (with racks)")
    add_knob(p, "--ranks", "NNABLA_TORUS_SIM_RANKS", 2176, "ranks to simulate",
             type=number(int, low=2))
    add_knob(p, "--grid", "NNABLA_TORUS_SIM_GRID", "64x34", "torus2d grid XxY")
    add_knob(p, "--bytes", "NNABLA_TORUS_SIM_BYTES", RESNET50_FP16_BYTES,
             "all-reduce size in bytes", type=number(int, low=1))
    add_knob(p, "--cases", "NNABLA_TORUS_SIM_CASES", ",".join(CASES),
             f"comma-separated cases of {', '.join(CASES)}",
             type=lambda s: [c for c in s.split(",") if c in CASES] or
             argparse.ArgumentTypeError(f"cases from {CASES}"))
    add_knob(p, "--algorithms", "NNABLA_TORUS_SIM_ALGORITHMS", ",".join(OURS),
             "comma-separated algorithms", type=lambda s: s.split(","))
    add_knob(p, "--max-wall", "NNABLA_TORUS_SIM_MAX_WALL", None,
             "wall-clock seconds allowed per simulation (None: no limit)",
             type=number(float, low=0, strict=True, high=TIMEOUT_MAX_S))
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    start = time.monotonic()
    {"validate": validate, "paper": paper}[args.command](args, sys.stdout)
    print(f"# {time.monotonic() - start:.0f} s wall, numpy {np.__version__}", file=sys.stdout)


if __name__ == "__main__":
    main()
