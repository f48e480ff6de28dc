"""Calibration: measure this machine, fit the cost model, write a cluster profile.

1. ``tools/allreduce_bench.py --json`` under mpirun at several rank counts and sizes, every
   algorithm (records: algorithm, grid, ranks, bytes, time_us).
2. ``tools/train_bench.py --json`` at several rank counts and per-rank batches, without and
   with overlap (records: ranks, local_batch, overlap, step_time_s).
3. Fit them (nnabla_torus/planning/calibrate.py: what is fitted, what is pinned) and report
   the median absolute percentage error (MdAPE) of predicted versus measured times.

Add one model to an existing profile (yours, or a shipped one such as dgx-h100) in one
command: its training steps timed on one rank at ``--batches`` (a line a + b x batch), its
FLOPs counted from the nnabla graph (nnabla_torus.planning.model_cost), written to ``--out``
(default: a new file, ``SOURCE+MODEL.yaml``), with every other key and comment of the source
profile as they were::

    python tools/calibrate.py --add-model-to dgx-h100 --arch resnet50 --width 1 \
        --image-size 224 --batches 32,64,128 --context cudnn --out my-cluster.yaml

Measuring needs this source checkout (tools/ and examples/imagenet/); fitting saved records
with ``--allreduce-json`` / ``--train-json`` needs no benchmark run. Run it alone (under
``flock /tmp/nnabla-torus-bench.lock`` on a shared machine): it times. Example::

    python tools/calibrate.py --ranks 2,4,8 --train-ranks 1,2,4 --batches 4,8,16,32 \\
        --out nnabla_torus/planning/profiles/cpu-2core.yaml
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

import _example  # noqa: F401  (examples/imagenet on sys.path, for the model's gradient size)
from nnabla_torus.comm.collectives import ALGORITHMS, AUTO
from nnabla_torus.files import atomic_open
from nnabla_torus.knobs import add_knob, short_repr
from nnabla_torus.launching.mpirun_cmd import mpirun_command
from nnabla_torus.planning.calibrate import base_network, calibrated_profile, fit_network
from nnabla_torus.planning import model_cost
from nnabla_torus.planning.costmodel import Compute
from nnabla_torus.planning.machine_profile import (PROFILE_DIR, load_profile, profile_to_dict,
                                                   read_profile_file, save_profile)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json_tool(ranks, tool, args, env=None, timeout=1800):
    """Run ``tools/<tool> args --json TMP`` under mpirun; return its JSON records."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        full_env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        full_env.update(env or {})
        cmd = mpirun_command(ranks, [os.path.join(REPO, "tools", tool)] + list(args)
                             + ["--json", path])
        done = subprocess.run(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if done.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n"
                               f"{done.stdout[-3000:]}")
        with open(path) as f:
            return json.load(f)


