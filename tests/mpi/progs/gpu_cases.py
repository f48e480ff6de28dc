"""What only a GPU run proves, as one program (under mpirun): the CPU suite runs it on the fake
NCCL (``NNABLA_TORUS_BACKEND=fake-nccl``), ``pytest -m gpu`` / ``make gpu-check`` on real NCCL
(``nccl``, cudnn context, one GPU per rank). Each case checks against a reference computed
without the path under test:

- ``overlap``: gradients averaged through nnabla's ``all_reduce_callback`` during backward
  (``BucketedAllReduce.backward``, native) equal one all-reduce after backward, fp32, at the
  default (pipelined) pack size and at 8 KiB packs (``SMALL_PACK_MIB``: several per backward);
- ``fp16``: the same in half precision (``type_config='half'``, float16 packs), against the
  float32 reference of the same inputs within float16's precision;
- ``norms``: the noise scale's squared norms taken on the device (``comm.track_sqnorms``)
  equal numpy's (1/p) sum_i |g_i|^2 and |(1/p) sum_i g_i|^2;
- ``sync-bn``: ``PF.sync_batch_normalization`` with the communicator (nnabla's kernel on
  NCCL) equals ``F.batch_normalization`` of the whole global batch on the CPU: outputs, input
  gradients, running statistics.

Every graph is built on the rank's own GPU, ``comm.local_rank`` (nnabla's callback casts each
gradient into the communicator's context, ext .cu ~1035-1036: a graph on GPU 0 would run every
rank's network there and pass through peer copies). The fake refuses another device; on real
GPUs each process must show on its own GPU only (``nvidia-smi --query-compute-apps``).

    mpirun -np 2 python tests/mpi/progs/gpu_cases.py overlap fp16 norms sync-bn

Prints "PASSED gpu_cases <case> rank r" per case and rank.
"""
import os
import subprocess
import sys

import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
from nnabla.ext_utils import get_extension_context

import nnabla_torus as C
from nnabla_torus.overlap import BucketedAllReduce, on_device
from tests.mpi.progs.check_overlap import build_unshared, norms_reference
from tests.mpirun import passed_line

ON_GPU = os.environ.get("NNABLA_TORUS_BACKEND") == "nccl"
# Small packs, so one backward fills several: nnabla's callback splits its 40 MiB of pack
# memory into buffers of one pack, each with a CUDA event (ext .cu 962-972), so the count is
# 40 MiB / pack bytes: 5,120 at 8 KiB (104-byte packs made 403,298 per backward). HIDDEN
# units make the gradients span packs at that size: 3 packs in float32 (one gradient larger
# than a pack, one flushed mid-backward, one of five gradients), 2 in float16.
SMALL_PACK_MIB = 8 / 1024
HIDDEN = 431


DEVICE = []   # this rank's GPU, comm.local_rank (set in main once the communicator is up)


def context(type_config):
    """A context of ``type_config`` on this rank's GPU (the fake's keeps the device too)."""
    ctx = get_extension_context("cudnn" if ON_GPU else "cpu", device_id=DEVICE[0],
                                type_config=type_config)
    assert ctx.device_id == DEVICE[0], (ctx, DEVICE)
    return ctx


