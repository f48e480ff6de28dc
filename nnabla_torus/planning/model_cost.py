"""A model's own cost, counted from its nnabla graph, and its step time priced from it.

A profile knows the measured step time of the models it was calibrated with; a model it does
not know is priced from its own cost instead of borrowing another's: the training FLOPs per
image (forward multiply-adds of every function in ``COUNTED``, x 2 FLOPs, x 3 for forward +
backward), its parameter arrays and bytes, scaled from a calibrated model of the same profile
(same device) that carries ``gflops_per_image``::

    b_ms(model) = b_ms(reference) x gflops(model) / gflops(reference)   (*assumed* law)
    a_ms(model) = a_ms(reference)                                        (fixed cost per step)

The law holds where the device is compute-bound; small networks on CPUs are bound by memory
and per-layer overheads, so the run replaces this estimate with its measured step time after
its first steps (nnabla_torus.planning.step_refit). nnabla 1.39 has no FLOPs counter (none
in nnabla.utils or nnabla.experimental), hence this one. Example::

    >>> import nnabla as nn, nnabla.parametric_functions as PF
    >>> with nn.parameter_scope("count_example"):
    ...     y = PF.affine(PF.convolution(nn.Variable((2, 3, 8, 8)), 4, (3, 3)), 10)
    >>> cost = count_cost(y)
    >>> cost.forward_macs, cost.params          # per image: 4x6x6 x 3x3x3 + 144 x 10; weights
    (5328, 1562)
    >>> cost.param_shapes
    ((4, 3, 3, 3), (4,), (144, 10), (10,))
"""
from collections import namedtuple

import numpy as np

TRAIN_FLOPS_PER_MAC = 6   # 2 FLOPs per multiply-add, x 3 for forward + backward (both grads)

ModelCost = namedtuple("ModelCost", [
    "forward_macs",       # multiply-adds of one image's forward pass
    "params",             # trained parameters (values) the graph reads (gradients all-reduced)
    "gflops_per_image",   # training FLOPs per image / 1e9 (forward + backward)
    "param_shapes",       # shape of each trained parameter array the graph reads, in graph
                          # order: one gradient array each (nnabla's callback: one check each)
    "uncounted",          # names of functions in the graph with multiply-adds not counted
], defaults=[(), ()])

# nnabla functions whose multiply-adds are counted: per output element, the weight's size
# beyond its first axis (convolutions; deconvolutions per input element); Affine and
# BatchMatmul by their matrix shapes. Elementwise functions, pooling and normalisation are
# left out: they are memory-bound, not in the FLOPs law.
CONVOLUTIONS = ("Convolution", "FusedConvolution", "DepthwiseConvolution",
                "DeformableConvolution")
DECONVOLUTIONS = ("Deconvolution", "DepthwiseDeconvolution")
COUNTED = CONVOLUTIONS + DECONVOLUTIONS + ("Affine", "BatchMatmul")
# Functions with multiply-adds this counter does not count: the plan names them.
NOT_COUNTED = ("RNN", "LSTM", "GRU", "Einsum", "AdaptiveSeparableConvolution")


def _macs(func):
    """Forward multiply-adds of one function for its whole batch (0 for other functions)."""
    kind = func.info.type_name
    if kind in CONVOLUTIONS or kind in DECONVOLUTIONS:
        weight = func.inputs[1].shape
        out = func.outputs[0] if kind in CONVOLUTIONS else func.inputs[0]
        return int(np.prod(out.shape)) * int(np.prod(weight[1:]))
    if kind == "Affine":
        x, weight = func.inputs[0], func.inputs[1]
        base_axis = int(func.info.args.get("base_axis", 1))
        return int(np.prod(x.shape[:base_axis])) * int(np.prod(weight.shape))
    if kind == "BatchMatmul":
        a = func.inputs[0].shape
        inner = a[-2] if func.info.args.get("transpose_a", False) else a[-1]
        return int(np.prod(func.outputs[0].shape)) * int(inner)
    return 0


def _key(variable):
    """A parameter's identity across Python wrappers: its shape and its data's buffer."""
    return (variable.shape, variable.data.data.__array_interface__["data"][0])


def count_cost(output, params=None, batch=None):
    """ModelCost of the graph that computes ``output`` (an nnabla Variable): MACs per image and
    the parameter arrays it reads. ``params``: the trained parameter Variables (None: nnabla's
    registered ones with need_grad); ``batch``: images in the graph (None: ``output``'s first
    axis, 1 for a scalar)."""
    import nnabla as nn          # lazily: planning must import without nnabla's start-up
    if batch is None:
        batch = output.shape[0] if output.ndim else 1
    if params is None:
        params = nn.get_parameters(grad_only=True).values()
    # Variables wrap the same buffer in fresh Python objects: match parameters by buffer.
    shapes = {_key(v): tuple(v.shape) for v in params}
    totals, read, uncounted = {"macs": 0}, {}, set()

    def visit(func):
        totals["macs"] += _macs(func)
        if func.info.type_name in NOT_COUNTED:
            uncounted.add(func.info.type_name)
        read.update((k, shapes[k]) for k in map(_key, func.inputs) if k in shapes)
    output.visit(visit)
    macs = totals["macs"] / max(batch, 1)
    return ModelCost(int(macs), int(sum(int(np.prod(s)) for s in read.values())),
                     macs * TRAIN_FLOPS_PER_MAC / 1e9, tuple(read.values()),
                     tuple(sorted(uncounted)))


def reference_model(prof, gflops):
    """Name of the calibrated model of ``prof`` with a known cost nearest ``gflops`` (in
    ratio), or None when no model of ``prof`` carries ``gflops_per_image``."""
    known = (prof.extra or {}).get("gflops_per_image") or {}
    if not known:
        return None
    return min(sorted(known), key=lambda m: abs(np.log(known[m] / gflops)))


def priced_compute(prof, gflops, grad_bytes, max_local_batch, grad_arrays=None):
    """(Compute, note) of a model costing ``gflops`` training GFLOPs per image, scaled from the
    nearest calibrated model of ``prof`` (module doc); ValueError when none has a cost.
    ``grad_arrays``: the model's gradient arrays (0: unknown, nnabla's per-array callback
    checks left out; None: the reference model's, as the example's planner prices a network
    of the reference's family)."""
    ref = reference_model(prof, gflops)
    if ref is None:
        raise ValueError(f"profile {prof.name!r} has no model with gflops_per_image to scale "
                         f"from; calibrate this model with tools/calibrate.py")
    known = prof.extra["gflops_per_image"][ref]
    base = prof.models[ref]
    comp = base._replace(b_s=base.b_s * gflops / known, grad_bytes=int(grad_bytes),
                         max_local_batch=int(max_local_batch),
                         grad_arrays=base.grad_arrays if grad_arrays is None else grad_arrays)
    note = (f"priced from its own cost: {gflops:.3g} training GFLOPs per image against "
            f"{ref}'s {known:.3g} on profile {prof.name} (b = {comp.b_s * 1e3:.4g} ms per "
            f"image, a = {comp.a_s * 1e3:.3g} ms per step, *assumed* to scale with FLOPs; the "
            f"run's own step times replace it once measured)")
    return comp, note
