"""Bucketed all-reduce during backward equals one all-reduce after backward (run under mpirun).

The network shares one weight between two layers (two uses: its bucket must wait for both),
has a conv, an affine and a parameter the loss never reads; bucket sizes from tiny (one
parameter per bucket) to huge (one bucket); all-reduce in the hook and on the communication
thread. Prints "PASSED check_overlap" on rank 0.
"""
import sys

import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context
from nnabla.parameter import get_parameter_or_create

import nnabla_torus as C
from nnabla_torus.loss_scaling import DynamicLossScaling
from nnabla_torus.overlap import BucketedAllReduce
from tests.mpirun import passed_line


class CountingComm:
    """Forward to ``comm``; count all_reduce calls."""

    def __init__(self, comm):
        self.comm, self.calls = comm, 0

    def all_reduce(self, data, **kwargs):
        self.calls += 1
        self.comm.all_reduce(data, **kwargs)


def build(rank):
    nn.clear_parameters()
    rng = np.random.RandomState(0)                       # same initial parameters on every rank
    x = nn.Variable.from_numpy_array(rng.randint(-2, 3, (4, 2, 6, 6)).astype(np.float32) + rank)
    with nn.parameter_scope("conv"):
        h = F.relu(PF.convolution(x, 3, (3, 3), rng=rng))
    with nn.parameter_scope("pre"):
        h = PF.affine(h, 8, rng=rng)
    for _ in range(2):                                   # same W and b twice: two uses each
        with nn.parameter_scope("shared"):
            h = F.tanh(PF.affine(h, 8, rng=rng))
    with nn.parameter_scope("head"):
        y = PF.affine(h, 3, rng=rng)
    with nn.parameter_scope("unused"):
        get_parameter_or_create("w", (5,), need_grad=True)
    return F.mean(y ** 2), nn.get_parameters()


def gradients(comm, bucket_mib, threaded=False, builder=None):
    loss, params = (builder or build)(comm.rank)
    for p in params.values():
        p.grad.zero()
    loss.forward()
    if bucket_mib is None:
        loss.backward()
        comm.all_reduce([p.grad for p in params.values()], division=True, inplace=False)
        return {k: p.g.copy() for k, p in params.items()}, None
    counting = CountingComm(comm)
    reducer = BucketedAllReduce(counting, loss, params, bucket_mib=bucket_mib, threaded=threaded)
    reducer.reset()
    loss.backward(function_post_hook=reducer.hook)
    during = sum(reducer.done)                           # buckets started inside backward
    reducer.flush()
    assert counting.calls == len(reducer.buckets), (counting.calls, len(reducer.buckets))
    return {k: p.g.copy() for k, p in params.items()}, (during, len(reducer.buckets))