def own_gpu_only(local_rank):
    """On real GPUs: AssertionError unless this process is on exactly one GPU, and on GPU
    ``local_rank`` when CUDA_VISIBLE_DEVICES does not renumber them."""
    query = ["nvidia-smi", "--format=csv,noheader"]
    gpus = dict(line.split(", ") for line in subprocess.run(
        query + ["--query-gpu=uuid,index"], capture_output=True, text=True,
        check=True).stdout.splitlines())
    apps = subprocess.run(query + ["--query-compute-apps=pid,gpu_uuid"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    mine = sorted({int(gpus[uuid]) for pid, uuid in (a.split(", ") for a in apps)
                   if int(pid) == os.getpid()})
    if not mine:   # in a container's PID namespace nvidia-smi lists the host's PIDs only
        print(f"gpu_cases: nvidia-smi lists no process {os.getpid()} (another PID namespace?): "
              f"GPU placement unchecked on rank with local rank {local_rank}", flush=True)
        return
    assert len(mine) == 1, f"process {os.getpid()} is on GPUs {mine}, not on one"
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        assert mine == [local_rank], f"local rank {local_rank} is on GPU {mine[0]}"


def reduced_grads(comm, ctx, bucket_mib=None, grad_bytes=4, dtype=np.float32):
    """{name: float64 gradient} averaged over ranks: after backward (``bucket_mib`` None) or
    by ``BucketedAllReduce.backward`` with packs of ``bucket_mib`` MiB (default: its own);
    ``dtype``: the type every reduced gradient must have."""
    with nn.context_scope(ctx):
        loss, params = build_unshared(comm.rank, HIDDEN)
        for v in params.values():
            v.grad.zero()
        loss.forward()
        if bucket_mib is None:
            loss.backward()
            comm.all_reduce([v.grad for v in params.values()], division=True)
        else:
            kwargs = {} if bucket_mib == "default" else {"bucket_mib": bucket_mib}
            reducer = BucketedAllReduce(comm, loss, params, grad_bytes=grad_bytes, **kwargs)
            elements = sum(v.size for v in params.values())
            assert bucket_mib == "default" or elements > 2 * reducer.pack_size, (
                elements, reducer.pack_size)       # the small packs: several per backward
            assert on_device(comm) == (comm.backend.name in ("nccl", "fake-nccl")), comm.algorithm
            reducer.backward(loss)
            reducer.close()
    got = {k: v.grad.data for k, v in params.items()}
    assert {g.dtype for g in got.values()} == {np.dtype(dtype)}, \
        {k: g.dtype for k, g in got.items()}
    return {k: g.astype(np.float64) for k, g in got.items()}


def case_overlap(comm):
    want = reduced_grads(comm, context("float"))
    for bucket_mib in ("default", SMALL_PACK_MIB):
        got = reduced_grads(comm, context("float"), bucket_mib)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{k}, bucket_mib={bucket_mib}")


def case_fp16(comm):
    """Through the half communicator ``--type-config half`` uses (a context of type_config
    half): float16 packs and sums (a float one would cast the gradients to float32, ext .cu
    1031-1036). The gradients stay float16; their sums are the float32 reference's within
    float16's precision."""
    want = reduced_grads(comm, context("float"))
    half = C.MultiProcessDataParallelCommunicator(context("half"))
    half.init()
    got = reduced_grads(half, context("half"), SMALL_PACK_MIB, grad_bytes=2, dtype=np.float16)
    assert ("float16", tuple(range(comm.size))) in half.backend.nccl_made, half.backend.nccl_made
    half.close()
    for k in want:   # float16 keeps ~3 decimal digits; these gradients are O(0.1)-O(1)
        scale = max(1.0, float(np.abs(want[k]).max()))
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=2e-2 * scale, err_msg=k)


def case_norms(comm):
    ctx = context("float")
    with nn.context_scope(ctx):
        loss, params = build_unshared(comm.rank, HIDDEN)
        want, _ = norms_reference(loss, params)
    reducer = BucketedAllReduce(comm, loss, params, bucket_mib=SMALL_PACK_MIB)
    comm.track_sqnorms = True
    comm.pop_sqnorms()
    with nn.context_scope(ctx):
        for v in params.values():
            v.grad.zero()
        loss.forward()
        reducer.backward(loss)
    got = comm.pop_sqnorms()
    comm.track_sqnorms = False
    reducer.close()
    np.testing.assert_allclose(got, want, rtol=2e-5)


def case_sync_bn(comm):
    """SyncBN over the world against nnabla's own BN of the concatenated batch on the CPU."""
    p, r = comm.size, comm.rank
    rng = np.random.RandomState(7)
    xs = rng.randn(p, 4, 3, 5, 6).astype(np.float32) * 2 + 1
    ws = rng.randn(p, 4, 3, 5, 6).astype(np.float32)
    cpu = get_extension_context("cpu")
    with nn.context_scope(cpu), nn.parameter_scope("reference"):
        x = nn.Variable.from_numpy_array(xs.reshape(p * 4, 3, 5, 6), need_grad=True)
        y = PF.batch_normalization(x, batch_stat=True)
        loss = F.sum(y * nn.Variable.from_numpy_array(ws.reshape(p * 4, 3, 5, 6)))
        loss.forward()
        x.grad.zero()
        loss.backward()
        ref = nn.get_parameters(grad_only=False)
        want = (y.d[r * 4:(r + 1) * 4].copy(), x.g[r * 4:(r + 1) * 4].copy(),
                ref["bn/mean"].d.copy(), ref["bn/var"].d.copy())
    with nn.context_scope(context("float")), nn.parameter_scope("sync"):
        x = nn.Variable.from_numpy_array(xs[r], need_grad=True)
        y = PF.sync_batch_normalization(x, comm, group="world", batch_stat=True)
        loss = F.sum(y * nn.Variable.from_numpy_array(ws[r]))
        loss.forward()
        x.grad.zero()
        loss.backward()
        got = nn.get_parameters(grad_only=False)
        np.testing.assert_allclose(y.d, want[0], rtol=1e-4, atol=1e-5, err_msg="output")
        np.testing.assert_allclose(x.g, want[1], rtol=1e-4, atol=1e-5, err_msg="input gradient")
        np.testing.assert_allclose(got["bn/mean"].d, want[2], rtol=1e-5, atol=1e-6,
                                   err_msg="running mean")
        np.testing.assert_allclose(got["bn/var"].d, want[3], rtol=1e-4, atol=1e-6,
                                   err_msg="running variance")


CASES = {"overlap": case_overlap, "fp16": case_fp16, "norms": case_norms,
         "sync-bn": case_sync_bn}


def main():
    comm = C.MultiProcessDataParallelCommunicator(
        get_extension_context("cudnn" if ON_GPU else "cpu", type_config="float"))
    comm.init()
    DEVICE.append(str(comm.local_rank))     # the GPU the communicator's buffers live on
    nn.set_default_context(context("float"))
    assert comm.algorithm == "native", comm.algorithm     # one host: the callback path
    for name in sys.argv[1:] or list(CASES):
        CASES[name](comm)
        print(passed_line(f"gpu_cases {name} rank {comm.rank}"), flush=True)
    if ON_GPU:
        own_gpu_only(comm.local_rank)
    comm.close()


if __name__ == "__main__":
    main()