def grids_for(ranks):
    """torus2d grids to benchmark at ``ranks``: every XxY with X, Y >= 2."""
    return [f"{ranks // y}x{y}" for y in range(2, ranks) if ranks % y == 0 and ranks // y >= 2]


def measure_allreduce(ranks_list, sizes, iters, rounds, log=print):
    records = []
    for ranks in ranks_list:
        args = ["--sizes", sizes, "--iters", str(iters), "--rounds", str(rounds), "--warmup", "1",
                "--algorithms", ",".join([*ALGORITHMS, AUTO])]   # auto: its table
        if grids_for(ranks):
            args += ["--grids", ",".join(grids_for(ranks))]
        log(f"calibrate: all-reduce benchmark at {ranks} ranks ...")
        records += run_json_tool(ranks, "allreduce_bench.py", args)
    return records


def measure_steps(ranks_list, batches, bench_args, algorithm, log=print):
    records = []
    for ranks in ranks_list:
        for batch in batches:
            log(f"calibrate: training steps at {ranks} ranks x batch {batch} ...")
            records += run_json_tool(ranks, "train_bench.py",
                                     list(bench_args) + ["--batch", str(batch)],
                                     env={"NNABLA_TORUS_ALGORITHM": algorithm})
    return records


def model_grad_bytes(arch, width, classes, image_size):
    """Bytes of float32 gradients of the example's model (built once, on CPU)."""
    return 4 * example_cost(arch, width, classes, image_size).params


def example_cost(arch, width, classes, image_size):
    """model_cost.ModelCost of the example's model (built once, on CPU, at batch 1)."""
    import nnabla as nn
    import nnabla.functions as F  # noqa: F401  (registers the functions used by the model)
    from models import get_model
    nn.clear_parameters()
    model = get_model(arch, classes, width)
    cost = model_cost.count_cost(model(nn.Variable((1, 3, image_size, image_size)), False))
    nn.clear_parameters()
    return cost


def build_parser():
    parser = argparse.ArgumentParser(prog="calibrate", description=__doc__.split("\n")[0])

    def knob(flag, default, help, **kwargs):   # env twin: NNABLA_TORUS_CAL_<FLAG>
        env = "NNABLA_TORUS_CAL_" + flag[2:].upper().replace("-", "_")
        add_knob(parser, flag, env, default, help, **kwargs)
    knob("--name", "cpu-2core", "profile name")
    knob("--out", None, "profile file to write (None: profiles/cpu-2core.yaml for a "
         "calibration; with --add-model-to a new file, SOURCE+MODEL.yaml beside a file of "
         "yours or in the working folder for a shipped name)")
    knob("--add-model-to", None, "add only the model (--arch, --width, --image-size) to this "
         "profile (shipped name or file): one-rank step times at --batches, FLOPs counted")
    knob("--context", "cpu", "nnabla context of the training-step benchmark (cudnn on GPUs)")
    knob("--ranks", "2,4,8", "rank counts for the all-reduce benchmark")
    knob("--sizes", "4K,64K,1M,16M,128M", "all-reduce sizes (K/M/G suffixes)")
    knob("--iters", 5, "timed calls per all-reduce size, algorithm and round", type=int)
    knob("--rounds", 3, "interleaved rounds over the algorithms (evens out machine noise)",
         type=int)
    knob("--train-ranks", "1,2,4", "rank counts for the training-step benchmark")
    knob("--batches", "4,8,16,32", "per-rank batches for the training-step benchmark")
    knob("--train-iters", 5, "timed training steps per setting", type=int)
    knob("--arch", "resnet18", "model of the training-step benchmark")
    knob("--width", 0.25, "width multiplier of the model", type=float)
    knob("--image-size", 32, "image side, pixels", type=int)
    knob("--classes", 1000, "classes of the model", type=int)
    knob("--algorithm", "torus2d", "all-reduce algorithm during the training benchmark")
    knob("--max-local-batch", 256, "per-rank batch limit to record in the profile", type=int)
    knob("--allreduce-json", None, "fit these all-reduce records instead of measuring")
    knob("--train-json", None, "fit these training-step records instead of measuring")
    knob("--save-json", None, "directory to save the measured records in")
    return parser


def _ints(text):
    return [int(t) for t in str(text).split(",") if t.strip()]


def _load_or_measure(path, measure, save_dir, name):
    if path:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read {path} ({getattr(e, 'strerror', None) or e}); give "
                             f"the --json file of tools/{name[:-len('.json')]}_bench.py"
                             ) from None
    records = measure()
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
        with atomic_open(os.path.join(save_dir, name), "w") as f:
            json.dump(records, f, indent=1)
    return records


