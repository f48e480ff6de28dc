"""GIL benchmark: backward with the threaded bucketed all-reduce at several switch intervals.

On host backends the communication thread runs Python (pack/unpack, polling) while backward's
``function_post_hook`` needs the GIL once per function (ResNet-50 with fused batch
normalization: 111 calls per backward, 107 of them on functions that read a parameter, so
filtering in the hook saves no GIL acquisition). If the thread held the GIL, each hook could
wait up to ``sys.getswitchinterval()`` (5 ms by default); a shorter interval would then shorten
the step. This times ``BucketedAllReduce.backward`` (backward + every bucket's all-reduce) with
each interval in turn, step by step, and prints the median and quartiles per interval on rank 0.
Usage (2 ranks, the example's ResNet-50 at width 0.25, 32 px)::

    mpirun -np 2 python tools/research/gil_bench.py --iters 20 --intervals 5,1,0.1
"""
import argparse
import sys
import time

import numpy as np

import _tools  # noqa: F401  (tools/ on sys.path, for _example)
import _example  # noqa: F401  (examples/imagenet on sys.path, for its models)
import nnabla as nn
from nnabla.ext_utils import get_extension_context

import nnabla_torus as C
from nnabla_torus.knobs import add_knob, number
from nnabla_torus.overlap import BucketedAllReduce


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_knob(parser, "--width", env="NNABLA_TORUS_BENCH_WIDTH", default=0.25,
             type=number(float, low=0, strict=True), help="ResNet-50 channel width multiplier")
    add_knob(parser, "--image-size", env="NNABLA_TORUS_BENCH_IMAGE_SIZE", default=32,
             type=number(int, low=1), help="input side, pixels")
    add_knob(parser, "--batch", env="NNABLA_TORUS_BENCH_BATCH", default=4,
             type=number(int, low=1), help="images per rank")
    add_knob(parser, "--iters", env="NNABLA_TORUS_BENCH_ITERS", default=20,
             type=number(int, low=1), help="timed backwards per interval (after 2 untimed)")
    add_knob(parser, "--bucket-mib", env="NNABLA_TORUS_BUCKET_MIB", default=0.25,
             type=number(float, low=0, strict=True),
             help="bucket size, MiB (0.25: ~31 buckets at width 0.25)")
    add_knob(parser, "--intervals", env="NNABLA_TORUS_BENCH_SWITCH_INTERVALS", default="5,1,0.1",
             help="sys.setswitchinterval values to compare, milliseconds, comma-separated")
    return parser


def main(argv=None):
    import train
    from models import get_model
    args = build_parser().parse_args(argv)
    intervals = [float(v) * 1e-3 for v in args.intervals.split(",")]
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    x, t, _, objective, _ = train.build_graph(get_model("resnet50", 1000, args.width),
                                              args.batch, args.image_size, 0.0, 1)
    x.d = np.random.RandomState(comm.rank).rand(*x.shape)
    t.d = 1
    reducer = BucketedAllReduce(comm, objective, nn.get_parameters(), bucket_mib=args.bucket_mib)
    times = {s: [] for s in intervals}
    default = sys.getswitchinterval()
    try:
        for it in range(args.iters + 2):
            for s in intervals:                  # interleaved: load drifts hit every interval
                sys.setswitchinterval(s)
                objective.forward(clear_no_need_grad=True)
                comm.barrier()
                start = time.perf_counter()
                reducer.backward(objective, clear_buffer=True)
                if it >= 2:
                    times[s].append(time.perf_counter() - start)
    finally:
        sys.setswitchinterval(default)
        reducer.close()
        comm.close()
    if comm.rank == 0:
        print(f"# {comm.size} ranks, ResNet-50 x{args.width}, {args.image_size} px, batch "
              f"{args.batch}, {len(reducer.buckets)} buckets")
        for s, v in times.items():
            q1, med, q3 = np.percentile(np.array(v) * 1e3, [25, 50, 75])
            print(f"switch interval {s * 1e3:g} ms: backward + all-reduce median {med:.1f} ms "
                  f"(quartiles {q1:.1f}-{q3:.1f}, n={len(v)})")


if __name__ == "__main__":
    main()
