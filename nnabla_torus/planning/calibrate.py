"""Calibration: fit the cost model to measurement records and build a cluster profile.

Pure fitting (least squares on log time, parameters in log space); measuring is
tools/calibrate.py's job, which runs the benchmarks under mpirun and hands their records here:

- all-reduce records (tools/allreduce_bench.py --json: algorithm, grid, ranks, bytes, time_us)
  fit the network: intra-host latency and bandwidth (in memory and in cache), the wait per
  call when ranks outnumber cores, and each algorithm's software cost (seconds per step and
  per byte; native's per-step cost is pinned at 0, its steps being the link's);
- training-step records (tools/train_bench.py --json: ranks, local_batch, overlap,
  step_time_s) fit the compute: a, b and the overlap exponent gamma, with the per-host compute
  slots chosen among 1..cores by the best fit.

Pinned (the data cannot identify them) and reported: the reduction cost per byte (a numpy add
micro-benchmark: on a ring it only ever appears next to 1/bandwidth), the per-host slots for
data movement (the CPU core count), the last-level cache size (sysfs) and, on one host, the
whole inter-host level. The report gives the median absolute percentage error (MdAPE) of
predicted versus measured times.
"""
import os
import time

import numpy as np

from . import costmodel
from ..comm.collectives import OURS, PIPELINE_BYTES   # OURS: implemented in Python by us
from .costmodel import Compute, Link, Network, Software
from .machine_profile import Profile
from ..knobs import env_value
from ..comm.topology import parse_grid


def mdape(predicted, measured):
    """Median absolute percentage error, as a fraction (0.1 = 10 %)."""
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    return float(np.median(np.abs(predicted - measured) / measured))


def grid_x(record):
    """Row length X of a benchmark record's grid ("XxY"; "-" for native: the world)."""
    grid = str(record.get("grid", "-"))
    return parse_grid(grid).x if "x" in grid else int(record["ranks"])


def _columns(records, *keys):
    return [np.array([r[k] for r in records]) for k in keys]


def predict_allreduce(net, records):
    """Predicted seconds for each all-reduce benchmark record (one vectorised call per
    algorithm)."""
    algorithm, ranks, nbytes = _columns(records, "algorithm", "ranks", "bytes")
    x = np.array([grid_x(r) for r in records])
    out = np.empty(len(records))
    for name in set(algorithm.tolist()):
        m = algorithm == name
        out[m] = costmodel.allreduce_time(net, name, ranks[m], nbytes[m], x[m])
    return out


def _network_from(theta, base):
    """Network from log parameters: latency, bandwidth, cache bandwidth, wait, native s/byte,
    then (s/step, s/byte) for each of our algorithms."""
    lat, bw, cache_bw, wait, native_per_byte, *ours = np.exp(theta)
    software = {"native": Software(0.0, native_per_byte)}
    software.update({a: Software(*ours[2 * i:2 * i + 2]) for i, a in enumerate(OURS)})
    return base._replace(intra=Link(lat, bw), software=software, oversubscribed_wait_s=wait,
                         cache_bandwidth_Bps=cache_bw)


def fit_network(records, base):
    """Fit intra latency and bandwidth and the software costs to all-reduce records.

    ``base`` supplies the pinned fields (inter level, reduce cost, hosts, slots, switch).
    Returns (Network, report dict with the MdAPE and the fitted and pinned values).
    """
    from scipy.optimize import least_squares
    records = [r for r in records if r.get("correct", True) and r["ranks"] > 1
               and r["algorithm"] in costmodel.ALGORITHMS]   # not auto: it runs these
    if not records:
        raise ValueError("no correct multi-rank all-reduce records to fit; run the benchmark "
                         "at 2 or more ranks")
    measured = np.array([r["time_us"] * 1e-6 for r in records])

    def residuals(theta):
        return np.log(predict_allreduce(_network_from(theta, base), records)) - np.log(measured)

    start = np.log([20e-6, 1e9, 4e9, 1e-3, 1e-10] + [50e-6, 1e-10] * len(OURS))
    fit = least_squares(residuals, start, bounds=(np.log(1e-15), np.log(1e12)))
    net = _network_from(fit.x, base)
    predicted = predict_allreduce(net, records)
    per_algorithm = {a: mdape(predicted[m], measured[m]) for a in costmodel.ALGORITHMS
                     for m in [np.array([r["algorithm"] == a for r in records])] if m.any()}
    return net, {"allreduce_mdape": mdape(predicted, measured),
                 "allreduce_mdape_by_algorithm": per_algorithm,
                 "allreduce_records": len(records)}