def calibrate(args, log=print):
    """Measure (or load), fit and return (Profile, report)."""
    cores = os.cpu_count() or 1
    ranks_per_host = max(_ints(args.ranks) + _ints(args.train_ranks))
    base = base_network(cores, ranks_per_host)
    allreduce = _load_or_measure(args.allreduce_json, lambda: measure_allreduce(
        _ints(args.ranks), args.sizes, args.iters, args.rounds, log), args.save_json,
        "allreduce.json")
    network_fit = fit_network(allreduce, base)
    bench_args = ["--arch", args.arch, "--width", str(args.width), "--image-size",
                  str(args.image_size), "--classes", str(args.classes), "--iters",
                  str(args.train_iters), "--warmup", "2"]
    steps = _load_or_measure(args.train_json, lambda: measure_steps(
        _ints(args.train_ranks), _ints(args.batches), bench_args, args.algorithm, log),
        args.save_json, "train.json")
    grad_bytes = model_grad_bytes(args.arch, args.width, args.classes, args.image_size)
    return calibrated_profile(args, base, allreduce, network_fit, steps, grad_bytes)


def fit_line(records):
    """(a_s, b_s) of step seconds = a + b x per-rank batch, through the medians per batch."""
    by_batch = {}
    for r in records:
        by_batch.setdefault(int(r["local_batch"]), []).append(float(r["step_time_s"]))
    batches = sorted(by_batch)
    times = [float(np.median(by_batch[b])) for b in batches]
    if len(batches) < 2:
        return 0.0, times[0] / batches[0]
    b, a = np.polyfit(batches, times, 1)
    return (float(a), float(b)) if a >= 0 and b > 0 else (0.0, float(np.dot(times, batches) /
                                                                    np.dot(batches, batches)))


def step_record_problem(record):
    """What is wrong with one train_bench.py --json record for a fit, in a few words; None if
    nothing: ranks (optional) and local_batch integers >= 1, step_time_s finite and > 0."""
    if not isinstance(record, dict):
        return f"is a JSON {type(record).__name__}, not an object"
    for key, optional in (("ranks", True), ("local_batch", False)):
        value = record.get(key, 1 if optional else None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"has {key} = {short_repr(value)}, not an integer >= 1"
    seconds = record.get("step_time_s")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or \
            not math.isfinite(seconds) or seconds <= 0:
        return f"has step_time_s = {short_repr(seconds)}, not a finite number of seconds > 0"
    return None


def one_rank_steps(records, source):
    """The one-rank records among train_bench.py's ``records`` (from ``source``), which
    --add-model-to fits; ValueError, one line, on a record it cannot fit or on none at one
    rank (a profile of a NaN or negative step time would price every plan wrongly)."""
    if not isinstance(records, list):
        raise ValueError(f"{source} holds a JSON {type(records).__name__}, not the list of "
                         f"records tools/train_bench.py --json writes")
    for i, record in enumerate(records):
        problem = step_record_problem(record)
        if problem:
            raise ValueError(f"{source}: record {i} {problem}; measure again (without "
                             f"--train-json) or correct the record")
    one = [r for r in records if r.get("ranks", 1) == 1]
    if not one:
        ranks = sorted({r["ranks"] for r in records})
        raise ValueError(f"{source} has no one-rank records (ranks {ranks}): --add-model-to "
                         f"fits one rank's step times; measure without --train-json or give "
                         f"train_bench.py records at ranks 1")
    return one


def add_model(args, log=print):
    """(Profile, model name, out path): ``--add-model-to``'s profile with this model added."""
    prof = load_profile(args.add_model_to)
    name = f"{args.arch}-w{args.width:g}-{args.image_size}px"
    bench_args = ["--arch", args.arch, "--width", str(args.width), "--image-size",
                  str(args.image_size), "--classes", str(args.classes), "--iters",
                  str(args.train_iters), "--warmup", "2", "--context", args.context,
                  "--overlap", "0"]
    steps = _load_or_measure(args.train_json, lambda: measure_steps(
        [1], _ints(args.batches), bench_args, args.algorithm, log), args.save_json, "train.json")
    a, b = fit_line(one_rank_steps(steps, args.train_json or "the measured step records"))
    if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b > 0):
        raise ValueError(f"the step times fit {a} s + {b} s per image, not a >= 0 and b > 0; "
                         f"no profile written: measure again")
    cost = example_cost(args.arch, args.width, args.classes, args.image_size)
    models = dict(prof.models)
    # ranks share the host's compute as the profile's calibrated models do (CPU cores: 1 slot)
    slots = prof.models[model_cost.reference_model(prof, cost.gflops_per_image) or
                        sorted(prof.models)[0]].slots_per_host
    models[name] = Compute(a, b, 1.0, args.max_local_batch, 4 * cost.params, slots)
    gflops = dict(prof.extra.get("gflops_per_image") or {}, **{name: cost.gflops_per_image})
    prof = prof._replace(models=models, extra=dict(prof.extra, gflops_per_image=gflops))
    log(f"calibrate: {name}: {a * 1e3:.2f} ms + {b * 1e3:.3f} ms per image on one rank "
        f"({args.context}), {cost.gflops_per_image:.3g} training GFLOPs per image, "
        f"{cost.params:,} parameters")
    return prof, name, args.out or added_model_path(args.add_model_to, name)


