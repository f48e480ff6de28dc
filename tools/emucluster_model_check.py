"""Compare all-reduce times measured on the emulated cluster with the cost model's prediction.

Reads the JSON of ``tools/allreduce_bench.py`` run under ``python -m tools.emucluster`` and the
topology it ran on; builds the model's ``Network`` from a calibrated profile (intra-host link,
software and reduction costs, cores) with the inter-host level replaced by the emulated link::

    python tools/emucluster_model_check.py /tmp/bench.json --hosts 2 --ranks-per-host 4 \
        --rate 1gbit --inter-latency-us 120 --profile cpu-2core

Prints, per record: measured and predicted milliseconds, the error |pred - meas| / meas, and
for ring and torus2d the busiest host link's use of the rate (bytes it sends one way / time /
rate). With ``--map round-robin`` (rank r on host r % hosts) only ring and torus2d are
predicted: the model's hierarchical and native assume ranks placed host by host.
"""
import argparse
import json
import sys

import numpy as np

from nnabla_torus.planning import costmodel
from nnabla_torus.planning.costmodel import Link
from nnabla_torus.knobs import add_knob
from nnabla_torus.planning.machine_profile import load_profile

from emucluster.shaping import parse_rate

MAPPINGS = ("by-host", "round-robin")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="records written by tools/allreduce_bench.py --json")
    add_knob(p, "--hosts", "NNABLA_TORUS_CHECK_HOSTS", 2, "emulated hosts of the run", type=int)
    add_knob(p, "--ranks-per-host", "NNABLA_TORUS_CHECK_RANKS_PER_HOST", 4,
             "ranks on each emulated host", type=int)
    add_knob(p, "--map", "NNABLA_TORUS_CHECK_MAP", "by-host",
             "rank placement of the run: by-host or round-robin", choices=MAPPINGS)
    add_knob(p, "--rate", "NNABLA_TORUS_CHECK_RATE", "1gbit",
             "per-direction rate of each emulated host link, tc syntax")
    add_knob(p, "--inter-latency-us", "NNABLA_TORUS_CHECK_INTER_LATENCY_US", 50.0,
             "one-way latency of an inter-host hop in microseconds (measure it: ping-pong)",
             type=float)
    add_knob(p, "--profile", "NNABLA_TORUS_CHECK_PROFILE", "cpu-2core",
             "profile giving the intra-host link, software, reduction and core costs")
    add_knob(p, "--slots-per-host", "NNABLA_TORUS_CHECK_SLOTS_PER_HOST", 0.0,
             "cores of one emulated host (0: the profile's; all emulated hosts share the "
             "machine, so cores / hosts is the physical value)", type=float)
    return p


def emulated_network(profile, rate_bps, latency_s, ranks_per_host, slots_per_host=0.0):
    """The profile's Network with the emulated inter-host link and host size.

    >>> net = emulated_network(load_profile("cpu-2core"), 1e9, 1e-4, 4)
    >>> net.inter.bandwidth_Bps, net.gpus_per_host
    (125000000.0, 4)
    """
    net = profile.network._replace(inter=Link(latency_s, rate_bps / 8.0),
                                   gpus_per_host=ranks_per_host)
    return net._replace(slots_per_host=slots_per_host) if slots_per_host else net


def host_of_rank(hosts, ranks_per_host, mapping):
    """Host index of every rank: by-host r // ranks_per_host, round-robin r % hosts."""
    ranks = np.arange(hosts * ranks_per_host)
    return ranks // ranks_per_host if mapping == "by-host" else ranks % hosts


