"""Synchronized batch normalization with a ``TorusCommunicator``.

nnabla's ``F.sync_batch_normalization`` (and ``PF.sync_batch_normalization``, which calls it
through the module, nnabla v1.39.0 python/src/nnabla/parametric_functions.py:1974) take a
``comm`` that a Cython check types as nnabla's C++ ``Communicator`` (function_bases.py), so
they refuse ours. ``install(TorusCommunicator)`` (run when a communicator is created) puts a
dispatcher in
their place: a ``TorusCommunicator`` goes to ``sync_batch_normalization`` below (NCCL backend:
nnabla's own kernel; others: ``SyncBatchNormalization``, a numpy ``PythonFunction`` whose
running statistics follow nnabla's src/nbla/function/generic/batch_normalization.cpp:195-211),
anything else to nnabla's own function, unchanged. What each pass all-reduces and how it
matches nnabla's kernel: docs/dropin.md#syncbn. An unchanged script then runs::

    comm = C.MultiProcessCommunicator(ctx); comm.init()
    h = PF.sync_batch_normalization(h, comm, group="world", axes=[1])

The CPU function is first-class where nnabla looks at a function (``install_function_patches``):
its ``parent.name`` is nnabla's ``SyncBatchNormalization`` (a Python function's C++ name is
``Callback``), a direct ``Function.recompute`` recomputes the outputs without updating the
running statistics again (as nnabla's ``recompute_impl``), and a graph holding it saves to
``.nnp`` as ``BatchNormalization`` with its arguments (nnabla v1.39.0 cannot save its own:
``utils/save_function.py`` ~249 assigns the ``comm`` argument to a message field, which
protobuf refuses); on one process SyncBN is that BatchNormalization.
"""
import functools

import nnabla as nn
import nnabla.functions as F
import numpy as np
from nnabla.function import PythonFunction

from . import backward_callback, cython_patch

_EXCHANGE = np.float32  # the sums travel as float32: every backend moves it
NAME = "SyncBatchNormalization"   # nnabla's function name (and its info.type_name)
_nnabla = {}   # nnabla's own Function attributes that install_function_patches replaced
_recomputing = [0]   # Function.recompute calls in progress


def install(communicator_class):
    """Route ``F.sync_batch_normalization`` with a ``communicator_class`` instance (the
    communicator hands in its class: this module never imports it) to this module (idempotent)."""
    import nnabla.normalization_functions as NF
    install_function_patches()
    original = F.sync_batch_normalization
    if getattr(original, "nnabla_torus_original", None) is not None:
        return

    @functools.wraps(original)
    def dispatch(x, beta, gamma, mean, variance, comm, group="world", axes=[1], decay_rate=0.9,
                 eps=1e-05, batch_stat=True, output_stat=False, n_outputs=None):
        if not isinstance(comm, communicator_class):
            return original(x, beta, gamma, mean, variance, comm, group, axes, decay_rate, eps,
                            batch_stat, output_stat, n_outputs)
        return sync_batch_normalization(x, beta, gamma, mean, variance, comm, group, axes,
                                        decay_rate, eps, batch_stat, output_stat)
    dispatch.nnabla_torus_original = original
    F.sync_batch_normalization = NF.sync_batch_normalization = dispatch


def _is_ours(func):
    """Whether nnabla ``Function`` ``func`` is a :class:`SyncBatchNormalization`."""
    info = func.info
    return (info is not None and info.type_name == NAME
            and _nnabla["name"].__get__(func) == "Callback")


def _name(func):
    return NAME if _is_ours(func) else _nnabla["name"].__get__(func)


def _recompute(func, inputs, outputs):
    _recomputing[0] += 1
    try:
        return _nnabla["recompute"](func, inputs, outputs)
    finally:
        _recomputing[0] -= 1


