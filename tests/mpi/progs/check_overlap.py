"""Bucketed all-reduce during backward equals one all-reduce after backward (run under mpirun).

The network shares one weight between two layers (two uses: its bucket must wait for both),
has a conv, an affine and a parameter the loss never reads; bucket sizes from tiny (one
parameter per bucket) to huge (one bucket); all-reduce in the hook and on the communication
thread. Prints "PASSED check_overlap" on rank 0.
"""
import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context
from nnabla.parameter import get_parameter_or_create

import nnabla_torus as C
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


def gradients(comm, bucket_mib, threaded=False):
    loss, params = build(comm.rank)
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


def main():
    ctx = get_extension_context("cpu")
    nn.set_default_context(ctx)
    comm = C.MultiProcessDataParallelCommunicator(ctx)
    comm.init()
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
