"""The cluster profile's schema: the Profile record, the keys a profile file may hold and
their checks.

:func:`profile_from_dict` builds a Profile from a parsed file (unknown keys rejected by name,
each value checked against its range) and :func:`profile_to_dict` gives the file form back.
Every key, with its unit, is in docs/costmodel.md#cluster-profiles.
"""
import math
from collections import namedtuple

from ..comm.auto.table import table_problem
from .costmodel import ALGORITHMS, Compute, Link, Network, Software


Profile = namedtuple("Profile", ["name", "description", "hosts", "network", "models", "extra"])

_TOP_KEYS = {"name", "description", "hosts", "gpus_per_host", "slots_per_host", "links",
             "reduce_ns_per_byte", "native_switch_bytes", "software", "models",
             "oversubscribed_wait_us", "cache_MiB", "cache_bandwidth_GBps", "native_hierarchical",
             "oversubscribed_hosts_wait_us", "torus_pipeline_MiB", "calibration", "racks", "run",
             "auto_tables", "host_mpi_latency_us", "backend"}
# backend: the communicator backend the profile's ranks run ("nccl": GPUs, the default; "mpi":
# CPU ranks, as tools/calibrate.py measures). The planner leaves out the algorithms that run on
# MPI only (collectives.Algorithm.mpi_only) for an "nccl" profile.
BACKENDS = ("nccl", "mpi")
_LINK_KEYS = {"latency_us", "bandwidth_GBps"}
_SOFTWARE_KEYS = {"step_us", "ns_per_byte"}
_MODEL_KEYS = {"a_ms", "b_ms", "gamma", "max_local_batch", "grad_bytes", "slots_per_host",
               "gflops_per_image",   # optional: training GFLOPs per image (model_cost)
               "grad_arrays",        # optional: gradient arrays per backward (overlap_choice)
               "finite_check_us",    # optional: the inf/NaN check per step (framework)
               "params"}             # optional: parameters (checkpoint_interval's state size)
_RACK_KEYS = {"hosts_per_rack", "spine", "oversubscription"}
_AUTO_KEYS = {"ranks", "ranks_per_host", "bounds", "algorithms"}
# The run: block's keys and defaults. restart_s: seconds one checkpoint-restart costs (the
# elastic launcher's price of a GPU-count change); *assumed* 30 s where a profile has no
# measurement (mpirun start and NCCL set-up of ~2,000 ranks, a 200 MB checkpoint on a shared
# file system; no published figure): measure yours with tools/restart_cost.py.
# mtbf_hours: GPU-hours between failures that end a job, per GPU (host and link failures
# included; planning.checkpoint_interval): *derived* from Llama 3 (Dubey et al., arXiv
# 2407.21783, section 3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100s,
# 54 x 24 x 16,384 / 419 = 50,677), *assumed* for other GPUs. checkpoint_GBps: the rate at which
# a checkpoint of the model's state (parameters and momentum) is written, serialised,
# checksummed and synced: 0.12 measured here for ResNet-50's 204 MB (save_checkpoint, 1.66 s).
RUN_KEYS = {"startup_s": 0.0, "validation_s": 0.0, "validations": 1, "loader_stall_ms": 0.0,
            "restart_s": 30.0,
            # fixed_costs.py: start-up growth per doubling of hosts; one validation pass on one
            # GPU (spread over the run's GPUs) every validate_every_epochs (0: none); the input
            # pipeline's images/s per host (0: not modelled)
            "startup_s_per_doubling": 0.0, "validation_gpu_s": 0.0,
            "validate_every_epochs": 0.0, "loader_images_per_s": 0.0,
            "mtbf_hours": 50677.0, "checkpoint_GBps": 0.12}


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
                _MODEL_KEYS - {"slots_per_host", "gflops_per_image", "grad_arrays",
                               "finite_check_us", "params"})
    where = f"models.{name}"
    return Compute(_number(where, raw, "a_ms") * 1e-3,
                   _number(where, raw, "b_ms", strict=True) * 1e-3,
                   _number(where, raw, "gamma", low=1),   # 1: no overlap of compute, all-reduce
                   _number(where, raw, "max_local_batch", 1, kind=int),
                   _number(where, raw, "grad_bytes", 1, kind=int),
                   _number(where, raw, "slots_per_host", kind=int, default=0),
                   _number(where, raw, "grad_arrays", kind=int, default=0),
                   _number(where, raw, "finite_check_us", default=0.0) * 1e-6)


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
    return {k: _number("run", raw, k, kind=type(v), default=v,
                       strict=k in ("mtbf_hours", "checkpoint_GBps"))
            for k, v in RUN_KEYS.items()}


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
        bounds, names = entry["bounds"] or [], entry["algorithms"] or []
        problem = table_problem(bounds, names, ALGORITHMS)
        if problem:
            raise ValueError(f"profile {where}: {problem}")
        tables[(ranks, per_host)] = (bounds, names)
    return tables


