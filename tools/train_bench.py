"""Training-step benchmark on synthetic input: images/s per rank, scaling, all-reduce share.

Each rank trains the example's ResNet on one fixed random batch (no input pipeline), the step
of examples/imagenet/train.py (forward, backward, gradient all-reduce, weight decay, update),
with the all-reduce after backward and overlapped with it (buckets), alternating step by
step. Reports per setting: median step time, images/s per rank (mean +- 1.96 sigma over the
steps of all ranks), the median time spent inside all-reduce calls and its share of the
step. Usage:

    mpirun -np 4 python tools/train_bench.py --arch resnet18 --width 0.25 --image-size 32 \\
        --batch 8 --iters 10 --json out.json
    python tools/train_bench.py --scaling 1,2,4 ...      # runs mpirun per rank count and adds
                                                          # the scaling efficiency column

JSON: a list of records {arch, width, image_size, ranks, local_batch, step_time_s (median),
step_time_ci95_s (1.96 sigma of the step times), allreduce_s (median), allreduce_share,
images_per_sec, images_per_sec_per_rank, images_per_sec_per_rank_ci95, overlap,
scaling_efficiency (with --scaling: images/s / (ranks x images/s at the fewest ranks))}.
With overlap the all-reduce time is time inside the calls during backward, not the time it
adds to the step (0 on NCCL with ``native``: nnabla's callback packs run inside backward).
"""
import argparse
import json
import os
import subprocess
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import _example  # noqa: F401  (examples/imagenet on sys.path, for its config and models)
from nnabla_torus.files import atomic_open
from nnabla_torus.knobs import add_knob, check_output_flag, number


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_knob(parser, "--arch", env="NNABLA_TORUS_BENCH_ARCH", default="resnet18",
             help="network", choices=("resnet18", "resnet34", "resnet50"))
    add_knob(parser, "--width", env="NNABLA_TORUS_BENCH_WIDTH", default=0.25,
             type=number(float, low=0, strict=True),
             help="channel width multiplier")
    add_knob(parser, "--image-size", env="NNABLA_TORUS_BENCH_IMAGE_SIZE", default=32,
             type=number(int, low=1),
             help="input side, pixels")
    add_knob(parser, "--classes", env="NNABLA_TORUS_BENCH_CLASSES", default=1000,
             type=number(int, low=1),
             help="classifier outputs")
    add_knob(parser, "--batch", env="NNABLA_TORUS_BENCH_BATCH", default=8,
             type=number(int, low=1),
             help="images per rank per step")
    add_knob(parser, "--iters", env="NNABLA_TORUS_BENCH_ITERS", default=10,
             type=number(int, low=1),
             help="timed steps per setting (after --warmup untimed ones)")
    add_knob(parser, "--warmup", env="NNABLA_TORUS_BENCH_WARMUP", default=2,
             type=number(int, low=0),
             help="untimed steps before timing")
    add_knob(parser, "--bucket-mib", env="NNABLA_TORUS_BUCKET_MIB", default=25.0,
             type=number(float, low=0, strict=True),
             help="bucket size for the overlapped all-reduce, MiB")
    add_knob(parser, "--overlap", env="NNABLA_TORUS_BENCH_OVERLAP", default="both",
             choices=("0", "1", "both"), help="without (0), with (1) or both")
    add_knob(parser, "--context", env="NNABLA_TORUS_BENCH_CONTEXT", default="cpu",
             choices=("cpu", "cudnn"), help="nnabla extension: cpu, or cudnn on GPUs")
    add_knob(parser, "--type-config", env="NNABLA_TORUS_BENCH_TYPE_CONFIG", default="float",
             choices=("float", "half"), help="compute type (half: fp16 on GPUs)")
    add_knob(parser, "--json", env="NNABLA_TORUS_BENCH_JSON", default="",
             help="append the records to this JSON file (a list)")
    add_knob(parser, "--scaling", env="NNABLA_TORUS_BENCH_SCALING", default="",
             help="comma-separated rank counts: launch mpirun for each and add efficiency")
    return parser