def added_model_path(source, name):
    """A new file for ``--add-model-to SOURCE`` without --out, never SOURCE itself: beside a
    file of the user's (``my.yaml`` -> ``my+resnet50-w1-224px.yaml``), in the working folder
    for a shipped profile's name."""
    path, _ = read_profile_file(source)
    stem = os.path.splitext(path if os.path.exists(source) else os.path.basename(path))[0]
    return f"{stem}+{name}.yaml"


def write_added_model(prof, name, source, out):
    """Write ``source``'s profile file to ``out`` with model ``name`` of ``prof`` set in its
    ``models``: a round trip of the file (ruamel.yaml), so every other key (a model's
    ``grad_arrays``, ``run``, racks) and every comment (the sources of its values) stays as it
    was; a model of that name keeps the keys the calibration does not measure."""
    from ruamel.yaml import YAML
    path, _ = read_profile_file(source)    # refuses aliases (safe_yaml) before ruamel reads it
    round_trip = YAML()              # round-trip mode: comments, order and style kept
    with open(path) as f:
        document = round_trip.load(f)
    measured = profile_to_dict(prof)["models"][name]
    if name in document["models"]:
        document["models"][name].update(measured)
    else:
        document["models"][name] = measured
    with atomic_open(out, "w") as f:
        round_trip.dump(document, f)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.add_model_to:
        try:
            prof, name, out = add_model(args)
        except ValueError as e:          # the source profile, the step records: nothing written
            sys.exit(f"calibrate: error: {e}")
        write_added_model(prof, name, args.add_model_to, out)
        print(f"wrote {out} ({args.add_model_to} with model {name} added by tools/calibrate.py "
              f"--add-model-to: one-rank step times, FLOPs counted from the nnabla graph)")
        return 0
    args.out = args.out or os.path.join(PROFILE_DIR, "cpu-2core.yaml")
    prof, report = calibrate(args)
    save_profile(prof, args.out, header="nnabla-torus cluster profile written by "
                 "tools/calibrate.py; see docs/costmodel.md#cluster-profiles for the format.\n"
                 "Fitted on this machine; the 'calibration' block says what was pinned.")
    print(f"all-reduce MdAPE {report['allreduce_mdape']:.1%} over "
          f"{report['allreduce_records']} records; by algorithm: "
          + ", ".join(f"{a} {e:.1%}" for a, e in report["allreduce_mdape_by_algorithm"].items()))
    print(f"training-step MdAPE {report['step_mdape']:.1%} over {report['step_records']} "
          f"records (compute slots per host: {report['compute_slots_chosen']})")
    check = report["plan_versus_sweep"]
    print(f"plan on the measured sweep: {check['chosen']} (ranks, batch) reaches "
          f"{check['ratio']:.1%} of the best measured images/s at {check['best_measured']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
