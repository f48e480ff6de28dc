"""Reshape a profile without editing its file: --hosts, --gpus-per-host, --inter-bandwidth
and --gpu-model (:data:`Shape`), the knobs that set them and the reshaped file with a note per
change."""
import json
from collections import namedtuple

from ..knobs import BadValue, add_knob, number
from .profile_files import GPU_PROFILES, read_profile_file


# A profile reshaped without editing its file: None keeps the profile's value.
Shape = namedtuple("Shape", [
    "hosts",            # hosts of the cluster
    "gpus_per_host",    # GPUs (ranks) per host
    "inter_GBps",       # inter-host bandwidth of one host, GB/s (all its NICs together)
    "gpu_model",        # a key of GPU_PROFILES: per-GPU compute from that GPU's profile
], defaults=[None, None, None, None])
SHAPE_ENVS = {"hosts": "NNABLA_TORUS_HOSTS", "gpus_per_host": "NNABLA_TORUS_GPUS_PER_HOST",
              "inter_GBps": "NNABLA_TORUS_INTER_BANDWIDTH", "gpu_model": "NNABLA_TORUS_GPU_MODEL"}
# Bounds of the shape knobs in every tool (flag and environment twin alike; 0 or unset: the
# profile's value). 16,384 hosts (131,072 GPUs at 8 per host) plan in ~8 s; 100,000 took 59 s
# and 300 MB here (abci, resnet50), and the plan's work grows with the host count.
MAX_HOSTS = 16384
MAX_GPUS_PER_HOST = 64
MAX_INTER_GBPS = 10000.0
MIN_INTER_GBPS = 0.01   # 80 Mb/s; below it a plan's times ran to hundreds of digits (issue 65)


def inter_bandwidth(text):
    """--inter-bandwidth's value: 0 (the profile's) or MIN_INTER_GBPS..MAX_INTER_GBPS GB/s;
    else BadValue naming that range."""
    value = number(float, low=0, high=MAX_INTER_GBPS)(text)
    if 0 < value < MIN_INTER_GBPS:
        raise BadValue(f"must be 0 (the profile's) or a number from {MIN_INTER_GBPS:g} to "
                       f"{MAX_INTER_GBPS:g} GB/s, got {text!r}")
    return value


def add_shape_knobs(parser):
    """Add --hosts, --gpus-per-host, --inter-bandwidth and --gpu-model (env twins in
    :data:`SHAPE_ENVS`, shared by every tool; default None, and 0 as in train.py: the
    profile's value). Their values land in ``args.shape_<field>``; :func:`shape_of` collects
    them."""
    add_knob(parser, "--hosts", SHAPE_ENVS["hosts"], None,
             "hosts of the cluster planned for (None or 0: the profile's)",
             type=number(int, low=0, high=MAX_HOSTS), dest="shape_hosts")
    add_knob(parser, "--gpus-per-host", SHAPE_ENVS["gpus_per_host"], None,
             "GPUs per host (None or 0: the profile's)",
             type=number(int, low=0, high=MAX_GPUS_PER_HOST), dest="shape_gpus_per_host")
    add_knob(parser, "--inter-bandwidth", SHAPE_ENVS["inter_GBps"], None,
             "inter-host bandwidth per host in GB/s, all its NICs together (8 x 400 Gb/s "
             "NDR: 400; None or 0: the profile's)",
             type=inter_bandwidth, dest="shape_inter_GBps")
    add_knob(parser, "--gpu-model", SHAPE_ENVS["gpu_model"], None,
             "per-GPU compute of this GPU model's shipped profile (" +
             ", ".join(f"{k}: {v}" for k, v in GPU_PROFILES.items()) + "; None: the profile's)",
             choices=tuple(GPU_PROFILES), dest="shape_gpu_model")


def shape_of(args):
    """The :data:`Shape` of parsed ``args`` (from :func:`add_shape_knobs`); 0 is None."""
    return Shape(*(getattr(args, "shape_" + f) or None for f in Shape._fields))


def _fitted_racks(racks, hosts):
    """(racks block or None, note) for ``hosts``: kept when its rack size divides them,
    dropped when they fit in one rack, else racks of the largest size that divides them (at
    least half the profile's), else dropped; the note says which and why."""
    per_rack = racks.get("hosts_per_rack")
    if not isinstance(per_rack, int) or per_rack < 1 or hosts % per_rack == 0:
        return racks, ""
    if hosts < per_rack:
        return None, (f"racks: dropped: {hosts} hosts fit in one rack of {per_rack} (full "
                      f"bisection inside a rack: links.inter between every pair of hosts)")
    size = max(d for d in range(1, per_rack + 1) if hosts % d == 0)
    if 2 * size >= per_rack:
        return dict(racks, hosts_per_rack=size), (
            f"racks: {hosts // size} racks of {size} hosts ({per_rack} per rack in the "
            f"profile does not divide {hosts}; spine and oversubscription as written)")
    return None, (f"racks: dropped: no rack size from {(per_rack + 1) // 2} to {per_rack} "
                  f"divides {hosts} hosts, so the rack level is left out (links.inter "
                  f"everywhere: optimistic beyond one rack)")


def reshape(raw, shape):
    """(raw profile, notes): the parsed file ``raw`` with ``shape``'s values put in, one note
    per change. Slots follow the GPU count where the profile has one rank per GPU; the spine
    follows the inter-host bandwidth where the profile's spine equals it."""
    raw = json.loads(json.dumps(raw))            # a deep copy of plain data
    notes = []
    old_gpus = raw.get("gpus_per_host")
    if shape.gpus_per_host is not None:
        raw["gpus_per_host"] = shape.gpus_per_host
        if raw.get("slots_per_host") == old_gpus:
            raw["slots_per_host"] = shape.gpus_per_host
        notes.append(f"gpus_per_host: {shape.gpus_per_host} (--gpus-per-host; profile: "
                     f"{old_gpus})")
    if shape.hosts is not None:
        notes.append(f"hosts: {shape.hosts} (--hosts; profile: {raw.get('hosts')})")
        raw["hosts"] = shape.hosts
    if shape.hosts is not None and isinstance(raw.get("racks"), dict):
        raw["racks"], note = _fitted_racks(raw["racks"], shape.hosts)
        if raw["racks"] is None:
            del raw["racks"]
        notes += [note] if note else []
    inter = (raw.get("links") or {}).get("inter")
    if shape.inter_GBps is not None and isinstance(inter, dict):
        old = inter.get("bandwidth_GBps")
        inter["bandwidth_GBps"] = float(shape.inter_GBps)
        spine = (raw.get("racks") or {}).get("spine")
        if isinstance(spine, dict) and spine.get("bandwidth_GBps") == old:
            spine["bandwidth_GBps"] = float(shape.inter_GBps)
        notes.append(f"links.inter.bandwidth_GBps: {shape.inter_GBps:g} (--inter-bandwidth; "
                     f"profile: {old})")
    if shape.gpu_model is not None:
        if shape.gpu_model not in GPU_PROFILES:
            raise ValueError(f"--gpu-model {shape.gpu_model!r}: choose one of "
                             f"{sorted(GPU_PROFILES)}")
        source = read_profile_file(GPU_PROFILES[shape.gpu_model])[1]
        raw["models"] = source["models"]
        raw["reduce_ns_per_byte"] = source["reduce_ns_per_byte"]
        notes.append(f"models and reduce_ns_per_byte: {shape.gpu_model.upper()}'s, from "
                     f"profile {source['name']} (--gpu-model)")
    return raw, notes
