"""Cluster profiles: hosts, links and per-model compute coefficients for the cost model.

A profile is a YAML (or JSON) file; shipped ones live in ``nnabla_torus/planning/profiles/`` and
are named without their extension (``abci``, ``cpu-2core``). Every key, with its unit, is in
docs/costmodel.md#cluster-profiles; unknown keys are rejected by name. Example::

    >>> prof = load_profile("abci")
    >>> prof.network.gpus_per_host, sorted(prof.models)
    (4, ['resnet50'])
"""
import json
import math
import os
import subprocess
from collections import namedtuple

import yaml

from .costmodel import ALGORITHMS, Compute, Link, Network, Software
from ..knobs import add_knob, number

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
PROFILE_ENV = "NNABLA_TORUS_PROFILE"   # the --profile twin of every tool and of train.py


# GPU model (a substring of the name nvidia-smi prints) -> the shipped profile whose per-GPU
# compute and device memory speed describe it; also the choices of --gpu-model.
GPU_PROFILES = {"v100": "abci", "a100": "dgx-a100", "h100": "dgx-h100"}
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


Profile = namedtuple("Profile", ["name", "description", "hosts", "network", "models", "extra"])

_TOP_KEYS = {"name", "description", "hosts", "gpus_per_host", "slots_per_host", "links",
             "reduce_ns_per_byte", "native_switch_bytes", "software", "models", "oversubscribed_wait_us",
             "cache_MiB", "cache_bandwidth_GBps", "native_hierarchical",
             "oversubscribed_hosts_wait_us", "torus_pipeline_MiB", "calibration", "racks", "run",
             "auto_tables"}
_LINK_KEYS = {"latency_us", "bandwidth_GBps"}
_SOFTWARE_KEYS = {"step_us", "ns_per_byte"}
_MODEL_KEYS = {"a_ms", "b_ms", "gamma", "max_local_batch", "grad_bytes", "slots_per_host",
               "gflops_per_image",   # optional: training GFLOPs per image (model_cost)
               "grad_arrays"}        # optional: gradient arrays per backward (overlap_choice)
_RACK_KEYS = {"hosts_per_rack", "spine", "oversubscription"}
_AUTO_KEYS = {"ranks", "ranks_per_host", "bounds", "algorithms"}
# The run: block's keys and defaults. restart_s: seconds one checkpoint-restart costs (the
# elastic launcher's price of a GPU-count change); *assumed* 30 s where a profile has no
# measurement (mpirun start and NCCL set-up of ~2,000 ranks, a 200 MB checkpoint on a shared
# file system; no published figure): measure yours with tools/restart_cost.py.
RUN_KEYS = {"startup_s": 0.0, "validation_s": 0.0, "validations": 1, "loader_stall_ms": 0.0,
            "restart_s": 30.0}


def list_profiles():
    """Names of the shipped profiles."""
    return sorted(os.path.splitext(f)[0] for f in os.listdir(PROFILE_DIR)
                  if f.endswith((".yaml", ".yml", ".json")))


def _check_keys(where, got, allowed, required=()):
    if not isinstance(got, dict):
        raise ValueError(f"profile {where}: expected a mapping of keys to values, got {got!r}")
    unknown = set(got) - set(allowed)
    if unknown:
        raise ValueError(f"profile {where}: unknown key(s) {sorted(unknown)}; "
                         f"allowed: {sorted(allowed)}")
    missing = set(required) - set(got)
    if missing:
        raise ValueError(f"profile {where}: missing key(s) {sorted(missing)}")


def _number(where, raw, key, low=0, strict=False, kind=float, default=None):
    """``raw[key]`` (``default`` when absent and not None) as ``kind``: a finite number >= low
    (> low when ``strict``); ValueError naming the key, the value and the allowed range."""
    value = raw.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict else value >= low) and (kind is float or value == int(value))
    if not ok:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"profile {where}.{key}: {value!r} must be {what} "
                         f"{'>' if strict else '>='} {low:g}")
    return kind(value)


