"""All-reduce gradients in buckets while backward is still running.

nnabla's ``backward(communicator_callbacks=...)`` accepts only its own C++ communicators, so
this uses ``function_post_hook``: when every parameter of a bucket has received all its
gradient contributions, the bucket is all-reduced (averaged over ranks) while backward
continues with earlier layers, on a communication thread by default (nnabla releases the GIL
in backward). On the NCCL backend with ``native`` backward gets nnabla's own
``all_reduce_callback`` instead. The result equals ``comm.all_reduce(all_grads,
division=True)`` after backward. How the hook counts, threads and the NCCL path:
docs/communicator.md#overlap-with-backward. Example::

    reducer = BucketedAllReduce(comm, loss, nn.get_parameters(), bucket_mib=25)
    solver.zero_grad()
    loss.forward(clear_no_need_grad=True)
    reducer.backward(loss, clear_buffer=True)   # gradients are averaged over ranks on return
    solver.update()
    reducer.close()                             # ends the communication thread

With gradient accumulation only the last micro-batch's backward goes through the reducer; FP16:
``nnabla_torus.loss_scaling``.
"""
import queue
import threading
import time


def overlaps_backward(comm):
    """Whether ``comm``'s gradient all-reduce can run while backward computes: True for host
    backends and communicators without a backend; on the NCCL backend only through nnabla's
    own ``all_reduce_callback`` (``on_device``), since its other collectives share the
    compute stream (``NCCLBackend.overlaps_backward``)."""
    backend = getattr(comm, "backend", None)
    return getattr(backend, "overlaps_backward", True) or on_device(comm)


def on_device(comm):
    """Whether the overlap runs on the device through nnabla's C++ ``all_reduce_callback``
    (packs on non-blocking streams ordered by events, ext .cu ~998-1000, 1049-1050,
    1119-1135): the NCCL backend with the world all-reduce ``native``; with the noise scale
    tracked (``comm.track_sqnorms``) too, its norms taken on the device by the post hook.
    The torus phases are not on it: they are reduce_scatter / all_gather / all_reduce on rows
    and columns, which nnabla's Python API enqueues on the compute stream; running them on a
    stream of our own would need NCCL calls outside nnabla's API."""
    backend = getattr(comm, "backend", None)
    return (getattr(backend, "all_reduce_callback", None) is not None
            and getattr(comm, "algorithm", None) == "native")

MIB = 1 << 20
# nnabla's all_reduce_callback splits one fixed 40 MiB of device memory into pack buffers:
# n = 40 MiB / pack bytes (nnabla-ext-cuda v1.39.0 include/nbla/cuda/communicator/
# multi_process_data_parallel_communicator.hpp 190-191, .cu 962-972). A full pack is handed to
# the all-reduce stream, then the unpack stream, and the next pack takes the oldest buffer
# after its unpack (.cu 1087-1092, allocate_workspace 1153-1163): with one buffer (packs over
# 20 MiB) packing waits for the previous pack's all-reduce and unpack, nothing pipelines;
# above 40 MiB of float32 there is no buffer at all (undefined). Packs of at most 1/3 of it
# keep pack, all-reduce and unpack of three packs in flight, one per stream.
NNABLA_PACK_MEMORY = 40 * MIB
DEVICE_PACK_BUFFERS = 3
_STOP = None          # queued instead of a bucket index: the communication thread ends


