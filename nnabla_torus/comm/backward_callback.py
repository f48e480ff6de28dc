"""``comm.all_reduce_callback`` on CPU: a Python callback that nnabla's ``backward`` runs.

nnabla's ``Variable.backward(communicator_callbacks=...)`` accepts only its C++
``CommunicatorBackwardCallback`` (nnabla v1.39.0 python/src/nnabla/_variable.pyx:877-882), only
the CUDA communicator makes one (ext multi_process_data_parallel_communicator.cu:953-979), and a
Python subclass holds a null C++ pointer that backward dereferences
(src/nbla/computation_graph/variable.cpp:916-936): a segfault. So ``install()`` replaces
``nnabla.Variable.backward`` with a function of the same signature that runs Python callbacks
through a ``function_post_hook`` in the order nnabla's C++ backward calls its own, and counts
the backward calls in progress (``in_backward``: a forward then is nnabla's recomputation).
The order, errors and the CPython-only patch: docs/dropin.md#all_reduce_callback. An
unchanged script then runs::

    cb = comm.all_reduce_callback([v.grad for v in nn.get_parameters().values()], 2 << 20)
    loss.backward(clear_buffer=True, communicator_callbacks=cb)   # gradients summed on return
"""
import nnabla as nn
import numpy as np

from . import cython_patch

_original = []  # nnabla's own Variable.backward, once install() replaced it
_running = [0]   # backward calls in progress on this process


def in_backward():
    """Whether a ``Variable.backward`` is running: a forward now is nnabla's recomputation of
    a cleared output (``Variable.recompute``), which must not update state again."""
    return _running[0] > 0


def is_native(callback):
    """Whether ``callback`` is nnabla's C++ CommunicatorBackwardCallback (nnabla takes it as is)."""
    from nnabla._variable import CommunicatorBackwardCallback
    return isinstance(callback, CommunicatorBackwardCallback)


def _split(callbacks):
    """(nnabla's C++ callbacks, Python callbacks) from backward's ``communicator_callbacks``."""
    items = callbacks if type(callbacks) is list else [] if callbacks is None else [callbacks]
    python = [c for c in items if not is_native(c) and hasattr(c, "on_finish_backward")]
    native = [c for c in items if not any(c is p for p in python)]
    return native, python


def _backward(self, grad=1, clear_buffer=False, communicator_callbacks=None,
              function_pre_hook=None, function_post_hook=None):
    """nnabla's ``Variable.backward``, plus Python communicator callbacks (module doc)."""
    _running[0] += 1
    try:
        _run_backward(self, grad, clear_buffer, communicator_callbacks, function_pre_hook,
                      function_post_hook)
    finally:
        _running[0] -= 1


def _run_backward(self, grad, clear_buffer, communicator_callbacks, function_pre_hook,
                  function_post_hook):
    original = _original[0]
    native, python = _split(communicator_callbacks)
    if not python:
        return original(self, grad, clear_buffer, communicator_callbacks, function_pre_hook,
                        function_post_hook)
    for callback in python:
        getattr(callback, "on_start_backward", lambda loss: None)(self)
    failed = []   # an exception in a hook: nnabla would turn it into a SystemError

    def post_hook(func):
        if failed:
            return
        try:
            if function_post_hook is not None:
                function_post_hook(func)
            for callback in python:
                callback.on_finish_function_backward(func)
        except BaseException as e:  # noqa: BLE001  (raised below, after nnabla's backward)
            failed.append(e)
    original(self, grad, clear_buffer, native or None, function_pre_hook, post_hook)
    if failed:
        raise failed[0]
    for callback in python:
        callback.on_finish_backward()


def install():
    """Let ``nnabla.Variable.backward`` run Python communicator callbacks (idempotent).

    Done when a communicator is created: ``x.backward(communicator_callbacks=
    comm.all_reduce_callback(...))`` looks ``backward`` up before it makes the callback.
    Returns False where the type cannot be extended (not CPython); ``all_reduce_callback``
    then raises naming the alternatives."""
    if _original:
        return True
    from nnabla._variable import Variable
    try:
        _backward.__doc__ = Variable.backward.__doc__
        original = cython_patch.replace(Variable, "backward", _backward)
    except Exception:  # noqa: BLE001  (another interpreter or nnabla: reported at the call)
        return False
    _original.append(original)
    return True