def profile_from_dict(raw):
    """Build a Profile from the parsed file; raise ValueError naming any bad key or value."""
    required = _TOP_KEYS - {"description", "calibration", "software", "oversubscribed_wait_us",
                            "cache_MiB", "cache_bandwidth_GBps", "native_hierarchical",
                            "oversubscribed_hosts_wait_us", "torus_pipeline_MiB", "racks", "run",
                            "auto_tables", "host_mpi_latency_us", "backend"}
    _check_keys("top level", raw, _TOP_KEYS, required)
    backend = raw.get("backend", BACKENDS[0])
    if backend not in BACKENDS:
        raise ValueError(f"profile top level: backend {backend!r}: must be one of "
                         f"{', '.join(BACKENDS)} (nccl: GPU ranks; mpi: CPU ranks)")
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
                      **_racks(raw.get("racks"), _number(top, raw, "hosts", 1, kind=int)),
                      host_mpi_latency_s=_number(top, raw, "host_mpi_latency_us",
                                                 default=0.0) * 1e-6)
    if network.cache_bytes and network.cache_bandwidth_Bps <= 0:
        raise ValueError("profile: cache_MiB > 0 needs cache_bandwidth_GBps > 0")
    _check_keys("models", raw["models"], raw["models"] or {})
    if not raw["models"]:
        raise ValueError("profile models: needs at least one model, e.g. resnet50: {a_ms: ..}")
    models = {name: _compute(name, m) for name, m in raw["models"].items()}
    gflops = {name: _number(f"models.{name}", m, "gflops_per_image", strict=True)
              for name, m in raw["models"].items() if "gflops_per_image" in m}
    params = {name: _number(f"models.{name}", m, "params", 1, kind=int)
              for name, m in raw["models"].items() if "params" in m}
    return Profile(raw["name"], raw.get("description", ""), _number(top, raw, "hosts", 1, kind=int),
                   network, models,
                   {"calibration": raw.get("calibration"), "run": _run(raw.get("run")),
                    "auto_tables": _auto_tables(raw.get("auto_tables")),
                    "gflops_per_image": gflops, "params": params, "backend": backend})


def profile_to_dict(prof):
    """The file form of ``prof`` (inverse of :func:`profile_from_dict`)."""
    net = prof.network

    def link(hop):
        return {"latency_us": float(hop.latency_s * 1e6),
                "bandwidth_GBps": float(hop.bandwidth_Bps * 1e-9)}
    out = {"name": prof.name, "description": prof.description, "hosts": prof.hosts,
           "backend": backend_of(prof),
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
           "host_mpi_latency_us": round(float(net.host_mpi_latency_s * 1e6), 6),
           "software": {k: {"step_us": float(v.step_s * 1e6),
                            "ns_per_byte": float(v.s_per_byte * 1e9)}
                        for k, v in (net.software or {}).items()},
           "models": {name: {"a_ms": float(m.a_s * 1e3), "b_ms": float(m.b_s * 1e3),
                             "gamma": float(m.gamma),
                             "max_local_batch": m.max_local_batch, "grad_bytes": m.grad_bytes,
                             "slots_per_host": m.slots_per_host,
                             **({"grad_arrays": m.grad_arrays} if m.grad_arrays else {}),
                             **({"finite_check_us": float(m.finite_check_s * 1e6)}
                                if m.finite_check_s else {})}
                      for name, m in prof.models.items()}}
    for key, kind in (("gflops_per_image", float), ("params", int)):
        for name, value in ((prof.extra or {}).get(key) or {}).items():
            out["models"][name][key] = kind(value)
    for name, m in prof.models.items():
        if m.grad_arrays:                         # optional key: written where it was read
            out["models"][name]["grad_arrays"] = m.grad_arrays
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


def backend_of(prof):
    """The communicator backend ``prof``'s ranks run: "nccl" (GPUs) or "mpi" (CPU ranks)."""
    return (prof.extra or {}).get("backend", BACKENDS[0])


def model_of(prof, model):
    """The Compute coefficients of ``model`` in ``prof``; ValueError lists the known models."""
    if model not in prof.models:
        raise ValueError(f"profile {prof.name!r} has no model {model!r}; "
                         f"it has {sorted(prof.models)} (calibrate one with tools/calibrate.py)")
    return prof.models[model]