class BucketedAllReduce:
    """Average the gradients of ``params`` over ranks in buckets of ``bucket_mib`` MiB."""

    def __init__(self, comm, loss, params, bucket_mib=25.0, division=True, threaded=True,
                 grad_bytes=4):
        """``loss``: the graph's output (used once to count how often each parameter is used);
        ``grad_bytes``: bytes per gradient element (4: float32; 2: FP16, ``type_config='half'``).
        Through nnabla's callback (``on_device``) the packs are ``device_pack_size(bucket_mib)``,
        at most 13.3 MiB, so that they pipeline (NNABLA_PACK_MEMORY)."""
        if bucket_mib <= 0:
            raise ValueError(f"bucket_mib = {bucket_mib} must be > 0 (e.g. 25)")
        self.comm = comm
        self.division = division
        params = list(params.values()) if hasattr(params, "values") else list(params)
        uses, order = count_uses(loss, params)
        self.uses = uses                       # variable -> number of functions that read it
        # nnabla's callback packs a gradient at each use (ext .cu 1019-1030): the pack holding
        # the copy of a parameter's first use may be unpacked (~1130-1135) after a later use
        # added to the gradient, and that contribution is lost. So a graph that reads a
        # parameter twice is not reduced through it (``backward``).
        self.shared = any(n > 1 for n in uses.values())
        # Parameters the graph never reads keep a zero gradient but are still averaged (in
        # the last bucket, at flush) so that every rank issues the same collectives.
        unused = [v for v in params if v not in uses]
        self.buckets = (make_buckets(order, bucket_mib * MIB, grad_bytes) +
                        ([unused] if unused else []))
        self.pack_size = device_pack_size(bucket_mib, grad_bytes)  # elements, on_device
        self.bucket_of = {v: i for i, bucket in enumerate(self.buckets) for v in bucket}
        self.pending = queue.Queue() if threaded else None
        self.error = None
        self.wait_s = 0.0     # seconds the last backward waited for communication after it
        self.thread = None
        if threaded:
            self.thread = threading.Thread(target=self._serve, name="bucketed-all-reduce",
                                           daemon=True)
            self.thread.start()
        self.reset()

    def close(self):
        """End the communication thread (after the buckets queued so far); idempotent."""
        if self.thread is not None:
            self.pending.put(_STOP)
            self.thread.join()
            self.thread = None

    def reset(self):
        """Forget progress; called at the start of every backward."""
        self.remaining_uses = dict(self.uses)
        self.remaining_params = [len(bucket) for bucket in self.buckets]
        self.done = [False] * len(self.buckets)

    def _finished(self, func):
        """Count down the uses of ``func``'s parameters; those whose gradient is now final."""
        done = []
        for var in func.inputs:
            left = self.remaining_uses.get(var)
            if left is None:
                continue
            self.remaining_uses[var] = left - 1
            if left == 1:
                done.append(var)
        return done

    def hook(self, func):
        """function_post_hook: count down uses; all-reduce each bucket as soon as it is final."""
        for var in self._finished(func):
            index = self.bucket_of[var]
            self.remaining_params[index] -= 1
            if self.remaining_params[index] == 0:
                self.reduce(index)

    def norm_hook(self, func):
        """function_post_hook on the device: enqueue the squared norms of the gradients
        ``func`` finished, before nnabla's callback (run after this hook) packs them."""
        done = self._finished(func)
        if done:
            self.comm.sqnorms.on_device(self.comm.backend).add_local([v.grad for v in done])

    def reduce(self, index):
        """All-reduce bucket ``index`` (once per backward), now or on the communication thread."""
        if self.done[index]:
            return
        self.done[index] = True
        if self.pending is None:
            self._all_reduce(index)
        else:
            self.pending.put(index)

    def _all_reduce(self, index):
        grads = [v.grad for v in self.buckets[index]]
        self.comm.all_reduce(grads, division=self.division, inplace=False)

    def _serve(self):
        # Buckets are reduced one at a time in the order backward finished them, the same
        # order on every rank, so the collectives match across ranks.
        while True:
            index = self.pending.get()
            if index is _STOP:
                self.pending.task_done()
                return
            try:
                if self.error is None:
                    self._all_reduce(index)
            except BaseException as e:          # re-raised on the main thread by flush
                self.error = e
            finally:
                self.pending.task_done()

    def flush(self):
        """Reduce the buckets backward did not finish; return when every bucket is averaged."""
        for index in range(len(self.buckets)):
            self.reduce(index)
        if self.pending is not None:
            self.pending.join()
            if self.error is not None:
                error, self.error = self.error, None
                raise RuntimeError(f"bucketed all-reduce failed: {error}") from error

    def backward(self, loss, **backward_kwargs):
        """``loss.backward(**backward_kwargs)`` with bucketed all-reduce, then flush. On the
        device (``on_device``): nnabla's callback in packs of ``self.pack_size``, no thread; it
        averages gradients as they are (FP16: still loss-scaled); with the noise scale
        tracked, ``norm_hook`` takes each local norm and the reduced norms are enqueued after
        backward (no host sync: read at ``comm.pop_sqnorms()``). Where the collectives would
        share the compute stream (``overlaps_backward`` False, e.g. the algorithm left
        ``native`` after ``set_algorithm``), or on the device with a parameter read twice
        (``shared``): one all-reduce after backward. ``wait_s``: the seconds spent after
        backward in all-reduce calls or waiting for the buckets (the all-reduce time backward
        did not hide; 0 on the device path, whose packs run inside backward)."""
        grads = [v.grad for bucket in self.buckets for v in bucket]
        track = getattr(self.comm, "track_sqnorms", False)
        self.wait_s = 0.0
        if on_device(self.comm) and not self.shared:
            callback = self.comm.all_reduce_callback(grads, self.pack_size,
                                                     division=self.division)
            # nnabla's callback waits for every peer inside backward (a blocking MPI check per
            # gradient, ext .cu 1025-1030), with nnabla's watchdog unarmed: ours ends a hang.
            what = "backward with nnabla's all_reduce_callback"
            if not track:
                with self.comm.backend.watch(what):
                    loss.backward(communicator_callbacks=callback, **backward_kwargs)
                return
            self.reset()
            with self.comm.backend.watch(what):
                loss.backward(communicator_callbacks=callback, function_post_hook=self.norm_hook,
                              **backward_kwargs)
            p = self.comm.size
            self.comm.sqnorms.on_device(self.comm.backend).add_global(
                grads, 1.0 if self.division else 1.0 / p ** 2)
            return
        # One call after backward: e.g. torus2d on NCCL, or a shared parameter on the device.
        if not overlaps_backward(self.comm) or on_device(self.comm):
            loss.backward(**backward_kwargs)
            tic = time.perf_counter()
            self.comm.all_reduce(grads, division=self.division, inplace=False)
            self.wait_s = time.perf_counter() - tic
            return
        self.reset()
        try:
            loss.backward(function_post_hook=self.hook, **backward_kwargs)
        except BaseException:
            # Let the buckets already queued finish (no new collectives), so that the thread
            # is idle and holds no stale error when the exception reaches the caller.
            if self.pending is not None:
                self.pending.join()
                self.error = None
            raise
        tic = time.perf_counter()
        self.flush()
        self.wait_s = time.perf_counter() - tic


