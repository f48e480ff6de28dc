"""Cluster profiles: hosts, links and per-model compute coefficients for the cost model.

A profile is a YAML (or JSON) file; shipped ones live in ``nnabla_torus/planning/profiles/`` and
are named without their extension (``abci``, ``cpu-2core``). Every key, with its unit, is in
docs/costmodel.md#cluster-profiles; unknown keys are rejected by name. Example::

    >>> prof = load_profile("abci")
    >>> prof.network.gpus_per_host, sorted(prof.models)
    (4, ['resnet50'])
"""
import json
import subprocess
from collections import namedtuple

from ..knobs import add_knob, number
from .profile_files import (GPU_PROFILES, PROFILE_DIR, list_profiles,  # noqa: F401
                            read_profile_file, save_profile)
from .profile_schema import (RUN_KEYS, Profile, model_of, profile_from_dict,  # noqa: F401
                             profile_to_dict)

PROFILE_ENV = "NNABLA_TORUS_PROFILE"   # the --profile twin of every tool and of train.py
CPU_PROFILE = "cpu-2core"
GPU_FALLBACK = "abci"


def local_gpu_name():
    """The first GPU's name from ``nvidia-smi`` ('' when there is none or no driver)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and \
        out.stdout.strip() else ""


def default_profile(gpus, gpu_name=None):
    """The name :func:`profile_rule` picks.

    >>> default_profile(gpus=False)
    'cpu-2core'
    """
    return profile_rule(gpus, gpu_name)[0]


def profile_rule(gpus, gpu_name=None):
    """The one default-profile rule of nnabla-torus-plan, nnabla-torus-run and train.py, when
    neither --profile nor NNABLA_TORUS_PROFILE names one: (profile name, why).

    1. a CPU job: ``cpu-2core`` (calibrated on a 2-core machine);
    2. a GPU job on a GPU of :data:`GPU_PROFILES` (``gpu_name``, else nvidia-smi's first GPU):
       that GPU's profile (V100: ``abci``, A100: ``dgx-a100``, H100/H200: ``dgx-h100``);
    3. any other GPU job (no GPU seen here, e.g. planning from a laptop, or another model):
       ``abci``, the paper's V100 cluster; the reason says how to describe yours.

    nnabla-torus-plan plans GPU jobs; nnabla-torus-run's job is a GPU job when this host has
    a GPU; train.py's when its context is not cpu.

    >>> profile_rule(gpus=False)[0], profile_rule(True, "NVIDIA A100-SXM4-80GB")[0]
    ('cpu-2core', 'dgx-a100')
    """
    describe = ("describe your cluster with --profile FILE (tools/calibrate.py writes one), or "
                "reshape a shipped profile with --hosts N --gpus-per-host G "
                "[--inter-bandwidth GBps] [--gpu-model " + "|".join(GPU_PROFILES) + "]")
    if not gpus:
        return CPU_PROFILE, "the default for CPU jobs"
    name = local_gpu_name() if gpu_name is None else gpu_name
    for model, profile in GPU_PROFILES.items():
        if model in name.lower() or (model == "h100" and "h200" in name.lower()):
            return profile, (f"the default for a GPU job on {name} ({model.upper()} class); "
                            f"{describe}")
    seen = f"an unknown GPU ({name})" if name else "no GPU seen on this host"
    return GPU_FALLBACK, (f"the default for GPU jobs ({seen}: ABCI's V100 nodes as in the "
                          f"paper); {describe}")


def add_profile_knob(parser, help):
    """Add ``--profile`` (env NNABLA_TORUS_PROFILE; default: :func:`profile_rule`,
    resolved by :func:`resolve_profile`)."""
    return add_knob(parser, "--profile", PROFILE_ENV, None,
                    help + "; None: cpu-2core for CPU jobs, the profile of this host's GPU "
                    "for GPU jobs (V100: abci, A100: dgx-a100, H100/H200: dgx-h100), else abci")


def resolve_profile(given, gpus, gpu_name=None):
    """(profile name or path, why): ``given`` (--profile or NNABLA_TORUS_PROFILE) or the rule."""
    if given:
        return given, "named by --profile / NNABLA_TORUS_PROFILE"
    return profile_rule(gpus, gpu_name)


def load_profile(name_or_path, shape=None):
    """Load a shipped profile by name (``abci``) or any profile file by path, reshaped by
    ``shape`` (a :data:`Shape`, e.g. from the --hosts/--gpus-per-host flags; None: as written).
    What the reshape changed is in ``extra["shape"]`` (lines for the plan)."""
    path, raw = read_profile_file(name_or_path)
    notes = []
    if shape is not None and any(v is not None for v in shape):
        raw, notes = reshape(raw, shape)
    try:
        prof = profile_from_dict(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    prof.extra["shape"] = notes
    return prof


# A profile reshaped without editing its file: None keeps the profile's value.
Shape = namedtuple("Shape", [
    "hosts",            # hosts of the cluster
    "gpus_per_host",    # GPUs (ranks) per host
    "inter_GBps",       # inter-host bandwidth of one host, GB/s (all its NICs together)
    "gpu_model",        # a key of GPU_PROFILES: per-GPU compute from that GPU's profile
], defaults=[None, None, None, None])
SHAPE_ENVS = {"hosts": "NNABLA_TORUS_HOSTS", "gpus_per_host": "NNABLA_TORUS_GPUS_PER_HOST",
              "inter_GBps": "NNABLA_TORUS_INTER_BANDWIDTH", "gpu_model": "NNABLA_TORUS_GPU_MODEL"}


def add_shape_knobs(parser):
    """Add --hosts, --gpus-per-host, --inter-bandwidth and --gpu-model (env twins in
    :data:`SHAPE_ENVS`, shared by every tool; default None: the profile's value). Their
    values land in ``args.shape_<field>``; :func:`shape_of` collects them."""
    add_knob(parser, "--hosts", SHAPE_ENVS["hosts"], None,
             "hosts of the cluster planned for (None: the profile's)", type=number(int, low=1),
             dest="shape_hosts")
    add_knob(parser, "--gpus-per-host", SHAPE_ENVS["gpus_per_host"], None,
             "GPUs per host (None: the profile's)", type=number(int, low=1),
             dest="shape_gpus_per_host")
    add_knob(parser, "--inter-bandwidth", SHAPE_ENVS["inter_GBps"], None,
             "inter-host bandwidth per host in GB/s, all its NICs together (8 x 400 Gb/s "
             "NDR: 400; None: the profile's)", type=number(float, low=0, strict=True),
             dest="shape_inter_GBps")
    add_knob(parser, "--gpu-model", SHAPE_ENVS["gpu_model"], None,
             "per-GPU compute of this GPU model's shipped profile (" +
             ", ".join(f"{k}: {v}" for k, v in GPU_PROFILES.items()) + "; None: the profile's)",
             choices=tuple(GPU_PROFILES), dest="shape_gpu_model")


def shape_of(args):
    """The :data:`Shape` of parsed ``args`` (from :func:`add_shape_knobs`)."""
    return Shape(*(getattr(args, "shape_" + f) for f in Shape._fields))


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