def _proto_call(func, inputs, n_outputs, outputs):
    """The function in a graph being saved (``nnabla.utils.save``): ours as BatchNormalization
    with the same arguments (nnabla ``save_function.py``'s BatchNormalization fields)."""
    if not _is_ours(func):
        return _nnabla["_proto_call"](func, inputs, n_outputs, outputs)
    from nnabla.function import ProtoFunction
    args = func.info.args
    bn = {key: args[key] for key in ("axes", "decay_rate", "eps", "batch_stat")}
    bn.update(no_scale=False, no_bias=False)   # the scale and bias are inputs, as in SyncBN
    return ProtoFunction(func, "BatchNormalization", bn)(inputs, n_outputs)


def install_function_patches():
    """Make nnabla's ``Function.name``, ``recompute`` and ``_proto_call`` treat the CPU
    :class:`SyncBatchNormalization` as nnabla's own (module doc; idempotent). Returns False
    where the type cannot be extended (not CPython): the function still computes the same."""
    if _nnabla:
        return True
    from nnabla.function import Function
    try:
        original_name = Function.__dict__["name"]
        patches = {"name": property(_name, doc=original_name.__doc__),
                   "recompute": _recompute, "_proto_call": _proto_call}
        for attribute, value in patches.items():
            _nnabla[attribute] = cython_patch.replace(Function, attribute, value)
    except Exception:  # noqa: BLE001  (another interpreter: nnabla's own attributes stay)
        for attribute, value in _nnabla.items():
            cython_patch.replace(Function, attribute, value)
        _nnabla.clear()
        return False
    return True


def sync_batch_normalization(x, beta, gamma, mean, variance, comm, group="world", axes=[1],
                             decay_rate=0.9, eps=1e-05, batch_stat=True, output_stat=False):
    """nnabla's ``F.sync_batch_normalization`` over ``comm``'s ``group`` (module doc)."""
    from nnabla.normalization_functions import _create_bn_dummy_vars, _force_list
    axes = _force_list(axes)
    if not batch_stat and (mean is None or variance is None):
        raise ValueError("If batch_stat is False, mean and variable must not be None.")
    native = comm.native_communicator(group)
    if native is not None:   # GPU: nnabla's own kernel on the NCCL backend's communicator
        original = F.sync_batch_normalization.nnabla_torus_original
        return original(x, beta, gamma, mean, variance, *native, axes, decay_rate, eps,
                        batch_stat, output_stat)
    beta, gamma, mean, variance = _create_bn_dummy_vars(x, axes, beta, gamma, mean, variance)
    if not batch_stat:
        return F.batch_normalization(x, beta, gamma, mean, variance, axes, decay_rate, eps,
                                     batch_stat=False, output_stat=output_stat)
    comm._group(group)   # an unknown group or a non-member fails here, not in forward
    return SyncBatchNormalization(comm, group, axes, decay_rate, eps)(
        x, beta, gamma, mean, variance, n_outputs=3 if output_stat else 1)


