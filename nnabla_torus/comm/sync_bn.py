"""Synchronized batch normalization with a ``TorusCommunicator``.

nnabla's ``F.sync_batch_normalization`` (and ``PF.sync_batch_normalization``, which calls it
through the module, nnabla v1.39.0 python/src/nnabla/parametric_functions.py:1974) take a
``comm`` that a Cython check types as nnabla's C++ ``Communicator`` (function_bases.py), so
they refuse ours. ``install(TorusCommunicator)`` (run when a communicator is created) puts a dispatcher in
their place: a ``TorusCommunicator`` goes to ``sync_batch_normalization`` below (NCCL backend:
nnabla's own kernel; others: ``SyncBatchNormalization``, a numpy ``PythonFunction`` whose
running statistics follow nnabla's src/nbla/function/generic/batch_normalization.cpp:195-211),
anything else to nnabla's own function, unchanged. What each pass all-reduces and how it
matches nnabla's kernel: docs/dropin.md#syncbn. An unchanged script then runs::

    comm = C.MultiProcessCommunicator(ctx); comm.init()
    h = PF.sync_batch_normalization(h, comm, group="world", axes=[1])
"""
import functools

import nnabla as nn
import nnabla.functions as F
import numpy as np
from nnabla.function import PythonFunction

from . import backward_callback

_EXCHANGE = np.float32  # the sums travel as float32: every backend moves it


def install(communicator_class):
    """Route ``F.sync_batch_normalization`` with a ``communicator_class`` instance (the
    communicator hands in its class: this module never imports it) to this module (idempotent)."""
    import nnabla.normalization_functions as NF
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

    @property
    def name(self):
        return "SyncBatchNormalization"

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
        x = inputs[0].d.astype(np.float64)
        beta, gamma = inputs[1].d, inputs[2].d
        shape = beta.shape
        red = self._reduce_axes(x.ndim)
        count = x.size // int(np.prod(shape))
        first = self._sum_over_ranks(np.append(x.sum(axis=red).ravel(), count))
        total = first[-1]
        mean = (first[:-1] / total).reshape(shape)
        var = (self._sum_over_ranks(((x - mean) ** 2).sum(axis=red).ravel())
               / total).reshape(shape)
        self._mean, self._invstd, self._total = mean, 1.0 / np.sqrt(var + self.eps), total
        outputs[0].d = (x - mean) * self._invstd * gamma + beta
        if len(outputs) == 3:
            outputs[1].d, outputs[2].d = mean, var
        if backward_callback.in_backward():
            return   # nnabla recomputing a cleared output: the statistics were updated once
        rate = self.decay_rate
        unbiased = var * total / (total - 1) if total > 1 else var
        inputs[3].d = rate * inputs[3].d + (1 - rate) * mean
        inputs[4].d = rate * inputs[4].d + (1 - rate) * unbiased

    def backward_impl(self, inputs, outputs, propagate_down, accum):
        if not any(propagate_down[:3]):
            return
        dy = outputs[0].g.astype(np.float64)
        x_hat = (inputs[0].d - self._mean) * self._invstd
        red = self._reduce_axes(dy.ndim)
        shape = self._mean.shape
        sum_dy = dy.sum(axis=red).reshape(shape)
        sum_dy_xhat = (dy * x_hat).sum(axis=red).reshape(shape)
        grads = {1: sum_dy, 2: sum_dy_xhat}   # this rank's share; the gradient all-reduce sums
        if propagate_down[0]:
            both = self._sum_over_ranks(np.concatenate([sum_dy.ravel(), sum_dy_xhat.ravel()]))
            all_dy, all_dy_xhat = (b.reshape(shape) for b in np.split(both, 2))
            dx = inputs[2].d * self._invstd * (dy - (all_dy + x_hat * all_dy_xhat) / self._total)
            if len(outputs) == 3:
                # through the mean and variance outputs: this rank's gradients, not summed
                # over ranks, as nnabla's kernel does (ext sync_batch_normalization.cu:216)
                dmean, dvar = (o.g.astype(np.float64) for o in outputs[1:])
                dx += (dmean + 2 * dvar * (inputs[0].d - self._mean)) / self._total
            grads[0] = dx
        for i, g in grads.items():
            if not propagate_down[i]:
                continue
            if accum[i]:
                inputs[i].g += g
            else:
                inputs[i].g = g
