"""Loss scaling around the overlapped all-reduce equals nnabla's DynamicLossScalingUpdater (mpirun).

Three runs of the same BATCHES batches from the same initial parameters, fp32 on CPU (nnabla's
CPU build has no FP16 kernels; the control flow and the arithmetic of the scaling are the same):
  nnabla:  DynamicLossScalingUpdater with an averaging all_reduce after backward (reference);
  plain:   DynamicLossScaling, comm.all_reduce after backward;
  overlap: DynamicLossScaling around BucketedAllReduce (buckets all-reduced during backward).
Overflows: the initial scale 2**127 overflows float32 gradients until it has been halved enough
(and again whenever growth brings it back),
and at batch INJECT the last rank alone feeds an input holding inf, so only its gradients are
inf/NaN. Every rank must skip the same steps, halve the scale at the same time and grow it every
N good steps, exactly as the updater does; the parameters must be bitwise equal across ranks,
"plain" bitwise equal to the updater, "overlap" within RTOL (bucketing changes how the
all-reduce adds, not what). Prints the largest differences and OK on rank 0.
"""
import hashlib

import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
from mpi4py import MPI
from nnabla.experimental.mixed_precision_training import DynamicLossScalingUpdater
from nnabla.ext_utils import get_extension_context

import nnabla_torus as C
from nnabla_torus.loss_scaling import DynamicLossScaling
from nnabla_torus.overlap import BucketedAllReduce

BATCHES, INJECT, N, INITIAL_SCALE, DECAY, RTOL = 24, 13, 3, 2.0 ** 127, 1e-3, 1e-5


class AveragingComm:
    """The updater all-reduces with division=False; average instead, as BucketedAllReduce does."""

    def __init__(self, comm):
        self.comm = comm

    def all_reduce(self, data, division=False, inplace=False):
        self.comm.all_reduce(data, division=True, inplace=inplace)


def build(initial):
    """A conv, an odd-sized affine used twice and a head; parameters set to ``initial``."""
    nn.clear_parameters()
    x = nn.Variable((5, 2, 7, 7))
    t = nn.Variable((5, 1))
    with nn.parameter_scope("conv"):
        h = F.relu(PF.convolution(x, 3, (3, 3)))
    with nn.parameter_scope("pre"):
        h = F.tanh(PF.affine(h, 11))
    for _ in range(2):
        with nn.parameter_scope("shared"):
            h = F.tanh(PF.affine(h, 11))
    with nn.parameter_scope("head"):
        y = PF.affine(h, 4)
    loss = F.sum(F.softmax_cross_entropy(y, t))       # summed: gradients of order 1
    params = nn.get_parameters()
    if initial is not None:
        for name, value in initial.items():
            params[name].d = value
    return x, t, loss, params


class Feeder:
    """Batch i of this rank: seeded by (rank, i); the last rank's batch INJECT holds an inf."""

    def __init__(self, x, t, rank, size):
        self.x, self.t, self.rank, self.size, self.fed = x, t, rank, size, 0

    def __call__(self):
        rng = np.random.default_rng([self.rank, self.fed])
        images = rng.standard_normal(self.x.shape).astype(np.float32)
        if self.fed == INJECT and self.rank == self.size - 1:
            images[1, 0, 3, 3] = np.inf
        self.x.d = images
        self.t.d = rng.integers(0, 4, self.t.shape)
        self.fed += 1


def run(comm, mode, initial, batches=BATCHES):
    """Return (parameters, loss scale of every batch) after ``batches`` batches (the updater:
    at least BATCHES, more if the last one overflowed: it retries until an update succeeds)."""
    x, t, loss, params = build(initial)
    solver = S.Momentum(0.05, 0.9)
    solver.set_parameters(params)
    feed = Feeder(x, t, comm.rank, comm.size)
    scales = []
    if mode == "nnabla":
        updater = DynamicLossScalingUpdater(
            solver, loss, scale=INITIAL_SCALE, N=N, weight_decay=DECAY,
            comm=AveragingComm(comm), grads=[v.grad for v in params.values()])

        def feed_and_record():
            scales.append(updater.scale)        # the scale this batch's backward is seeded with
            feed()
        updater.data_feeder = feed_and_record
        while feed.fed < BATCHES:               # an overflow retries on the next batch inside
            updater.update()
        return {k: v.d.copy() for k, v in params.items()}, scales
    scaler = DynamicLossScaling(scale=INITIAL_SCALE, N=N)
    reducer = BucketedAllReduce(comm, loss, params, bucket_mib=1e-4) \
        if mode == "overlap" else None                     # one or two parameters per bucket
    for _ in range(batches):
        solver.zero_grad()
        scales.append(scaler.scale)
        feed()
        loss.forward(clear_no_need_grad=True)
        scaler.backward(loss, reducer, clear_buffer=True)
        if reducer is None:
            comm.all_reduce([v.grad for v in params.values()], division=True, inplace=False)
        if scaler.unscale(solver):
            solver.weight_decay(DECAY)
            solver.update()
    if reducer is not None:
        reducer.close()
    return {k: v.d.copy() for k, v in params.items()}, scales


def check_ranks_agree(result, scales, mode):
    digest = hashlib.sha256(b"".join(result[k].tobytes() for k in sorted(result)) +
                            np.array(scales).tobytes()).hexdigest()
    digests = MPI.COMM_WORLD.allgather(digest)
    assert len(set(digests)) == 1, f"{mode}: parameters or scales differ across ranks: {digests}"


def main():
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    nn.seed(3)
    _, _, _, params = build(None)
    initial = {k: v.d.copy() for k, v in params.items()}
    reference, ref_scales = run(comm, "nnabla", initial)
    check_ranks_agree(reference, ref_scales, "nnabla")
    # Natural overflows near 2**128 and the injected inf each halve the scale; growth doubles it.
    changes = np.diff(np.log2(ref_scales))
    assert ref_scales[INJECT + 1] == ref_scales[INJECT] / 2, ref_scales
    assert set(changes) == {-1, 0, 1} and (changes == -1).sum() >= 2, ref_scales
    assert all(np.isfinite(v).all() for v in reference.values())
    for mode in ("plain", "overlap"):
        result, scales = run(comm, mode, initial, len(ref_scales))
        check_ranks_agree(result, scales, mode)
        assert scales == ref_scales, (mode, scales, ref_scales)
        worst_abs = max(np.abs(result[k] - reference[k]).max() for k in reference)
        worst_rel = max((np.abs(result[k] - reference[k]) /
                         np.maximum(np.abs(reference[k]), 1e-30)).max() for k in reference)
        for name in reference:
            assert not np.allclose(reference[name], initial[name]), name
            if mode == "plain":
                np.testing.assert_array_equal(result[name], reference[name], err_msg=name)
            else:
                np.testing.assert_allclose(result[name], reference[name], rtol=RTOL, atol=1e-7,
                                           err_msg=f"{mode} {name}")
        if comm.rank == 0:
            skipped = sum(1 for a, b in zip(scales, scales[1:]) if b < a)
            print(f"{comm.size} ranks {mode}: {len(scales)} batches, {skipped} skipped, scales "
                  f"log2 {[int(np.log2(s)) for s in scales]}; vs updater: max abs diff "
                  f"{worst_abs:.3g}, max rel diff {worst_rel:.3g}")
    if comm.rank == 0:
        print("OK")


if __name__ == "__main__":
    main()
