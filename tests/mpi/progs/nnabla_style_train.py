"""A small data-parallel training script written the way nnabla-examples write theirs, with
one line changed: ``import nnabla_torus as C`` (was ``import nnabla.communicators as C``).

    mpirun -np 4 python nnabla_style_train.py --batch-size 4 --out /tmp/run4
    python nnabla_style_train.py --batch-size 16 --out /tmp/run1   # one process, same data

What it uses, as nnabla-examples do (utils/neu/comm.py's CommunicatorWrapper,
image-classification/imagenet/train.py): ``C.MultiProcessCommunicator(ctx)`` + ``init()``,
``rank``/``size``/``local_rank``, a bcast of the initial parameters from rank 0,
``PF.sync_batch_normalization(h, comm, group="world")``, an ``all_reduce_callback`` passed to
``loss.backward(communicator_callbacks=...)`` (None on one process, as CommunicatorWrapper
does), an all_reduce of the loss for the log, ``barrier`` and ``nn.save_parameters`` on every
rank (``params_rank<r>.h5``). Data: a fixed synthetic set; global step s uses samples
``[s * B, (s + 1) * B)`` with B = batch size x ranks, rank r its r-th share, so one process
with batch B sees the same global batches.
"""
import argparse
import os

import numpy as np

import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import nnabla.solvers as S
import nnabla_torus as C   # was: import nnabla.communicators as C
from nnabla.ext_utils import get_extension_context


class CommunicatorWrapper:
    """As nnabla-examples' utils/neu/comm.py: the communicator, or one process without it."""

    def __init__(self, ctx):
        self.comm = C.MultiProcessCommunicator(ctx)
        self.comm.init()
        self.n_procs, self.rank = self.comm.size, self.comm.rank
        self.local_rank = self.comm.local_rank
        ctx.device_id = str(self.local_rank)
        self.ctx = ctx

    def all_reduce(self, params, division, inplace):
        if self.n_procs > 1:
            self.comm.all_reduce(params, division=division, inplace=inplace)

    def get_all_reduce_callback(self, packing_size=2 << 20):
        if self.n_procs == 1:
            return None
        grads = [x.grad for x in nn.get_parameters().values()]
        return self.comm.all_reduce_callback(grads, packing_size, division=True)


def network(x, comm):
    h = PF.convolution(x, 8, (3, 3), pad=(1, 1), with_bias=False, name="conv1")
    h = F.relu(PF.sync_batch_normalization(h, comm, group="world", name="bn1"))
    h = PF.convolution(h, 8, (3, 3), pad=(1, 1), with_bias=False, name="conv2")
    h = F.relu(PF.sync_batch_normalization(h, comm, group="world", axes=[1], name="bn2"))
    h = F.average_pooling(h, (8, 8))
    # an auxiliary head the loss never reaches: its gradients stay zeroing on every rank
    PF.affine(h, 3, name="aux")
    return PF.affine(h, 10, name="fc")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    ctx = get_extension_context("cpu", type_config="float")
    comm = CommunicatorWrapper(ctx)
    nn.set_default_context(comm.ctx)
    np.random.seed(100 + comm.rank)   # different initial weights per rank: bcast fixes them

    rng = np.random.RandomState(0)
    global_batch = args.batch_size * comm.n_procs
    images = rng.randn(global_batch * args.iterations, 3, 8, 8).astype(np.float32)
    labels = rng.randint(0, 10, size=(global_batch * args.iterations, 1))

    x = nn.Variable((args.batch_size, 3, 8, 8))
    t = nn.Variable((args.batch_size, 1))
    loss = F.mean(F.softmax_cross_entropy(network(x, comm.comm), t))
    params = nn.get_parameters()
    comm.comm.bcast([p.data for p in params.values()], 0)
    solver = S.Momentum(lr=0.1, momentum=0.9)
    solver.set_parameters(params)
    callback = comm.get_all_reduce_callback()

    for step in range(args.iterations):
        start = step * global_batch + comm.rank * args.batch_size
        x.d = images[start:start + args.batch_size]
        t.d = labels[start:start + args.batch_size]
        solver.zero_grad()
        loss.forward(clear_no_need_grad=True)
        loss.backward(clear_buffer=True, communicator_callbacks=callback)
        solver.weight_decay(1e-2)
        solver.update()
        reported = nn.NdArray.from_numpy_array(np.array([loss.d], np.float32))
        comm.all_reduce(reported, division=True, inplace=False)
        if comm.rank == 0:
            print(f"step {step} loss {float(reported.data[0]):.6f}", flush=True)
    comm.comm.barrier()
    os.makedirs(args.out, exist_ok=True)
    nn.save_parameters(os.path.join(args.out, f"params_rank{comm.rank}.h5"))
    comm.comm.barrier()
    if comm.rank == 0:
        print(f"PASSED nnabla_style_train on {comm.n_procs} ranks", flush=True)


if __name__ == "__main__":
    main()
