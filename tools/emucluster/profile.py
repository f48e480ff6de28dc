"""A cluster profile of the emulated cluster, for planning a training run that runs on it.

The calibrated profile of this machine (``cpu-2core``) with the inter-host link replaced by the
emulated one (``emucluster_model_check.emulated_network``) and the machine's cores and compute
divided among the emulated hosts, which all share them (*derived*: each of K hosts gets 1/K of
the machine, so its data movement has 1/K of the cores and its compute takes K times as long).
Train with it as ``train.py --profile FILE``, so the controller's goodput and the planner see
the shaped link. Example::

    prof = emulated_profile(load_profile("cpu-2core"), hosts=2, ranks_per_host=2,
                            rate="100mbit")
    save_profile(prof, "emu-2x2.yaml")
"""
from .shaping import parse_rate
from nnabla_torus.planning.machine_profile import RUN_KEYS
from emucluster_model_check import emulated_network

# one-way inter-host hop, fitted in docs/measurements/allreduce-emulated-cluster.md
INTER_LATENCY_S = 20e-6


def emulated_profile(base, hosts, ranks_per_host, rate, latency_s=INTER_LATENCY_S):
    """``base`` (a Profile) as ``hosts`` emulated hosts of ``ranks_per_host`` ranks linked at
    ``rate`` (tc syntax, e.g. "100mbit"; "none" keeps the base's inter-host link)."""
    net = base.network
    rate_bps = parse_rate(rate) or net.inter.bandwidth_Bps * 8
    latency_s = latency_s if parse_rate(rate) else net.inter.latency_s
    net = emulated_network(base, rate_bps, latency_s, ranks_per_host,
                           (net.slots_per_host or 1.0) / hosts)
    models = {name: comp._replace(a_s=comp.a_s * hosts, b_s=comp.b_s * hosts)
              for name, comp in base.models.items()}
    # No restart was measured across emulated hosts: the assumed default, not the base's.
    run = dict((base.extra or {}).get("run") or RUN_KEYS, restart_s=RUN_KEYS["restart_s"])
    return base._replace(
        name=f"emu-{hosts}x{ranks_per_host}-{rate}", hosts=hosts, network=net, models=models,
        extra=dict(base.extra or {}, run=run),
        description=f"{base.name} as {hosts} emulated hosts x {ranks_per_host} ranks, links "
                    f"{rate} (tools/emucluster/profile.py)")