def device_pack_size(bucket_mib, grad_bytes=4):
    """Elements per pack of nnabla's callback for buckets of ``bucket_mib``: the bucket, at most
    1/DEVICE_PACK_BUFFERS of nnabla's 40 MiB of pack memory (13.3 MiB: 3 buffers), so packs
    pipeline (see NNABLA_PACK_MEMORY); ``grad_bytes``: bytes per element of the
    communicator's type (4 float, 2 half).

    >>> device_pack_size(25), device_pack_size(1)          # float32 elements
    (3495253, 262144)
    """
    cap = NNABLA_PACK_MEMORY // DEVICE_PACK_BUFFERS // grad_bytes
    return max(1, min(int(bucket_mib * MIB) // grad_bytes, cap))


def count_uses(loss, params):
    """Return ({param: number of functions reading it}, params in order of first use)."""
    wanted = set(params)
    uses, order = {}, []

    def visit(func):
        for var in func.inputs:
            if var in wanted:
                if var not in uses:
                    uses[var] = 0
                    order.append(var)
                uses[var] += 1
    loss.visit(visit)
    return uses, order


def make_buckets(order, bucket_bytes, grad_bytes=4):
    """Split parameters, last used first, into lists of at most ``bucket_bytes`` (>= 1 each)."""
    buckets, current, size = [], [], 0
    for var in reversed(order):
        nbytes = var.size * grad_bytes
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(var)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
