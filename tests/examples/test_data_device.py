"""From the DALI pipeline into the graph's input: dtype, layout, and no host round trip on a GPU.

No GPU here, so: the FP16 output and ``copy_to_array`` (nnabla-ext-cuda's way: ``data_ptr`` +
DALI's ``copy_to_external``) run for real with a CPU pipeline into nnabla CPU arrays; the GPU
path runs with a fake DALI GPU batch and a fake nnabla array that record the calls, checking
the context, dtype, write-only flag and CUDA stream passed, and that nothing goes to the host.
The last test runs only where nnabla-ext-cuda finds a GPU: the real device copy, bitwise.
"""
import ctypes
import os
import sys

import numpy as np
import nnabla as nn
import nnabla.functions as F
import pytest
from nnabla.ext_utils import get_extension_context
from nvidia.dali import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import data  # noqa: E402
from tests.examples.test_data import indexed  # noqa: E402,F401 (the solid-colour image fixture)

CPU = get_extension_context("cpu")
# What get_extension_context("cudnn", device_id="1", type_config="half") returns with the CUDA
# extension installed (built by hand: the extension is not installed here).
CUDA = nn.Context(backend=["cudnn:half", "cuda:half", "cpu:float"],
                  array_class="CudaCachedArray", device_id="1")


@pytest.mark.parametrize("train", [True, False])
def test_half_images_are_float16_nchw_and_round_the_float_ones(indexed, train):  # noqa: F811
    kwargs = dict(batch_size=5, rank=0, size=1, train=train, image_size=16, seed=4)
    images32, labels32 = next(data.make_loader(indexed, **kwargs))
    images16, labels16 = next(data.make_loader(indexed, dtype="half", **kwargs))
    assert images16.shape == images32.shape == (5, 3, 16, 16)
    assert images16.dtype == np.float16 and images32.dtype == np.float32
    np.testing.assert_array_equal(labels16, labels32)          # same images, same augmentation
    np.testing.assert_allclose(images16.astype(np.float32), images32,
                               rtol=2.0 ** -11, atol=2.0 ** -24)


@pytest.mark.parametrize("dtype, numpy_dtype", [("float", np.float32), ("half", np.float16)])
def test_copy_to_array_fills_an_nnabla_input_from_a_real_dali_batch(indexed, dtype,  # noqa: F811
                                                                    numpy_dtype):
    loader = data.make_loader(indexed, 5, train=False, image_size=16, dtype=dtype)
    batch, _ = loader._pipe.run()                             # a DALI TensorListCPU
    x = nn.Variable((5, 3, 16, 16))
    with nn.context_scope(CPU):
        data.feed(x, batch)                                   # the current context: CPU
        assert x.data.dtype == numpy_dtype                    # stored in the batch's dtype
        np.testing.assert_array_equal(x.d, batch.as_array())
        y = F.mean(x, axis=(2, 3))                            # and the graph computes with it
        y.forward()
    np.testing.assert_allclose(y.d, batch.as_array().astype(np.float32).mean(axis=(2, 3)),
                               rtol=1e-5)


class FakeGPUBatch:
    """A dense DALI TensorListGPU on ``device``; records copies, refuses a trip to the host."""

    def __init__(self, shape, dali_dtype, device):
        self.shape_, self.dali_dtype, self.device, self.copies = shape, dali_dtype, device, []

    def device_id(self):
        return self.device

    def as_tensor(self):
        return self                                           # a TensorGPU view of the list

    def shape(self):
        return list(self.shape_)

    @property
    def dtype(self):
        return self.dali_dtype

    def copy_to_external(self, pointer, **kwargs):
        self.copies.append((pointer, kwargs))

    def as_cpu(self):
        raise AssertionError("the GPU batch was copied to the host")

    as_array = as_cpu


class FakeLabels:
    def __init__(self, labels):
        self.labels = labels

    def as_array(self):
        return np.array(self.labels, np.int32)