def device_streams(comm):
    """fake-nccl, algorithm native: BucketedAllReduce.backward all-reduces during backward on
    non-blocking streams only (nnabla's all_reduce_callback), several packs, no host sync, and
    the same gradients as one all-reduce after backward. A graph that reads a parameter twice
    is reduced after backward: the fake unpacks each pack at once (the earliest schedule),
    which lost the later use's contribution through nnabla's callback."""
    from nnabla_torus.testing import fake_nccl
    assert comm.algorithm == "native", comm.algorithm
    shared_reference, _ = gradients(comm, None)
    loss, params = build(comm.rank)
    loss.forward()
    fake_nccl.stream_log.clear()
    shared = BucketedAllReduce(comm, loss, params, bucket_mib=1e-4)
    shared.backward(loss)
    shared.close()
    assert not [e for e in fake_nccl.stream_log if e[0] == "non-blocking"], fake_nccl.stream_log
    for name in shared_reference:
        np.testing.assert_allclose(params[name].g, shared_reference[name], rtol=1e-6,
                                   atol=1e-7, err_msg=f"{name} shared")
    reference, _ = gradients(comm, None, builder=build_unshared)
    loss, params = build_unshared(comm.rank)
    for p in params.values():
        p.grad.zero()
    loss.forward()
    reducer = BucketedAllReduce(comm, loss, params, bucket_mib=1e-4)   # ~26 elements a pack
    fake_nccl.synchronize()
    fake_nccl.stream_log.clear()
    checks = fake_nccl.FakeAllReduceCallback.host_checks
    reducer.backward(loss)
    # nnabla's callback: one blocking 1-byte MPI_Allreduce per gradient use (ext .cu 1025-1030)
    checks = fake_nccl.FakeAllReduceCallback.host_checks - checks
    assert checks == sum(reducer.uses.values()) == len(params), (checks, reducer.uses)
    log = list(fake_nccl.stream_log)
    packs = [e for e in log if e[0] != "host-sync"]
    syncs = [e for e in log if e[0] == "host-sync"]
    assert len(packs) >= 3 and all(e[:2] == ("non-blocking", "all_reduce_callback")
                                   for e in packs), log
    assert not syncs, log            # none per pack, none at the end (ext .cu 1101-1113)
    for name in reference:
        np.testing.assert_allclose(params[name].g, reference[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    # FP16's path: backward seeded with the loss scale through the same callback.
    for p in params.values():
        p.grad.zero()
    loss.forward()
    DynamicLossScaling(scale=8.0).backward(loss, reducer)
    for name in reference:
        np.testing.assert_allclose(params[name].g, 8 * reference[name], rtol=1e-6, atol=8e-7,
                                   err_msg=f"{name} loss-scaled")
    # The algorithm switched away from native (as --algorithm auto may): one fused torus call
    # after backward, not a pair of compute-stream collectives per bucket.
    comm.set_algorithm("torus2d")
    for p in params.values():
        p.grad.zero()
    loss.forward()
    fake_nccl.stream_log.clear()
    reducer.backward(loss)
    calls = [e[1] for e in fake_nccl.stream_log if e[0] != "host-sync"
             and not e[1].startswith("F.")]
    assert calls == ["reduce_scatter", "all_gather"], fake_nccl.stream_log
    for name in reference:
        np.testing.assert_allclose(params[name].g, reference[name], rtol=1e-6, atol=1e-7,
                                   err_msg=f"{name} torus2d")
    reducer.close()
    if comm.rank == 0:
        print(f"device streams: {len(packs)} packs on non-blocking streams, no host sync; "
              f"{checks} blocking 1-byte MPI checks ({len(params)} gradients)")
        print(passed_line("check_overlap"))


def build_unshared(rank, hidden=17):
    """A conv, a batch norm and affines of odd sizes (``hidden`` units between them), each
    parameter read once (as in ResNet-50); every rank its own input."""
    nn.clear_parameters()
    rng = np.random.RandomState(1)
    x = nn.Variable.from_numpy_array(
        np.random.RandomState(100 + rank).randn(3, 2, 5, 7).astype(np.float32))
    with nn.parameter_scope("conv"):
        h = PF.batch_normalization(PF.convolution(x, 3, (3, 3), rng=rng), batch_stat=True)
    with nn.parameter_scope("mid"):
        h = F.tanh(PF.affine(F.relu(h), hidden, rng=rng))
    with nn.parameter_scope("head"):
        y = PF.affine(h, 5, rng=rng)
    return F.mean((y - 0.3) ** 2), nn.get_parameters()


def norms_reference(loss, params):
    """((1/p) sum_i |g_i|^2, |(1/p) sum_i g_i|^2) of the ranks' local gradients of ``loss``
    (numpy, float64), and {name: mean gradient}."""
    from mpi4py import MPI
    for v in params.values():
        v.grad.zero()
    loss.forward()
    loss.backward()
    local = {k: v.g.astype(np.float64) for k, v in params.items()}
    every = MPI.COMM_WORLD.allgather(local)
    p = len(every)
    mean = {k: sum(r[k] for r in every) / p for k in local}
    return (sum(float((r[k] ** 2).sum()) for r in every for k in r) / p,
            sum(float((m ** 2).sum()) for m in mean.values())), mean


def device_norms(comm):
    """fake-nccl, algorithm native, noise scale tracked: BucketedAllReduce.backward still runs
    nnabla's all_reduce_callback during backward (non-blocking packs, no host sync during
    backward), each gradient's squared norm is a compute-stream kernel logged before the pack
    that holds it (the fake unpacks each pack at once, so a later read would see the reduced
    value), and pop_sqnorms() equals numpy's (1/p) sum_i |g_i|^2 and |(1/p) sum_i g_i|^2 of the
    ranks' local gradients. The old code took the host path instead: one legacy-default
    all_reduce after backward and a host sync."""
    from nnabla_torus.testing import fake_nccl
    assert comm.algorithm == "native", comm.algorithm
    p = comm.size
    loss, params = build_unshared(comm.rank)
    (want_local, want_global), mean = norms_reference(loss, params)

    reducer = BucketedAllReduce(comm, loss, params, bucket_mib=1e-4)   # ~26 elements a pack
    comm.track_sqnorms = True
    assert comm.pop_sqnorms() == (0.0, 0.0)
    for step in range(2):                       # the second pop starts from zero again
        for v in params.values():
            v.grad.zero()
        loss.forward()
        fake_nccl.synchronize()
        fake_nccl.stream_log.clear()
        reducer.backward(loss)
        log = list(fake_nccl.stream_log)
        packs = [i for i, e in enumerate(log) if e[0] == "non-blocking"]
        assert len(packs) >= 3, log
        assert not [e for e in log if e[0] == "host-sync"], log    # none during backward
        assert all(e[0] == "non-blocking" or e[1].startswith("F.") for e in log), log
        for i in packs:
            for address in log[i][2]:
                first = [j for j, e in enumerate(log) if e[1] == "F.pow_scalar"
                         and address in e[2]]
                assert first and first[0] < i, (i, address, log)
        got_local, got_global = comm.pop_sqnorms()
        np.testing.assert_allclose([got_local, got_global], [want_local, want_global],
                                   rtol=2e-5, err_msg=f"step {step}")
        for k in mean:
            np.testing.assert_allclose(params[k].g, mean[k], rtol=1e-5, atol=1e-7, err_msg=k)
    comm.track_sqnorms = False
    reducer.close()
    if comm.rank == 0:
        print(f"device norms on {p} ranks: {len(packs)} packs, local {got_local:.6g} (numpy "
              f"{want_local:.6g}), global {got_global:.6g} (numpy {want_global:.6g})")
        print(passed_line("check_overlap"))


def main():
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
    if sys.argv[1:] == ["device-streams"]:
        return device_streams(comm)
    if sys.argv[1:] == ["device-norms"]:
        return device_norms(comm)
    reference, _ = gradients(comm, None)
    assert np.abs(reference["shared/affine/W"]).sum() > 0
    for bucket_mib, threaded in [(1e-6, False), (1e-3, False), (100.0, False), (1e-6, True),
                                 (1e-3, True)]:
        grads, (during, total) = gradients(comm, bucket_mib, threaded)
        # every bucket but the one holding the never-read parameter is reduced during backward
        assert during == total - 1, (bucket_mib, during, total)
        for name in reference:
            np.testing.assert_allclose(grads[name], reference[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name} bucket_mib={bucket_mib}")
        if comm.rank == 0:
            print(f"bucket_mib={bucket_mib} threaded={threaded}: {total} buckets, {during} "
                  f"started during backward")
    if comm.rank == 0:
        print(passed_line("check_overlap"))


if __name__ == "__main__":
    main()