def _link(where, raw):
    _check_keys(where, raw, _LINK_KEYS, _LINK_KEYS)
    return Link(_number(where, raw, "latency_us") * 1e-6,
                _number(where, raw, "bandwidth_GBps", strict=True) * 1e9)


def _flag(where, value):
    if not isinstance(value, bool):
        raise ValueError(f"profile {where}: {value!r} must be true or false")
    return value


def _compute(name, raw):
    _check_keys(f"models.{name}", raw, _MODEL_KEYS,
                _MODEL_KEYS - {"slots_per_host", "gflops_per_image", "grad_arrays"})
    where = f"models.{name}"
    return Compute(_number(where, raw, "a_ms") * 1e-3,
                   _number(where, raw, "b_ms", strict=True) * 1e-3,
                   _number(where, raw, "gamma", low=1),   # 1: no overlap of compute, all-reduce
                   _number(where, raw, "max_local_batch", 1, kind=int),
                   _number(where, raw, "grad_bytes", 1, kind=int),
                   _number(where, raw, "slots_per_host", kind=int, default=0),
                   _number(where, raw, "grad_arrays", kind=int, default=0))


def _racks(raw, hosts):
    """Network fields of the optional ``racks:`` block ({} without one); errors name the key."""
    if raw is None:
        return {}
    _check_keys("racks", raw, _RACK_KEYS, _RACK_KEYS)
    per_rack = _number("racks", raw, "hosts_per_rack", 1, kind=int)
    if per_rack > hosts or hosts % per_rack:
        raise ValueError(f"profile racks.hosts_per_rack={per_rack} does not fit hosts={hosts}: "
                         f"it must be an integer in 1..{hosts} that divides hosts; set hosts to "
                         f"racks x hosts_per_rack (e.g. {max(1, hosts // per_rack)} racks of "
                         f"{per_rack}) or drop the racks block for two link levels")
    return {"hosts_per_rack": per_rack, "spine": _link("racks.spine", raw["spine"]),
            # 1: full bisection to the spine, 3: a third of it
            "oversubscription": _number("racks", raw, "oversubscription", low=1)}


def _run(raw):
    """The optional ``run:`` block with its defaults (seconds, counts, ms per step)."""
    raw = raw or {}
    _check_keys("run", raw, RUN_KEYS)
    return {k: _number("run", raw, k, kind=type(v), default=v) for k, v in RUN_KEYS.items()}


def _auto_tables(raw):
    """The optional ``auto_tables:`` list, checked: {(ranks, ranks_per_host): (bounds,
    algorithms)}."""
    tables = {}
    for i, entry in enumerate(raw or []):
        where = f"auto_tables[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"profile {where}: expected a mapping with keys {sorted(_AUTO_KEYS)}")
        _check_keys(where, entry, _AUTO_KEYS, _AUTO_KEYS)
        ranks = _number(where, entry, "ranks", 1, kind=int)
        per_host = _number(where, entry, "ranks_per_host", 1, kind=int)
        bounds, names = list(entry["bounds"] or []), list(entry["algorithms"] or [])
        if (len(names) != len(bounds) + 1 or set(names) - set(ALGORITHMS)
                or any(not isinstance(b, int) or b < 1 for b in bounds) or bounds != sorted(bounds)):
            raise ValueError(f"profile {where}: needs ascending positive byte bounds and one "
                             f"algorithm more than bounds, each of {sorted(ALGORITHMS)}; got "
                             f"bounds {bounds}, algorithms {names}")
        tables[(ranks, per_host)] = (bounds, names)
    return tables


