"""The training graph and one optimizer step's gradients, all-reduced.

``build_graph`` is the loss nnabla differentiates (label smoothing, the 1 / accumulation
factor); ``train_step`` runs the micro-batches of one step, with the gradient all-reduce
overlapped with the last backward (``reducer``) or after it, and reads nothing from the
device before the all-reduce. Example::

    graph = build_graph(model, 32, 224, 0.1, accum_steps=2)
    loss, error, sync_s = train_step(stream, graph, plan, solvers, comm, grads, reducer, None)
"""
import time

import nnabla as nn
import nnabla.functions as F
from nnabla_torus.comm.backends import synchronize

import data


def build_graph(model, batch_size, image_size, label_smoothing, accum_steps, test=False):
    """Return (x, t, loss, objective, logits); objective = loss / accum_steps (what backward
    sees)."""
    x = nn.Variable((batch_size, 3, image_size, image_size))
    t = nn.Variable((batch_size, 1))
    logits = model(x, test=test)
    logits.persistent = True                 # read after forward(clear_no_need_grad=True)
    # Label smoothing: (1 - eps) * cross-entropy + eps * mean over classes of -log p.
    ce = F.softmax_cross_entropy(logits, t)
    if label_smoothing > 0:
        uniform = -F.mean(F.log_softmax(logits, axis=1), axis=1, keepdims=True)
        ce = (1.0 - label_smoothing) * ce + label_smoothing * uniform
    loss = F.mean(ce)
    loss.persistent = True
    objective = loss * (1.0 / accum_steps)   # accumulated micro-batch gradients average
    return x, t, loss, objective, logits


def train_step(stream, graph, plan, solvers, comm, grads, reducer, scaler):
    """One step's gradients over plan.accum_steps micro-batches; returns (loss, error, sync_s):
    the loss and top-1 error means and the seconds spent after the last backward in the
    gradient all-reduce (the part backward did not hide: ``reducer.wait_s`` with overlap).

    The gradients are all-reduced on return; with ``scaler`` (FP16) they are still multiplied
    by ``scaler.scale``: ``scaler.unscale(solvers)`` decides whether the update may run.
    """
    x, t, loss, objective, logits = graph
    sums = None                       # (loss, top-1 error) summed over micro-batches, on device
    solvers.zero_grad()
    for micro in range(plan.accum_steps):
        images, labels = stream.next_batch(plan.local_batch)
        data.feed(x, images)          # on a GPU: device to device, in the compute dtype
        # On a GPU, device to device too: ``t.d = labels`` left the upload for forward to make
        # at the loss, a synchronous cudaMemcpy that waits for the whole forward (ext
        # src/nbla/cuda/array/cuda_array.cpp ~161-177, ~212-236, v1.39.0).
        data.feed(t, labels)
        objective.forward(clear_no_need_grad=True)
        # Kept on the device and read once after the step: reading loss.d or logits.d here
        # would wait for the forward to finish before backward is even enqueued. A copy of the
        # loss: loss.data itself is the next micro-batch's forward's output.
        step = (F.identity(loss.data), F.mean(F.top_n_error(logits.data, t.data, axis=1, n=1)))
        sums = step if sums is None else tuple(F.add2(a, b) for a, b in zip(sums, step))
        reduce_now = reducer if micro == plan.accum_steps - 1 else None
        if scaler is not None:                                 # FP16: seeded with the scale
            scaler.backward(objective, reduce_now, clear_buffer=True)
        elif reduce_now is not None:
            reduce_now.backward(objective, clear_buffer=True)  # all-reduce overlaps backward
        else:
            objective.backward(clear_buffer=True)              # accumulate locally
    sync_s = 0.0 if reducer is None else reducer.wait_s
    if reducer is None:
        tic = time.perf_counter()
        comm.all_reduce(grads, division=True, inplace=False)
        sync_s = time.perf_counter() - tic
    both = F.concatenate(*(F.reshape(total, (1,)) for total in sums))
    loss, error = host_read(both, comm) / plan.accum_steps
    return float(loss), float(error), sync_s


def host_read(ndarray, comm):
    """A host copy of ``ndarray``: on a GPU the device-to-host copy waits for every kernel
    enqueued before it (a host sync), so a step reads once what it must know on the host
    (its loss and error here, the finiteness of its gradients in divergence.py). The wait is
    ``comm``'s, under its watchdog (a hung peer's NCCL ends the job); the copy holds the GIL."""
    synchronize(comm, "reading the step's loss and gradients")
    return ndarray.data.copy()
