"""Measure what one checkpoint-restart of the ImageNet example costs here, part by part.

    python tools/restart_cost.py --ranks 4 --repeat 5            # digits network (default)
    python tools/restart_cost.py --arch resnet50 --width 1 --image-size 224 --repeat 3

Parts (seconds, median of --repeat runs; the machine's load is part of them):
  process start     ``python -c pass``
  mpirun start      ``mpirun -np R python -c "from mpi4py import MPI"`` minus one process start
  imports           nnabla, nnabla_torus, mpi4py and DALI on R ranks at once (they share the
                    cores), minus the mpirun start
  graph build       model, training graph at --local-batch, first forward/backward (allocations)
  checkpoint write  parameters + momentum through checkpoint.save_checkpoint (fsync included)
  checkpoint read   checkpoint.read_checkpoint of that file (checksum included)
  input start       DALI training pipeline built and its first batch decoded (data.make_loader)
The total is what nnabla_torus.launching.elastic charges per restart (the profile's run.restart_s);
the planner then says at which phase length a resize pays (``plan_resize``'s break-even).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _example  # noqa: F401  (examples/imagenet on sys.path, for its models)
from models import ARCHS
from nnabla_torus.files import atomic_open
from nnabla_torus.knobs import add_knob, number, writable_file
from nnabla_torus.launching.mpirun_cmd import mpirun_command

HERE = os.path.dirname(os.path.abspath(__file__))


def timed_run(argv):
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def in_process(args):
    """(graph build, checkpoint write, checkpoint read, input start) seconds in this process."""
    import nnabla as nn
    import numpy as np

    import data
    import digits
    from nnabla_torus.training.checkpoint_file import read_checkpoint, save_checkpoint
    from models import get_model
    from train import build_graph

    nn.clear_parameters()
    start = time.perf_counter()
    model = get_model(args.arch, 10, args.width)
    x, t, loss, objective, _ = build_graph(model, args.local_batch, args.image_size, 0.1, 1)
    x.d = np.random.rand(*x.shape)
    t.d = np.random.randint(0, 10, t.shape)
    objective.forward(clear_no_need_grad=True)
    objective.backward(clear_buffer=True)
    graph = time.perf_counter() - start

    params = nn.get_parameters(grad_only=False)
    arrays = {f"param/{k}": v.d.copy() for k, v in params.items()}
    arrays.update({f"solver/{k}/m": v.d.copy() for k, v in nn.get_parameters().items()})
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        path = save_checkpoint(folder, 1, arrays, {"step": 1})
        write = time.perf_counter() - start
        start = time.perf_counter()
        read_checkpoint(path)
        read = time.perf_counter() - start
        megabytes = os.path.getsize(path) / 1e6

    root = digits.ensure_digits_dataset()
    train_set = data.read_dataset(os.path.join(root, "train"), os.path.join(root, "train.txt"))
    start = time.perf_counter()
    next(data.make_loader(train_set, args.local_batch, image_size=args.image_size))
    loader = time.perf_counter() - start
    return graph, write, read, loader, megabytes


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_knob(parser, "--ranks", "NNABLA_TORUS_RESTART_RANKS", 4, "ranks for the mpirun start",
             type=number(int, low=1))
    add_knob(parser, "--repeat", "NNABLA_TORUS_RESTART_REPEAT", 5, "runs per part (median)",
             type=number(int, low=1))
    add_knob(parser, "--arch", "NNABLA_TORUS_RESTART_ARCH", "resnet18", "network",
             choices=ARCHS)
    add_knob(parser, "--width", "NNABLA_TORUS_RESTART_WIDTH", 0.125, "channel width multiplier",
             type=number(float, low=0, strict=True))
    add_knob(parser, "--image-size", "NNABLA_TORUS_RESTART_IMAGE_SIZE", 16, "pixels",
             type=number(int, low=1))
    add_knob(parser, "--local-batch", "NNABLA_TORUS_RESTART_LOCAL_BATCH", 32,
             "images per rank of the graph", type=number(int, low=1))
    add_knob(parser, "--json", "NNABLA_TORUS_RESTART_JSON", "", "write the figures to this file",
             type=writable_file)
    return parser


def parse_args(argv=None):
    """Parse and check every flag before anything is measured."""
    return build_parser().parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    py = sys.executable
    imports = "import nnabla, nnabla_torus, mpi4py.MPI, nvidia.dali"
    env_path = os.path.join(HERE, "..")
    os.environ["PYTHONPATH"] = env_path + os.pathsep + os.environ.get("PYTHONPATH", "")
    runs = {"process start": [], "mpirun start": [], "imports": [], "graph build": [],
            "checkpoint write": [], "checkpoint read": [], "input start": []}
    megabytes = 0.0
    for _ in range(args.repeat):
        start = timed_run([py, "-c", "pass"])
        runs["process start"].append(start)
        launch = timed_run(mpirun_command(args.ranks, ["-c", "from mpi4py import MPI"]))
        runs["mpirun start"].append(launch - start)
        runs["imports"].append(timed_run(mpirun_command(args.ranks, ["-c", imports])) - launch)
        graph, write, read, loader, megabytes = in_process(args)
        for name, value in (("graph build", graph), ("checkpoint write", write),
                            ("checkpoint read", read), ("input start", loader)):
            runs[name].append(value)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    total = sum(medians.values())
    print(f"# restart cost: {args.arch} x{args.width:g} {args.image_size}px, local batch "
          f"{args.local_batch}, {args.ranks} ranks, checkpoint {megabytes:.1f} MB, median of "
          f"{args.repeat}")
    for name, value in medians.items():
        print(f"  {name:<18s} {value:8.3f} s   (runs: "
              f"{', '.join(f'{v:.2f}' for v in runs[name])})")
    print(f"  {'total':<18s} {total:8.3f} s")
    if args.json:
        with atomic_open(args.json, "w") as f:
            json.dump({"medians_s": medians, "total_s": total, "runs_s": runs,
                       "checkpoint_MB": megabytes, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