def torus_phases(p, x):
    """(name, rings (members in order), bytes per member, reduces) of a torus2d X x Y run."""
    grid = np.arange(p).reshape(p // x, x)
    return [("row_reduce_scatter", grid, 1.0, True),
            ("column_reduce_scatter", grid.T, 1.0 / x, True),
            ("column_all_gather", grid.T, 1.0 / x, False),
            ("row_all_gather", grid, 1.0, False)]


def mapped_time(net, algorithm, p, nbytes, x, hosts_of):
    """Seconds of ring (x = p) or torus2d for any rank -> host map, phase by phase.

    Same terms as costmodel.allreduce_terms (costmodel.torus_terms; the ring is the torus on
    p x 1), with each phase's (crosses, flows) taken from costmodel.ring_links on the actual
    placement instead of the block mapping's closed form.
    """
    on_host = int(np.bincount(hosts_of).max())
    share = costmodel.rank_share(p, on_host, net.slots_per_host)
    net = net._replace(intra=Link(net.intra.latency_s,
                                  costmodel.intra_bandwidth(net, on_host, nbytes)))
    sw = costmodel.software_of(net, algorithm)
    x = p if algorithm == "ring" else x
    phases = torus_phases(p, x)
    row_links, col_links = (costmodel.ring_links(phase[1], hosts_of) for phase in phases[:2])
    terms = costmodel.torus_terms(net, x, p // x, nbytes, share, sw, row_links, col_links)
    total = sum(float(t) for t in terms.values())
    waits = costmodel.call_waits(net, p, on_host, len(set(hosts_of.tolist())) > 1)
    return float(total + sum(waits.values()))


def host_link_bytes(p, x, nbytes, hosts_of):
    """Bytes the busiest host sends one way in a ring (x = p) or torus2d all-reduce."""
    sent = 0.0
    for _, rings, fraction, _ in torus_phases(p, x):
        crosses, flows = costmodel.ring_links(rings, hosts_of)
        k = rings.shape[1]
        sent += crosses * (k - 1) * nbytes * fraction / k * flows
    return sent


def predict(net, record, hosts_of, mapping):
    """Predicted seconds of one benchmark record, or None when the model has no placement."""
    p, n, algorithm = record["ranks"], record["bytes"], record["algorithm"]
    x = int(record["grid"].split("x")[0]) if algorithm == "torus2d" else p
    if mapping == "by-host":
        grid_x = x if algorithm == "torus2d" else None
        return float(costmodel.allreduce_time(net, algorithm, p, n, grid_x))
    if algorithm in ("ring", "torus2d"):
        return mapped_time(net, algorithm, p, n, x, hosts_of)
    return None


def check_rows(records, net, hosts_of, mapping, rate_bps):
    """One dict per record: algorithm, grid, bytes, measured/predicted ms, error, link use."""
    rows = []
    for rec in records:
        meas = rec["time_us"] * 1e-6
        pred = predict(net, rec, hosts_of, mapping)
        use = None
        if rec["algorithm"] in ("ring", "torus2d"):
            x = int(rec["grid"].split("x")[0]) if rec["algorithm"] == "torus2d" else rec["ranks"]
            use = host_link_bytes(rec["ranks"], x, rec["bytes"], hosts_of) / meas / (rate_bps / 8)
        rows.append(dict(algorithm=rec["algorithm"], grid=rec["grid"], bytes=rec["bytes"],
                         measured_ms=meas * 1e3,
                         predicted_ms=None if pred is None else pred * 1e3,
                         error=None if pred is None else abs(pred - meas) / meas,
                         busbw_MBps=rec["busbw_GBps"] * 1e3, link_use=use))
    return rows


def format_rows(rows):
    """The table as text lines."""
    lines = [f"{'algorithm':>12} {'grid':>5} {'bytes':>10} {'meas(ms)':>9} {'pred(ms)':>9} "
             f"{'error':>6} {'busbw(MB/s)':>11} {'link use':>8}"]
    for r in rows:
        pred = "-" if r["predicted_ms"] is None else f"{r['predicted_ms']:.1f}"
        err = "-" if r["error"] is None else f"{r['error']:.0%}"
        use = "-" if r["link_use"] is None else f"{r['link_use']:.0%}"
        lines.append(f"{r['algorithm']:>12} {r['grid']:>5} {r['bytes']:>10} "
                     f"{r['measured_ms']:>9.1f} {pred:>9} {err:>6} {r['busbw_MBps']:>11.1f} "
                     f"{use:>8}")
    return lines


def main(argv=None):
    args = build_parser().parse_args(argv)
    rate_bps = parse_rate(args.rate)
    if not rate_bps:
        raise SystemExit(f"--rate {args.rate!r}: the model needs a finite link rate (e.g. 1gbit)")
    with open(args.json) as f:
        records = [r for r in json.load(f) if r["algorithm"] != "auto"]  # auto: no model of its own
    p = args.hosts * args.ranks_per_host
    if any(r["ranks"] != p for r in records):
        raise SystemExit(f"{args.json} has records with ranks != hosts x ranks-per-host = {p}; "
                         f"pass the topology the benchmark ran on")
    net = emulated_network(load_profile(args.profile), rate_bps, args.inter_latency_us * 1e-6,
                           args.ranks_per_host, args.slots_per_host)
    hosts_of = host_of_rank(args.hosts, args.ranks_per_host, args.map)
    rows = check_rows(records, net, hosts_of, args.map, rate_bps)
    print(f"# {args.hosts} hosts x {args.ranks_per_host} ranks, {args.map}, {args.rate} links, "
          f"inter latency {args.inter_latency_us:g} us, profile {args.profile}, "
          f"slots/host {net.slots_per_host:g}")
    print("\n".join(format_rows(rows)))
    errors = [r["error"] for r in rows if r["error"] is not None]
    if errors:
        print(f"# median error {np.median(errors):.0%}, within 25 %: "
              f"{sum(e <= 0.25 for e in errors)}/{len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