def _compute_from(theta, slots, base):
    a, b, gamma_minus_one = np.exp(theta)
    return base._replace(a_s=a, b_s=b, gamma=1.0 + gamma_minus_one, slots_per_host=slots)


def predict_steps(net, comp, records, algorithm):
    """Predicted step seconds per train-bench record (overlap 0 records: gamma = 1).

    The grid is the communicator's default for the rank count (costmodel's default X).
    """
    ranks, batch = _columns(records, "ranks", "local_batch")
    overlap = np.array([bool(r.get("overlap")) for r in records])
    out = np.empty(len(records))
    for flag in (False, True):
        m = overlap == flag
        if m.any():
            c = comp if flag else comp._replace(gamma=1.0)
            out[m] = costmodel.step_time(net, c, algorithm, ranks[m], batch[m])
    return out


def fit_compute(records, net, base, algorithm, max_slots):
    """Fit a, b, gamma to train-bench records; slots per host: the best fit in 1..max_slots.

    Returns (Compute, report dict).
    """
    from scipy.optimize import least_squares
    if not records:
        raise ValueError("no training-step records to fit; run tools/train_bench.py")
    measured = np.array([r["step_time_s"] for r in records])
    best = None
    for slots in range(1, max_slots + 1):
        def residuals(theta):
            comp = _compute_from(theta, slots, base)
            return np.log(predict_steps(net, comp, records, algorithm)) - np.log(measured)
        fit = least_squares(residuals, np.log([1e-2, 1e-3, 1.0]),
                            bounds=(np.log([1e-7, 1e-8, 1e-3]), np.log([10.0, 10.0, 50.0])))
        if best is None or fit.cost < best[0].cost:
            best = (fit, slots)
    comp = _compute_from(best[0].x, best[1], base)
    predicted = predict_steps(net, comp, records, algorithm)
    return comp, {"step_mdape": mdape(predicted, measured), "step_records": len(records),
                  "compute_slots_chosen": best[1]}


def plan_versus_sweep(prof, model, records, algorithm):
    """Measured images/s of the planner's choice over the best measured, on the sweep's grid.

    The planner sees only the rank counts and per-rank batches of ``records`` (overlapped
    training steps); returns {chosen: (ranks, batch), best: (ranks, batch), ratio}.
    """
    from .planner import plan
    sweep = {(r["ranks"], r["local_batch"]): r["images_per_sec"] for r in records
             if r.get("overlap")}
    ranks = sorted({k[0] for k in sweep})
    batches = sorted({k[1] for k in sweep})
    best = plan(prof, model, counts=ranks, local_batches=batches, accum_steps=[1],
                algorithms=[algorithm]).best
    chosen = (best.gpus, best.local_batch)
    top = max(sweep, key=sweep.get)
    return {"chosen": list(chosen), "best_measured": list(top),
            "ratio": float(sweep[chosen] / sweep[top])}


def reduce_cost_per_byte(nbytes=1 << 24, repeats=5):
    """Seconds per byte of ``a += b`` on float32 arrays of ``nbytes`` (best of ``repeats``)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    best = np.inf
    for _ in range(repeats):
        tic = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - tic)
    return best / nbytes


def auto_tables(records):
    """auto's size ranges as measured at the benchmark's init, per job shape: the profile's
    ``auto_tables`` ({(ranks, ranks_per_host): (bounds, algorithms)})."""
    return {(r["ranks"], r["ranks_per_host"]): (r["auto_bounds"], r["auto_algorithms"])
            for r in records if r["algorithm"] == "auto" and "auto_bounds" in r}


def last_level_cache_bytes():
    """Size of the largest CPU cache of cpu0 from sysfs, bytes (0 when unknown)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = []
    for index in os.listdir(base) if os.path.isdir(base) else []:
        try:
            with open(os.path.join(base, index, "size")) as f:
                text = f.read().strip().upper()
            sizes.append(int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0))
        except (OSError, ValueError):
            continue
    return max(sizes, default=0)


