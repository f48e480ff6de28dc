"""Loss scaling around the overlapped all-reduce equals nnabla's DynamicLossScalingUpdater (mpirun).

Three runs of the same batches from the same initial parameters, fp32 on CPU (nnabla's CPU
build has no FP16 kernels; the control flow and the arithmetic of the scaling are the same):
  nnabla:  DynamicLossScalingUpdater with an averaging all_reduce after backward (reference);
  plain:   DynamicLossScaling, comm.all_reduce after backward;
  overlap: DynamicLossScaling around BucketedAllReduce (buckets all-reduced during backward).
Two scenarios: "natural": the initial scale 2**127 overflows float32 gradients (or their sum
over ranks) until halved enough, and again whenever growth brings it back; "injected": from
scale 8, far from any overflow, the last rank alone feeds an input holding inf at batch INJECT,
so only its gradients are inf/NaN: that step, and only that one, must be skipped on every rank.
Every rank must skip the same steps, halve the scale at the same time and grow it after N good
steps, exactly as the updater does; the parameters must be bitwise equal across ranks, "plain"
bitwise equal to the updater, "overlap" within RTOL (bucketing may change the order in which
the all-reduce adds). Prints the scales and the largest differences, and
"PASSED check_loss_scaling", on rank 0.
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
from tests.mpirun import passed_line

BATCHES, INJECT, N, DECAY, RTOL = 24, 13, 3, 1e-3, 1e-5
SCENARIOS = {"natural": (2.0 ** 127, None), "injected": (8.0, INJECT)}   # (initial scale, inject)


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
    """Batch i of this rank: seeded by (rank, i); the last rank's batch ``inject`` holds an inf."""

    def __init__(self, x, t, rank, size, inject):
        self.x, self.t, self.rank, self.size, self.inject, self.fed = x, t, rank, size, inject, 0

    def __call__(self):
        rng = np.random.default_rng([self.rank, self.fed])
        images = rng.standard_normal(self.x.shape).astype(np.float32)
        if self.fed == self.inject and self.rank == self.size - 1:
            images[1, 0, 3, 3] = np.inf
        self.x.d = images
        self.t.d = rng.integers(0, 4, self.t.shape)
        self.fed += 1


def run(comm, mode, initial, scale, inject, batches=BATCHES):
    """Return (parameters, loss scale of every batch) after ``batches`` batches (the updater:
    at least BATCHES, more if the last one overflowed: it retries until an update succeeds)."""
    x, t, loss, params = build(initial)
    solver = S.Momentum(0.05, 0.9)
    solver.set_parameters(params)
    feed = Feeder(x, t, comm.rank, comm.size, inject)
    scales = []
    if mode == "nnabla":
        updater = DynamicLossScalingUpdater(
            solver, loss, scale=scale, N=N, weight_decay=DECAY,
            comm=AveragingComm(comm), grads=[v.grad for v in params.values()])

        def feed_and_record():
            scales.append(updater.scale)        # the scale this batch's backward is seeded with
            feed()
        updater.data_feeder = feed_and_record
        while feed.fed < BATCHES:               # an overflow retries on the next batch inside
            updater.update()
        return {k: v.d.copy() for k, v in params.items()}, scales
    scaler = DynamicLossScaling(scale=scale, N=N)
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
    for scenario, (scale, inject) in SCENARIOS.items():
        reference, ref_scales = run(comm, "nnabla", initial, scale, inject)
        check_ranks_agree(reference, ref_scales, "nnabla")
        assert all(np.isfinite(v).all() for v in reference.values())
        changes = np.diff(np.log2(ref_scales))                # -1: skipped, +1: grown
        if inject is None:
            assert set(changes) == {-1, 0, 1} and (changes == -1).sum() >= 2, ref_scales
        else:
            assert np.flatnonzero(changes == -1).tolist() == [inject], ref_scales
            assert (changes == 1).sum() >= 2, ref_scales
        for mode in ("plain", "overlap"):
            result, scales = run(comm, mode, initial, scale, inject, len(ref_scales))
            check_ranks_agree(result, scales, mode)
            assert scales == ref_scales, (mode, scales, ref_scales)
            for name in reference:
                assert not np.allclose(reference[name], initial[name]), name
                if mode == "plain":
                    np.testing.assert_array_equal(result[name], reference[name], err_msg=name)
                else:
                    np.testing.assert_allclose(result[name], reference[name], rtol=RTOL,
                                               atol=1e-7, err_msg=f"{mode} {name}")
            if comm.rank == 0:
                worst = max(np.abs(result[k] - reference[k]).max() for k in reference)
                relative = max((np.abs(result[k] - reference[k]) /
                                np.maximum(np.abs(reference[k]), 1e-30)).max() for k in reference)
                print(f"{comm.size} ranks {scenario} {mode}: {len(scales)} batches, "
                      f"{int((np.diff(np.log2(scales)) == -1).sum())} skipped, log2 scales "
                      f"{[int(np.log2(s)) for s in scales]}; vs updater: max abs diff "
                      f"{worst:.3g}, max rel diff {relative:.3g}")
    if comm.rank == 0:
        print(passed_line("check_loss_scaling"))


if __name__ == "__main__":
    main()