def profile_from_dict(raw):
    """Build a Profile from the parsed file; raise ValueError naming any bad key or value."""
    required = _TOP_KEYS - {"description", "calibration", "software", "oversubscribed_wait_us",
                            "cache_MiB", "cache_bandwidth_GBps", "native_hierarchical",
                            "oversubscribed_hosts_wait_us", "torus_pipeline_MiB", "racks", "run",
                            "auto_tables"}
    _check_keys("top level", raw, _TOP_KEYS, required)
    _check_keys("links", raw["links"], {"intra", "inter"}, {"intra", "inter"})
    software = raw.get("software") or {}
    _check_keys("software", software, ALGORITHMS)
    for name, sw in software.items():
        _check_keys(f"software.{name}", sw, _SOFTWARE_KEYS, _SOFTWARE_KEYS)
    top = "top level"
    network = Network(_link("links.intra", raw["links"]["intra"]),
                      _link("links.inter", raw["links"]["inter"]),
                      _number(top, raw, "reduce_ns_per_byte") * 1e-9,
                      _number(top, raw, "gpus_per_host", 1, kind=int),
                      _number(top, raw, "slots_per_host", 1, kind=int),
                      _number(top, raw, "native_switch_bytes", kind=int),
                      {k: Software(_number(f"software.{k}", v, "step_us") * 1e-6,
                                   _number(f"software.{k}", v, "ns_per_byte") * 1e-9)
                       for k, v in software.items()},
                      _number(top, raw, "oversubscribed_wait_us", default=0.0) * 1e-6,
                      int(_number(top, raw, "cache_MiB", default=0) * (1 << 20)),
                      _number(top, raw, "cache_bandwidth_GBps", default=0.0) * 1e9,
                      _flag("native_hierarchical", raw.get("native_hierarchical", False)),
                      _number(top, raw, "oversubscribed_hosts_wait_us", default=0.0) * 1e-6,
                      int(_number(top, raw, "torus_pipeline_MiB", default=0) * (1 << 20)),
                      **_racks(raw.get("racks"), _number(top, raw, "hosts", 1, kind=int)))
    if network.cache_bytes and network.cache_bandwidth_Bps <= 0:
        raise ValueError("profile: cache_MiB > 0 needs cache_bandwidth_GBps > 0")
    _check_keys("models", raw["models"], raw["models"] or {})
    if not raw["models"]:
        raise ValueError("profile models: needs at least one model, e.g. resnet50: {a_ms: ..}")
    models = {name: _compute(name, m) for name, m in raw["models"].items()}
    gflops = {name: _number(f"models.{name}", m, "gflops_per_image", strict=True)
              for name, m in raw["models"].items() if "gflops_per_image" in m}
    return Profile(raw["name"], raw.get("description", ""), _number(top, raw, "hosts", 1, kind=int),
                   network, models,
                   {"calibration": raw.get("calibration"), "run": _run(raw.get("run")),
                    "auto_tables": _auto_tables(raw.get("auto_tables")),
                    "gflops_per_image": gflops})