class FakeArray:
    """An nnabla NdArray in device memory: records data_ptr calls."""

    def __init__(self, shape):
        self.shape, self.calls = shape, []

    def data_ptr(self, dtype, ctx=None, write_only=False):
        self.calls.append((dtype, ctx, write_only))
        return 0xD0000


class FakeVariable:
    def __init__(self, shape):
        self.data = FakeArray(shape)


def test_a_gpu_batch_goes_device_to_device_in_fp16(indexed, monkeypatch):  # noqa: F811
    built = {}

    class FakePipe:
        def run(self):
            return (FakeGPUBatch((4, 3, 8, 8), types.DALIDataType.FLOAT16, built["device_id"]),
                    FakeLabels(built["labels"][:4]))

    def fake_build(files, labels, batch_size, train, image_size, seed, device_id, *rest):
        built.update(labels=labels, device_id=device_id, dtype=rest[-1])
        return FakePipe()

    monkeypatch.setattr(data, "_build_pipeline", fake_build)
    loader = data.make_loader(indexed, 4, train=False, image_size=8, device_id=1, dtype="half")
    assert built["device_id"] == 1 and built["dtype"] == "half"
    images, labels = next(loader)                             # no as_cpu / as_array on images
    assert labels.shape == (4, 1) and labels.dtype == np.int32
    x = FakeVariable((4, 3, 8, 8))
    data.feed(x, images, CUDA)
    assert x.data.calls == [(np.float16, CUDA, True)]         # device array, fp16, write-only
    (pointer, kwargs), = images.copies
    assert isinstance(pointer, ctypes.c_void_p) and pointer.value == 0xD0000
    # On CUDA's legacy default stream (0), where nnabla-ext-cuda computes; the host does not
    # wait (DALI's own stream waits for the copy before it reuses the buffer).
    assert set(kwargs) == {"cuda_stream", "non_blocking"} and kwargs["non_blocking"] is True
    assert kwargs["cuda_stream"].value in (None, 0)


def test_gpu_training_labels_stay_on_the_device(indexed, monkeypatch):  # noqa: F811
    """A GPU training pipeline's labels (``label.gpu()``) reach the label input device to
    device; the old loader called ``as_array()`` on them and ``t.d = labels`` uploaded them
    at the loss with a synchronous cudaMemcpy (ext ``src/nbla/cuda/array/cuda_array.cpp``
    ~161-177, v1.39.0), one more host wait per micro-batch."""
    built = {}

    class FakePipe:
        def run(self):
            return (FakeGPUBatch((4, 3, 8, 8), types.DALIDataType.FLOAT16, 1),
                    FakeGPUBatch((4, 1), types.DALIDataType.INT32, 1))

    def fake_build(files, labels, batch_size, train, *rest):
        built.update(train=train)
        return FakePipe()

    monkeypatch.setattr(data, "_build_pipeline", fake_build)
    loader = data.make_loader(indexed, 4, train=True, image_size=8, device_id=1, dtype="half")
    assert built["train"] and loader.labels_on_device
    _, labels = next(loader)                                  # no as_array on the labels
    t = FakeVariable((4, 1))
    data.feed(t, labels, CUDA)
    assert t.data.calls == [(np.int32, CUDA, True)]           # device array, int32, write-only
    (_, kwargs), = labels.copies
    assert kwargs["cuda_stream"].value in (None, 0)           # the compute stream, as images


@pytest.mark.parametrize("batch, ctx, message", [
    (FakeGPUBatch((4, 3, 8, 8), types.DALIDataType.FLOAT, 0), CUDA,
     "on GPU 0 but the context uses GPU 1"),
    (FakeGPUBatch((4, 3, 8, 8), types.DALIDataType.FLOAT, 1), CPU,
     "GPU batch cannot be copied into a cpu:float"),
    (FakeGPUBatch((2, 3, 8, 8), types.DALIDataType.FLOAT, 1), CUDA,
     r"shape \(2, 3, 8, 8\) cannot fill .* \(4, 3, 8, 8\)"),
])
def test_mismatched_batches_are_refused_before_any_copy(batch, ctx, message):
    x = FakeVariable((4, 3, 8, 8))
    with pytest.raises(ValueError, match=message):
        data.feed(x, batch, ctx)
    assert batch.copies == [] and x.data.calls == []


