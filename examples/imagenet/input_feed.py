"""Write a batch from a ``data.Loader`` into the graph's input: numpy, nnabla or DALI, host or GPU.

A GPU batch is copied device to device on the stream nnabla-ext-cuda computes on, without a
host wait (``copy_to_array``).
"""
import ctypes

import numpy as np

LEGACY_DEFAULT_STREAM = ctypes.c_void_p(0)       # CUDA stream 0, nnabla-ext-cuda's compute stream


def feed(variable, images, ctx=None):
    """Write a batch from a ``Loader`` into ``variable``, the graph's input.

    numpy (CPU pipeline): ``variable.d = images``, as before. A DALI batch (GPU pipeline): copied
    into ``variable``'s array in ``ctx`` (default: the current context) by ``copy_to_array``.
    An nnabla NdArray (a batch already on the device, e.g. tools/train_bench.py's): copied on
    the device in the current context's dtype (``copy_from``: ``F.identity``), no host copy.
    """
    if isinstance(images, np.ndarray):
        variable.d = images
        return
    import nnabla as nn               # here, so that the list tools run without loading nnabla
    if isinstance(images, nn.NdArray):
        variable.data.copy_from(images)
    else:
        copy_to_array(images, variable.data, ctx or nn.get_current_context())



def copy_to_array(batch, array, ctx):
    """Copy a dense DALI batch into nnabla NdArray ``array`` as ``ctx``'s array, in its dtype.

    The way of nnabla-ext-cuda's ``DaliIterator`` (``feed_ndarray`` in
    ``nnabla_ext/cuda/experimental/_dali_iterator.py``): ``array.data_ptr(dtype, ctx,
    write_only=True)`` (write-only: no zero-fill racing the copy) and DALI's ``copy_to_external``.
    A GPU batch goes device to device on CUDA's legacy default stream, where nnabla-ext-cuda runs
    its kernels: the copy waits for the previous step's kernels that still read the input, the
    next forward waits for the copy. Non-blocking (the host does not wait, 0 syncs per
    micro-batch instead of 1): DALI enqueues the copy on the given stream after making the
    batch's own stream wait for it, and with ``non_blocking`` makes the batch's stream (not the
    host) wait for the copy, so DALI's next write into that buffer comes after it (NVIDIA/DALI
    ``dali/python/backend_impl.cc`` ``CopyToExternalImplGPU``: ``wait_order = non_blocking ?
    src.order() : AccessOrder::host()``; ``dali/pipeline/data/copy_to_external.h``
    ``CopyToExternalImpl``; read at commit 66e46c0, the installed 2.4.0 has the same
    ``non_blocking`` argument). nnabla-ext-cuda's own iterator refuses ``non_blocking``
    (``_dali_iterator.py`` ~60-75, v1.39.0), written for DALI versions where the host was the
    only order. A CPU batch (CPU context) is a host memcpy.
    """
    on_gpu = hasattr(batch, "device_id")          # TensorListGPU; a TensorListCPU has no device
    if on_gpu != (ctx.backend[0].split(":")[0] in ("cuda", "cudnn")):
        raise ValueError(f"a DALI {'GPU' if on_gpu else 'CPU'} batch cannot be copied into a "
                         f"{ctx.backend[0]} array; build the loader with device_id=None for a "
                         f"CPU context and with the context's GPU id for a CUDA one")
    if on_gpu and batch.device_id() != int(ctx.device_id):
        raise ValueError(f"the DALI batch is on GPU {batch.device_id()} but the context uses "
                         f"GPU {ctx.device_id}; build the loader with device_id={ctx.device_id}")
    tensor = batch.as_tensor()                    # a view; ``batch`` keeps the memory alive
    if tuple(tensor.shape()) != tuple(array.shape):
        raise ValueError(f"a DALI batch of shape {tuple(tensor.shape())} cannot fill an input of "
                         f"shape {tuple(array.shape)}; build the loader with the graph's batch "
                         f"and image size")
    from nvidia.dali.types import to_numpy_type
    pointer = ctypes.c_void_p(array.data_ptr(to_numpy_type(tensor.dtype), ctx, True))
    if on_gpu:
        tensor.copy_to_external(pointer, cuda_stream=LEGACY_DEFAULT_STREAM, non_blocking=True)
    else:
        tensor.copy_to_external(pointer)