class SyncBatchNormalization(PythonFunction):
    """Batch normalization with statistics of the batch of every rank of ``group``; outputs
    y, and with ``n_outputs=3`` the batch mean and (biased) variance, as nnabla's."""

    def __init__(self, comm, group, axes, decay_rate, eps):
        super().__init__()
        self.comm, self.group, self.axes = comm, group, list(axes)
        self.decay_rate, self.eps = float(decay_rate), float(eps)
        # info.args as nnabla's own function records them (function.pyx.tmpl ~802-807)
        self.args = {"comm": "<Communicator>", "group": group, "axes": list(axes),
                     "decay_rate": self.decay_rate, "eps": self.eps, "batch_stat": True}

    @property
    def name(self):
        return NAME

    def min_outputs(self):
        return 1

    def grad_depends_output_data(self, i, o):
        return False

    def grad_depends_input_data(self, i, j):
        return j in (0, 2)   # x and gamma

    def setup_impl(self, inputs, outputs):
        outputs[0].reset_shape(inputs[0].shape, True)
        for stat in outputs[1:]:
            stat.reset_shape(inputs[1].shape, True)

    def _reduce_axes(self, ndim):
        return tuple(i for i in range(ndim) if i not in self.axes)

    def _sum_over_ranks(self, values):
        """Sum a float64 vector over the group (travels as float32)."""
        nd = nn.NdArray.from_numpy_array(np.asarray(values, dtype=_EXCHANGE))
        self.comm.all_reduce(nd, group=self.group)
        return nd.get_data("r").astype(np.float64)

    def forward_impl(self, inputs, outputs):
        # Elementwise work in the input's dtype (float32, as nnabla's CPU kernel), every sum
        # accumulated in float64: no float64 copy of x (ResNet-50's first layer at batch 64
        # holds 51 M values).
        x = inputs[0].d
        beta, gamma = inputs[1].d, inputs[2].d
        shape = beta.shape
        red = self._reduce_axes(x.ndim)
        count = x.size // int(np.prod(shape))
        first = self._sum_over_ranks(np.append(np.sum(x, axis=red, dtype=np.float64).ravel(),
                                               count))
        total = first[-1]
        mean = (first[:-1] / total).reshape(shape)
        centered = x - mean.astype(x.dtype)
        var = (self._sum_over_ranks(np.sum(np.square(centered), axis=red, dtype=np.float64)
                                    .ravel()) / total).reshape(shape)
        self._mean, self._invstd, self._total = mean, 1.0 / np.sqrt(var + self.eps), total
        centered *= (self._invstd * gamma).astype(x.dtype)
        centered += beta
        outputs[0].d = centered
        if len(outputs) == 3:
            outputs[1].d, outputs[2].d = mean, var
        if backward_callback.in_backward() or _recomputing[0]:
            return   # nnabla recomputing a cleared output: the statistics were updated once
        rate = self.decay_rate
        unbiased = var * total / (total - 1) if total > 1 else var
        inputs[3].d = rate * inputs[3].d + (1 - rate) * mean
        inputs[4].d = rate * inputs[4].d + (1 - rate) * unbiased

    def backward_impl(self, inputs, outputs, propagate_down, accum):
        if not any(propagate_down[:3]):
            return
        dy, x = outputs[0].g, inputs[0].d
        kind = x.dtype
        x_hat = x - self._mean.astype(kind)
        x_hat *= self._invstd.astype(kind)
        red = self._reduce_axes(dy.ndim)
        shape = self._mean.shape
        sum_dy = np.sum(dy, axis=red, dtype=np.float64).reshape(shape)
        sum_dy_xhat = np.sum(dy * x_hat, axis=red, dtype=np.float64).reshape(shape)
        grads = {1: sum_dy, 2: sum_dy_xhat}   # this rank's share; the gradient all-reduce sums
        if propagate_down[0]:
            both = self._sum_over_ranks(np.concatenate([sum_dy.ravel(), sum_dy_xhat.ravel()]))
            all_dy, all_dy_xhat = (b.reshape(shape) / self._total for b in np.split(both, 2))
            # dx = gamma * invstd * (dy - mean(dy) - x_hat * mean(dy * x_hat)), over all ranks
            x_hat *= -all_dy_xhat.astype(kind)
            x_hat -= all_dy.astype(kind)
            x_hat += dy
            x_hat *= (inputs[2].d * self._invstd).astype(kind)
            dx = x_hat
            if len(outputs) == 3:
                # through the mean and variance outputs: this rank's gradients, not summed
                # over ranks, as nnabla's kernel does (ext sync_batch_normalization.cu:216)
                dmean, dvar = (o.g.astype(np.float64) for o in outputs[1:])
                dx += ((dmean + 2 * dvar * (x - self._mean)) / self._total).astype(kind)
            grads[0] = dx
        for i, g in grads.items():
            if not propagate_down[i]:
                continue
            if accum[i]:
                inputs[i].g += g
            else:
                inputs[i].g = g