def test_a_cpu_batch_is_refused_for_a_cuda_context(indexed):  # noqa: F811
    batch, _ = data.make_loader(indexed, 4, train=False, image_size=8)._pipe.run()
    with pytest.raises(ValueError, match="CPU batch cannot be copied into a cudnn:half array"):
        data.copy_to_array(batch, FakeArray((4, 3, 8, 8)), CUDA)


def test_unknown_dtype_is_named(indexed):  # noqa: F811
    with pytest.raises(ValueError, match="dtype must be one of .*'half'.* got 'fp16'"):
        data.make_loader(indexed, 4, dtype="fp16")


def cuda_device_count():
    try:
        from nnabla_ext.cuda import get_device_count
        return get_device_count()
    except Exception:                     # no nnabla-ext-cuda, no driver, no device
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() < 1, reason="needs nnabla-ext-cuda and a GPU (not run "
                    "on the machines this project is built on)")
@pytest.mark.parametrize("dtype", ["float", "half"])
def test_on_a_gpu_the_batch_lands_in_device_memory_unchanged(indexed, dtype):  # noqa: F811
    ctx = get_extension_context("cudnn", device_id="0", type_config=dtype)
    loader = data.make_loader(indexed, 5, train=False, image_size=16, device_id=0, dtype=dtype)
    images, _ = next(loader)
    expected = images.as_cpu().as_array()          # the host round trip, for comparison only
    x = nn.Variable((5, 3, 16, 16))
    with nn.context_scope(ctx):
        data.feed(x, images)
        y = F.mean(x, axis=(2, 3))
        y.forward()
    np.testing.assert_array_equal(x.d, expected)
    np.testing.assert_allclose(y.d, expected.astype(np.float32).mean(axis=(2, 3)), rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() < 1, reason="needs nnabla-ext-cuda and a GPU (not run "
                    "on the machines this project is built on)")
def test_on_a_gpu_training_labels_land_on_the_device(indexed):  # noqa: F811
    """``label.gpu()`` in a training pipeline: the labels reach the label input device to
    device and equal the CPU pipeline's (same seed, same shard order)."""
    ctx = get_extension_context("cudnn", device_id="0")
    kwargs = dict(batch_size=5, rank=0, size=1, train=True, image_size=16, seed=4)
    _, expected = next(data.make_loader(indexed, **kwargs))
    _, labels = next(data.make_loader(indexed, device_id=0, **kwargs))
    t = nn.Variable((5, 1))
    with nn.context_scope(ctx):
        data.feed(t, labels)
    np.testing.assert_array_equal(t.d, expected)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() < 1, reason="needs nnabla-ext-cuda and a GPU (not run "
                    "on the machines this project is built on)")
def test_on_a_gpu_non_blocking_copies_survive_the_next_batches(indexed):  # noqa: F811
    """The copy does not wait on the host: batch k is fed, then DALI runs batches k+1, k+2
    (which may reuse batch k's buffer) before anything reads the input on the device. The
    input must still hold batch k (DALI's stream waits for the copy before it rewrites it)."""
    ctx = get_extension_context("cudnn", device_id="0")
    loader = data.make_loader(indexed, 5, train=False, image_size=16, device_id=0, prefetch=1)
    batches = [next(loader)[0] for _ in range(3)]
    expected = [b.as_cpu().as_array() for b in batches]    # DALI's outputs, read on the host
    x = nn.Variable((5, 3, 16, 16))
    with nn.context_scope(ctx):
        for k in range(len(batches)):
            data.feed(x, batches[k])
            for _ in range(2):
                next(loader)
            y = F.identity(x)
            y.forward()
            np.testing.assert_array_equal(y.d, expected[k], err_msg=f"batch {k}")
