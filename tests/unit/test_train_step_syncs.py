"""examples/imagenet/train.py's step reads nothing from the device until its gradients are
all-reduced (issue 19 finding 8): ``float(loss.d)`` and ``logits.d`` right after each forward
made the host wait for the GPU to finish the forward before backward was even enqueued, twice
per micro-batch (on a GPU ``.d`` is a device-to-host copy, nnabla
``python/src/nnabla/_nd_array.pyx`` ``data``)."""
import os
import sys

import numpy as np

import nnabla as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import train  # noqa: E402
from nnabla_torus.planning.controller import BatchPlan  # noqa: E402


class DeviceOnly:
    """A graph output whose values may be used on the device (``data``) but not read on the
    host (``d``) before the step's all-reduce."""

    def __init__(self, values, events):
        self.data, self.events = nn.NdArray.from_numpy_array(np.asarray(values, np.float32)), events

    @property
    def d(self):
        raise AssertionError(f"host read of a graph output mid-step, after {self.events}")


class Objective:
    def __init__(self, events):
        self.events = events

    def forward(self, **kwargs):
        self.events.append("forward")

    def backward(self, **kwargs):
        self.events.append("backward")


class Comm:
    def __init__(self, events):
        self.events = events

    def all_reduce(self, grads, **kwargs):
        self.events.append("all_reduce")


class Solvers:
    def zero_grad(self):
        pass


class Stream:
    def next_batch(self, batch):
        return np.zeros((batch, 1), np.float32), np.array([[0], [2]])


def test_loss_and_error_are_read_once_after_the_all_reduce():
    events = []
    x, t = nn.Variable((2, 1)), nn.Variable((2, 1))
    loss = DeviceOnly(1.5, events)
    logits = DeviceOnly([[0.9, 0.1, 0.0], [0.8, 0.1, 0.1]], events)   # second is wrong
    graph = (x, t, loss, Objective(events), logits)
    plan = BatchPlan(4, 2, 2, 1.0, False, "test")     # 2 micro-batches
    mean_loss, error, _ = train.train_step(Stream(), graph, plan, Solvers(), Comm(events), [],
                                        None, None)
    assert events == ["forward", "backward", "forward", "backward", "all_reduce"]
    assert (mean_loss, error) == (1.5, 0.5)


class HostLabelsRefused:
    """The label input of a GPU run: filled on the device (``data``), never from the host:
    ``t.d = labels`` makes forward upload them at the loss with a synchronous cudaMemcpy,
    which waits for the whole forward (nnabla-ext-cuda v1.39.0
    ``src/nbla/cuda/array/cuda_array.cpp`` ~161-177 ``synchronize_sync``, ~212-236)."""

    def __init__(self, events):
        self.data, self.events = nn.NdArray((2, 1)), events

    @property
    def d(self):
        return self.data.data

    @d.setter
    def d(self, value):
        raise AssertionError(f"labels uploaded from the host mid-step, after {self.events}")


class DeviceStream:
    """A GPU training stream: images and labels already in device memory (NdArrays)."""

    def next_batch(self, batch):
        return (nn.NdArray.from_numpy_array(np.zeros((batch, 1), np.float32)),
                nn.NdArray.from_numpy_array(np.array([[0], [2]], np.int32)))


def test_device_labels_are_fed_on_the_device_not_through_the_host():
    events = []
    x, t = nn.Variable((2, 1)), HostLabelsRefused(events)
    loss = DeviceOnly(1.5, events)
    logits = DeviceOnly([[0.9, 0.1, 0.0], [0.8, 0.1, 0.1]], events)   # second is wrong
    graph = (x, t, loss, Objective(events), logits)
    plan = BatchPlan(4, 2, 2, 1.0, False, "test")
    mean_loss, error, _ = train.train_step(DeviceStream(), graph, plan, Solvers(), Comm(events),
                                        [], None, None)
    assert events == ["forward", "backward", "forward", "backward", "all_reduce"]
    assert (mean_loss, error) == (1.5, 0.5)
    np.testing.assert_array_equal(t.d, [[0], [2]])


class ChangingLoss:
    """An objective whose forward writes micro-batch k's loss into ``loss.data`` (as nnabla's
    forward rewrites the loss variable's array)."""

    def __init__(self, loss, values):
        self.loss, self.values = loss, list(values)

    def forward(self, **kwargs):
        self.loss.data.data[...] = self.values.pop(0)

    def backward(self, **kwargs):
        pass


def test_issue47_the_accumulated_loss_is_the_mean_of_the_micro_batches():
    """Before: the first micro-batch's sum held ``loss.data`` itself, which the next forward
    overwrote, so 2 micro-batches of losses 1 and 3 logged 3 (the last one twice), not 2."""
    events = []
    x, t = nn.Variable((2, 1)), nn.Variable((2, 1))
    loss = DeviceOnly(0.0, events)
    logits = DeviceOnly([[0.9, 0.1, 0.0], [0.8, 0.1, 0.1]], events)
    for values, want in (([1.0, 3.0], 2.0), ([1.0, 3.0, 8.0], 4.0), ([5.0], 5.0)):
        plan = BatchPlan(2 * len(values), 2, len(values), 1.0, False, "test")
        graph = (x, t, loss, ChangingLoss(loss, values), logits)
        mean_loss, error, _ = train.train_step(Stream(), graph, plan, Solvers(), Comm(events),
                                               [], None, None)
        assert (mean_loss, error) == (want, 0.5), values