def base_network(cores, ranks_per_host):
    """The pinned part of a one-host network; links, cache bandwidth, software get fitted.

    The inter-host level cannot be measured on one host: it is *assumed* 1 Gbit/s Ethernet
    (50 us, 0.125 GB/s) so plans across hosts stay possible; replace it when you measure one.
    native is Open MPI's, so on several hosts it is coll/han's pipeline (native_hierarchical).
    """
    cache = last_level_cache_bytes()
    return Network(Link(20e-6, 1e9), Link(50e-6, 0.125e9), reduce_cost_per_byte(), ranks_per_host,
                   cores, 10000, {}, 0.0, cache, 4e9 if cache else 0.0, native_hierarchical=True,
                   torus_pipeline_bytes=env_value("NNABLA_TORUS_PIPELINE_BYTES", PIPELINE_BYTES,
                                                  int))


def pinned_report(base, ranks_per_host):
    """What the fit could not identify and how each was set: {field: "value: source"}."""
    return {
        "reduce_ns_per_byte": f"{base.reduce_s_per_byte * 1e9:.4f}: numpy add micro-benchmark",
        "slots_per_host": f"{base.slots_per_host}: CPU cores (data movement shares them)",
        "cache_MiB": f"{base.cache_bytes / (1 << 20):g}: last-level cache from sysfs",
        "links.inter": "assumed 1 Gbit/s Ethernet: one host, no inter-host measurement",
        "software.native.step_us": "0: native steps are the link's latency",
        "native_hierarchical": "true: Open MPI 5 runs coll/han when a job spans hosts",
        "torus_pipeline_MiB": "the MPI backend's pieces (NNABLA_TORUS_PIPELINE_BYTES)",
        "oversubscribed_hosts_wait_us": "0: needs several hosts (tools/emucluster_model_check)",
        "gpus_per_host": f"{ranks_per_host}: the most ranks measured on this host"}


def calibrated_profile(args, base, allreduce, network_fit, steps, grad_bytes):
    """Fit the compute to ``steps`` and return (Profile, report) for this machine.

    ``args``: the calibration settings (tools/calibrate.py's flags: name, arch, width,
    image_size, algorithm, max_local_batch, ranks, sizes, train_ranks, batches); ``base``:
    :func:`base_network`; ``network_fit``: :func:`fit_network` of the ``allreduce`` records;
    ``grad_bytes``: bytes of the model's float32 gradients.
    """
    net, net_report = network_fit
    cores, ranks_per_host = base.slots_per_host, base.gpus_per_host
    start = Compute(1e-2, 1e-3, 1.0, args.max_local_batch, grad_bytes, 0)
    comp, comp_report = fit_compute(steps, net, start, args.algorithm, cores)
    model = f"{args.arch}-w{args.width:g}-{args.image_size}px"
    report = dict(net_report, **comp_report)
    probe = Profile(args.name, "", 1, net, {model: comp}, {"backend": "mpi"})
    report["plan_versus_sweep"] = plan_versus_sweep(probe, model, steps, args.algorithm)
    report["pinned"] = pinned_report(base, ranks_per_host)
    report["model"] = model
    report["measured"] = {"allreduce_ranks": args.ranks, "sizes": args.sizes,
                          "train_ranks": args.train_ranks, "batches": args.batches,
                          "train_algorithm": args.algorithm}
    prof = Profile(args.name, f"this machine ({cores} CPU cores), calibrated by "
                   f"tools/calibrate.py on {time.strftime('%Y-%m-%d')}", 1, net,
                   {model: comp}, {"calibration": report, "auto_tables": auto_tables(allreduce),
                                   "backend": "mpi"})
    return prof, report