def parse_args(argv=None):
    """Parse and check every flag, on every rank alike, before any work."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        count = number(int, low=1, hint="rank counts, e.g. 1,2,4")
        args.scaling = [count(n) for n in args.scaling.split(",") if n.strip()]
    except ValueError as e:
        parser.error(f"--scaling: {e}")
    check_output_flag(parser, "--json", args.json)       # before the run, not after
    return args


class TimedComm:
    """Forward to ``comm``; add the seconds spent in all_reduce to ``seconds``. Other attributes
    are ``comm``'s, so ``BucketedAllReduce`` takes the device path through it on NCCL with
    ``native`` (nnabla's all_reduce_callback; its packs run inside backward and are not
    counted in ``seconds``)."""

    def __init__(self, comm):
        self.comm, self.seconds = comm, 0.0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def all_reduce(self, data, **kwargs):
        from nnabla_torus.comm.backends import synchronize
        # The device work queued before the call (backward's kernels, on the stream NCCL
        # shares) is not the all-reduce's: wait for it before the clock starts.
        synchronize(self.comm)
        tic = time.perf_counter()
        self.comm.all_reduce(data, **kwargs)
        synchronize(self.comm)  # NCCL calls return before their kernels end
        self.seconds += time.perf_counter() - tic


class FixedBatch:
    """A stream that always returns the same synthetic batch (no input pipeline cost).

    The images are an NdArray that moves to the device on the first step and stays there
    (``data.feed`` copies it device to device): a float64 numpy batch would be cast on the host
    and copied to the GPU inside every timed step, as no real input pipeline does."""

    def __init__(self, images, labels):
        import nnabla as nn
        self.batch = nn.NdArray.from_numpy_array(images.astype(np.float32)), labels

    def next_batch(self, batch_size):
        return self.batch


def measure(args, comm, settings):
    """Return {overlap: (step seconds list, all-reduce seconds list)} of this rank.

    The settings alternate step by step, so that load from other processes on the machine
    hits them alike and their ratio stays meaningful.
    """
    import nnabla as nn
    import train
    from config import TrainConfig
    from models import get_model
    from nnabla_torus.planning.controller import BatchPlan
    from nnabla_torus.comm.backends import synchronize
    from nnabla_torus.loss_scaling import DynamicLossScaling
    from nnabla_torus.overlap import BucketedAllReduce

    nn.clear_parameters()
    nn.seed(0)
    model = get_model(args.arch, args.classes, args.width)
    graph = train.build_graph(model, args.batch, args.image_size, 0.0, 1)
    params = nn.get_parameters()
    solvers = train.SolverGroup(TrainConfig(), params)
    grads = [v.grad for v in params.values()]
    timed = TimedComm(comm)
    reducers = {False: None, True: BucketedAllReduce(timed, graph[3], params, args.bucket_mib,
                                                     grad_bytes=2 if args.type_config == "half"
                                                     else 4)}
    # FP16 steps as train.py takes them: dynamic loss scaling around the (overlapped) all-reduce.
    scaler = DynamicLossScaling(grads=grads, comm=comm) if args.type_config == "half" else None
    rng = np.random.RandomState(comm.rank)
    stream = FixedBatch(rng.randn(args.batch, 3, args.image_size, args.image_size),
                        rng.randint(0, args.classes, (args.batch, 1)))
    plan = BatchPlan(args.batch * comm.size, args.batch, 1, 1.0, False, "bench")
    times = {overlap: ([], []) for overlap in settings}
    comm.barrier()
    for i in range(args.warmup + args.iters):
        for overlap in settings:
            timed.seconds = 0.0
            tic = time.perf_counter()
            train.train_step(stream, graph, plan, solvers, timed, grads, reducers[overlap], scaler)
            if scaler is None or scaler.unscale(solvers):
                solvers.weight_decay(1e-4)
                solvers.update()
            synchronize(comm)  # the step's kernels, not just their launches
            if i >= args.warmup:
                times[overlap][0].append(time.perf_counter() - tic)
                times[overlap][1].append(timed.seconds)
    reducers[True].close()
    return times


def record(args, ranks, overlap, steps, reduces):
    """One JSON record from the step and all-reduce times of all ranks."""
    steps, reduces = np.asarray(steps), np.asarray(reduces)
    median = float(np.median(steps))
    per_rank = args.batch / steps
    return {"arch": args.arch, "width": args.width, "image_size": args.image_size,
            "ranks": ranks, "local_batch": args.batch, "overlap": overlap,
            "step_time_s": median, "step_time_ci95_s": float(1.96 * steps.std()),
            "allreduce_s": float(np.median(reduces)),
            "allreduce_share": float(np.median(reduces) / median),
            "images_per_sec": ranks * args.batch / median,
            "images_per_sec_per_rank": float(per_rank.mean()),
            "images_per_sec_per_rank_ci95": float(1.96 * per_rank.std())}


def run_ranks(args):
    """This process is one rank of an mpirun job: measure and (rank 0) report."""
    import nnabla as nn
    from mpi4py import MPI
    from nnabla.ext_utils import get_extension_context
    import nnabla_torus as C

    ctx = get_extension_context(args.context, device_id="0", type_config=args.type_config)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    ctx.device_id = str(comm.local_rank)  # the GPU the communicator's buffers live on
    nn.set_default_context(ctx)
    settings = {"0": [False], "1": [True], "both": [False, True]}[args.overlap]
    records = []
    for overlap, (steps, reduces) in measure(args, comm, settings).items():
        all_steps = sum(MPI.COMM_WORLD.allgather(steps), [])
        all_reduces = sum(MPI.COMM_WORLD.allgather(reduces), [])
        records.append(record(args, comm.size, overlap, all_steps, all_reduces))
    if comm.rank == 0:
        print(f"# train_bench: {args.arch} x{args.width}, {args.image_size} px, batch "
              f"{args.batch}/rank, {args.iters} steps, {comm.size} ranks, algorithm "
              f"{comm.algorithm}, grid {comm.grid}, bucket {args.bucket_mib} MiB")
        print_table(records)
        print("RECORDS " + json.dumps(records), flush=True)
        if args.json:
            append_json(args.json, records)
    comm.close()


def print_table(records):
    print(f"# {'ranks':>5} {'overlap':>7} {'step_ms':>9} {'+-ms':>7} {'allred_ms':>9} "
          f"{'share':>6} {'img/s':>8} {'img/s/rank':>16} {'effic':>6}")
    for r in records:
        eff = r.get("scaling_efficiency")
        print(f"  {r['ranks']:>5} {str(r['overlap']):>7} {r['step_time_s'] * 1e3:9.1f} "
              f"{r['step_time_ci95_s'] * 1e3:7.1f} {r['allreduce_s'] * 1e3:9.1f} "
              f"{r['allreduce_share']:6.1%} {r['images_per_sec']:8.1f} "
              f"{r['images_per_sec_per_rank']:7.1f} +- {r['images_per_sec_per_rank_ci95']:5.1f} "
              f"{'' if eff is None else f'{eff:6.1%}'}")


def append_json(path, records):
    old = json.load(open(path)) if os.path.exists(path) else []
    with atomic_open(path, "w") as f:
        json.dump(old + records, f, indent=1)


def run_scaling(args):
    """Launch one mpirun per rank count; add scaling efficiency against the fewest ranks."""
    from nnabla_torus.launching.mpirun_cmd import mpirun_command
    counts = args.scaling
    passed_on = ("arch", "width", "image_size", "classes", "batch", "iters", "warmup",
                 "bucket_mib", "overlap", "context", "type_config")
    inner = sum((["--" + name.replace("_", "-"), str(getattr(args, name))]
                 for name in passed_on), [])
    env = dict(os.environ, NNABLA_TORUS_BENCH_SCALING="", NNABLA_TORUS_BENCH_JSON="",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    records = []
    for n in counts:
        out = subprocess.run(mpirun_command(n, [os.path.abspath(__file__)] + inner), env=env,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RECORDS ")]
        if out.returncode != 0 or not lines:
            raise SystemExit(f"train_bench at {n} ranks failed (exit {out.returncode}):\n"
                             f"{out.stdout[-3000:]}")
        records += json.loads(lines[-1][len("RECORDS "):])
    for r in records:
        base = min((b for b in records if b["overlap"] == r["overlap"]),
                   key=lambda b: b["ranks"])
        r["scaling_efficiency"] = r["images_per_sec"] / (
            r["ranks"] / base["ranks"] * base["images_per_sec"])
    print(f"# train_bench scaling over {counts} ranks: {args.arch} x{args.width}, "
          f"{args.image_size} px, batch {args.batch}/rank")
    print_table(records)
    if args.json:
        append_json(args.json, records)


def main(argv=None):
    args = parse_args(argv)
    if args.scaling:
        run_scaling(args)
    else:
        run_ranks(args)


if __name__ == "__main__":
    main()