def make_callback(comm, data, pack_size, division, group, scale_grad, keep_dtype):
    """``comm.all_reduce_callback``'s callback: on the NCCL backend nnabla's own C++ one from
    the communicator the backend holds (its group mapped to the backend's), which nnabla's
    backward accepts as it is; on others an ``AllReduceCallback``, run by ``install()``'s
    backward."""
    from .fused import as_list
    arrays = as_list(data)
    grp = comm._group(group)
    if not isinstance(pack_size, (int, np.integer)) or isinstance(pack_size, bool) \
            or pack_size < 1:
        raise ValueError(f"all_reduce_callback: pack_size={pack_size!r} must be an integer "
                         f">= 1 (elements per pack, e.g. 2 * 1024 * 1024)")
    native = getattr(comm.backend, "all_reduce_callback", None)
    if native is not None:
        callback = native(arrays, int(pack_size), bool(division), grp, float(scale_grad),
                          bool(keep_dtype), half=comm._half())
    else:
        dtype = None if keep_dtype else np.float16 if comm._half() else np.float32
        callback = AllReduceCallback(
            comm, arrays, int(pack_size), bool(division), group, float(scale_grad), dtype)
    if not is_native(callback):
        require()
    return callback


def require():
    """Raise unless ``install()`` worked: a Python callback would not reach nnabla's backward."""
    if not install():
        raise RuntimeError(
            "all_reduce_callback on CPU needs nnabla.Variable.backward to accept Python "
            "callbacks, and this interpreter does not let it be extended. Use "
            "nnabla_torus.overlap.BucketedAllReduce(comm, loss, params).backward(loss), or "
            "comm.all_reduce(grads) after loss.backward()")


class AllReduceCallback:
    """Sum ``grads`` over ``group`` in packs of ``pack_size`` elements during backward.

    A gradient joins the current pack once every function of this backward that reads its
    variable has finished (use counts from the graph of the variable backward starts from;
    nnabla's C++ callback packs at each use, ext .cu:1019-1030, which double-counts a shared
    parameter). A full pack is all-reduced at once, on the calling thread (backward waits for
    it; collectives that backward makes itself, SyncBN's, then keep one order on every rank);
    the rest at the end, with gradients the graph never reached. As nnabla's pack step: each
    gradient is multiplied by ``scale_grad`` into a pack buffer of float32 (at least), summed
    there and written back in the gradient's type; with ``dtype`` (nnabla's
    ``keep_dtype=False``: the communicator's type) the gradient is cast to it first, which
    raises nnabla's own error for a narrowed array of another type. The communicator's zeroing
    rule applies per gradient.
    """

    def __init__(self, comm, grads, pack_size, division, group, scale_grad, dtype=None):
        self.comm, self.grads, self.pack_size = comm, list(grads), pack_size
        self.division, self.group, self.scale_grad = division, group, scale_grad
        self.dtype = dtype
        self._uses_of = {}  # loss variable -> {grad NdArray: number of functions reading it}
        self._left = {}
        self._pack, self._packed = [], 0

    def on_start_backward(self, loss):
        uses = self._uses_of.get(loss)
        if uses is None:
            wanted = set(self.grads)
            uses = {}

            def count(func):
                for var in func.inputs:
                    grad = var.grad
                    if grad in wanted:
                        uses[grad] = uses.get(grad, 0) + 1
            loss.visit(count)
            self._uses_of = {loss: uses}   # one graph remembered: the usual training loop
        self._left = dict(uses)
        self._pack, self._packed = [], 0

    def on_finish_function_backward(self, func):
        for var in func.inputs:
            grad = var.grad
            left = self._left.get(grad)
            if not left:
                continue
            self._left[grad] = left - 1
            if left == 1:
                self._add(grad)

    def on_finish_backward(self):
        for grad in self.grads:   # never reached (or no on_start_backward): in list order
            if self._left.get(grad, 1):
                self._add(grad)
        self._flush()
        self._left = {}

    def _add(self, grad):
        """Put ``grad`` times ``scale_grad`` into the pack, in the communicator's type (as
        nnabla's pack buffer; a zero()-ed gradient as a zero()-ed array, so the zeroing rule
        sees it)."""
        wire = nn.NdArray(grad.shape)
        if grad.zeroing:
            wire.zero()
        else:
            if self.dtype is not None:   # keep_dtype=False: the gradient becomes type T
                grad.cast(self.dtype)
            wide = np.promote_types(self.dtype or grad.dtype, np.float32)
            wire.cast(wide)
            wire.data[...] = grad.get_data("r").astype(wide) * wide.type(self.scale_grad)
        self._pack.append((grad, wire))
        self._packed += wire.size
        if self._packed >= self.pack_size:
            self._flush()

    def _flush(self):
        if self._pack:
            self.comm.all_reduce([wire for _, wire in self._pack], division=self.division,
                                 group=self.group)
            for grad, wire in self._pack:
                if not wire.zeroing:   # zeroing on every rank: the gradient stays as it is
                    grad.get_data("w")[...] = wire.get_data("r")
        self._pack, self._packed = [], 0