def profile_to_dict(prof):
    """The file form of ``prof`` (inverse of :func:`profile_from_dict`)."""
    net = prof.network

    def link(l):
        return {"latency_us": float(l.latency_s * 1e6),
                "bandwidth_GBps": float(l.bandwidth_Bps * 1e-9)}
    out = {"name": prof.name, "description": prof.description, "hosts": prof.hosts,
           "gpus_per_host": net.gpus_per_host, "slots_per_host": net.slots_per_host,
           "links": {"intra": link(net.intra), "inter": link(net.inter)},
           "reduce_ns_per_byte": float(net.reduce_s_per_byte * 1e9),
           "native_switch_bytes": net.native_switch_bytes,
           "oversubscribed_wait_us": float(net.oversubscribed_wait_s * 1e6),
           "cache_MiB": net.cache_bytes / (1 << 20),
           "cache_bandwidth_GBps": float(net.cache_bandwidth_Bps * 1e-9),
           "native_hierarchical": bool(net.native_hierarchical),
           "oversubscribed_hosts_wait_us": float(net.oversubscribed_hosts_wait_s * 1e6),
           "torus_pipeline_MiB": net.torus_pipeline_bytes / (1 << 20),
           "software": {k: {"step_us": float(v.step_s * 1e6),
                            "ns_per_byte": float(v.s_per_byte * 1e9)}
                        for k, v in (net.software or {}).items()},
           "models": {name: {"a_ms": float(m.a_s * 1e3), "b_ms": float(m.b_s * 1e3),
                             "gamma": float(m.gamma),
                             "max_local_batch": m.max_local_batch, "grad_bytes": m.grad_bytes,
                             "slots_per_host": m.slots_per_host}
                      for name, m in prof.models.items()}}
    for name, gflops in ((prof.extra or {}).get("gflops_per_image") or {}).items():
        out["models"][name]["gflops_per_image"] = float(gflops)
    if net.hosts_per_rack:
        out["racks"] = {"hosts_per_rack": net.hosts_per_rack, "spine": link(net.spine),
                        "oversubscription": net.oversubscription}
    if (prof.extra or {}).get("run") not in (None, RUN_KEYS):
        out["run"] = prof.extra["run"]
    if (prof.extra or {}).get("auto_tables"):
        out["auto_tables"] = [{"ranks": r, "ranks_per_host": h, "bounds": list(b),
                               "algorithms": list(n)}
                              for (r, h), (b, n) in sorted(prof.extra["auto_tables"].items())]
    if (prof.extra or {}).get("calibration") is not None:
        out["calibration"] = prof.extra["calibration"]
    return out


def _read(name_or_path):
    """(path, parsed file) of a shipped profile name (``abci``) or a profile file path."""
    path = name_or_path
    if not os.path.exists(path):
        candidates = [os.path.join(PROFILE_DIR, name_or_path + ext)
                      for ext in (".yaml", ".yml", ".json")]
        path = next((c for c in candidates if os.path.exists(c)), None)
        if path is None:
            raise ValueError(f"no profile file or shipped profile {name_or_path!r}; "
                             f"shipped: {list_profiles()}")
    try:
        with open(path) as f:
            raw = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:   # a folder, no
        # permission, not text, malformed JSON (a ValueError) or YAML
        why = e.strerror if isinstance(e, OSError) and e.strerror else \
            " ".join(str(e).split())
        raise ValueError(f"profile {name_or_path!r}: cannot read {path}: {why}; give a profile "
                         f"file (YAML or JSON) or a shipped name: {list_profiles()}") from None
    if raw is None:
        raise ValueError(f"{path}: the file is empty")
    return path, raw


def load_profile(name_or_path, shape=None):
    """Load a shipped profile by name (``abci``) or any profile file by path, reshaped by
    ``shape`` (a :data:`Shape`, e.g. from the --hosts/--gpus-per-host flags; None: as written).
    What the reshape changed is in ``extra["shape"]`` (lines for the plan)."""
    path, raw = _read(name_or_path)
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
        source = _read(GPU_PROFILES[shape.gpu_model])[1]
        raw["models"] = source["models"]
        raw["reduce_ns_per_byte"] = source["reduce_ns_per_byte"]
        notes.append(f"models and reduce_ns_per_byte: {shape.gpu_model.upper()}'s, from "
                     f"profile {source['name']} (--gpu-model)")
    return raw, notes


def save_profile(prof, path, header=""):
    """Write ``prof`` as YAML (``header`` lines are written first as comments)."""
    with open(path, "w") as f:
        for line in header.splitlines():
            f.write(f"# {line}\n")
        yaml.safe_dump(profile_to_dict(prof), f, sort_keys=False)


def model_of(prof, model):
    """The Compute coefficients of ``model`` in ``prof``; ValueError lists the known models."""
    if model not in prof.models:
        raise ValueError(f"profile {prof.name!r} has no model {model!r}; "
                         f"it has {sorted(prof.models)} (calibrate one with tools/calibrate.py)")
    return prof.models[model]
