"""Noise scale of linear regression with a known gradient covariance, fed by the all-reduce.

Loss 0.5 (x.w - y)^2 with x ~ N(0, I_d), y = x.w* + e, e ~ N(0, s^2), evaluated at a fixed w
with d = w - w*. Per-sample gradient g = x (x.d - e): G = d, tr(S) = (d+1)|d|^2 + d s^2
(Gaussian fourth moments), so B_simple = (dim + 1) + dim s^2 / |d|^2. Each rank draws its own
batch; the estimator gets |G_b|^2 (mean over ranks) and |G_B|^2 from the communicator's
sqnorm feed. Prints "B_SIMPLE estimate truth" on rank 0 and "PASSED noise_scale_linreg" when
within --tolerance.

    mpirun -np 4 python tests/mpi/progs/noise_scale_linreg.py --steps 1000
"""
import argparse
import sys

import numpy as np

from nnabla_torus.planning.noise_scale import NoiseScaleEstimator
from tests.mpirun import passed_line


def make_feed():
    """(rank, size, feed) where feed(grad) -> (local_mean_sqnorm, global_sqnorm).

    The gradient goes through nnabla-torus's all-reduce with ``track_sqnorms`` on, as in
    training: the sqnorm costs one extra float in the fused buffer.
    """
    import nnabla as nn
    from nnabla.ext_utils import get_extension_context

    import nnabla_torus
    comm = nnabla_torus.MultiProcessDataParallelCommunicator(get_extension_context("cpu"))
    comm.init()
    comm.track_sqnorms = True

    def feed(grad):
        comm.all_reduce([nn.NdArray.from_numpy_array(grad.astype(np.float32))], division=True)
        return comm.pop_sqnorms()
    return comm.rank, comm.size, feed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--noise", type=float, default=1.0, help="label noise std s")
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch b")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--smoothing", type=float, default=0.995)
    parser.add_argument("--tolerance", type=float, default=0.15)
    args = parser.parse_args()
    rank, size, feed = make_feed()
    rng = np.random.default_rng(1000 + rank)
    delta = np.random.default_rng(7).normal(size=args.dim)
    delta /= np.linalg.norm(delta)                  # |d|^2 = 1
    truth = args.dim + 1 + args.dim * args.noise ** 2
    est = NoiseScaleEstimator(args.smoothing)
    for _ in range(args.steps):
        x = rng.normal(size=(args.batch, args.dim))
        e = rng.normal(scale=args.noise, size=args.batch)
        grad = x.T @ (x @ delta - e) / args.batch
        local, global_ = feed(grad)
        est.update(local, args.batch, global_, args.batch * size)
    error = abs(est.b_simple - truth) / truth
    if rank == 0:
        print(f"B_SIMPLE {est.b_simple:.2f} {truth:.2f} ranks={size} error={error:.3f}")
        print(passed_line("noise_scale_linreg") if error <= args.tolerance else "FAIL")
    return 0 if error <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
