"""A model's own cost, counted from its nnabla graph, and its step time priced from it.

A profile knows the measured step time of the models it was calibrated with; a model it does
not know is priced from its own cost instead of borrowing another's: the training FLOPs per
image (forward multiply-adds of every Convolution, Deconvolution and Affine, x 2 FLOPs, x 3
for forward + backward) and the parameter bytes, scaled from a calibrated model of the same
profile (same device) that carries ``gflops_per_image``::

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
"""
from collections import namedtuple

import numpy as np

TRAIN_FLOPS_PER_MAC = 6   # 2 FLOPs per multiply-add, x 3 for forward + backward (both grads)

ModelCost = namedtuple("ModelCost", [
    "forward_macs",       # multiply-adds of one image's forward pass
    "params",             # trained parameters (values) the graph reads (gradients all-reduced)
    "gflops_per_image",   # training FLOPs per image / 1e9 (forward + backward)
])


def _macs(func):
    """Forward multiply-adds of one function for its whole batch (0 for other functions)."""
    kind = func.info.type_name
    if kind in ("Convolution", "Deconvolution", "DepthwiseConvolution"):
        weight = func.inputs[1].shape
        out = func.outputs[0] if kind != "Deconvolution" else func.inputs[0]
        return int(np.prod(out.shape)) * int(np.prod(weight[1:]))
    if kind == "Affine":
        x, weight = func.inputs[0], func.inputs[1]
        base_axis = int(func.info.args.get("base_axis", 1))
        return int(np.prod(x.shape[:base_axis])) * int(np.prod(weight.shape))
    return 0


def _key(variable):
    """A parameter's identity across Python wrappers: its shape and its data's buffer."""
    return (variable.shape, variable.data.data.__array_interface__["data"][0])


def count_cost(output):
    """ModelCost of the graph that computes ``output`` (an nnabla Variable whose first axis is
    the batch): MACs per image and the parameters it reads."""
    import nnabla as nn          # lazily: planning must import without nnabla's start-up
    batch = output.shape[0] if output.ndim else 1
    # Variables wrap the same buffer in fresh Python objects: match parameters by buffer.
    params = {_key(v): v.size for v in nn.get_parameters(grad_only=True).values()}
    totals, read = {"macs": 0}, set()

    def visit(func):
        totals["macs"] += _macs(func)
        read.update(k for k in map(_key, func.inputs) if k in params)
    output.visit(visit)
    macs = totals["macs"] / max(batch, 1)
    return ModelCost(int(macs), int(sum(params[k] for k in read)),
                     macs * TRAIN_FLOPS_PER_MAC / 1e9)


def reference_model(prof, gflops):
    """Name of the calibrated model of ``prof`` with a known cost nearest ``gflops`` (in
    ratio), or None when no model of ``prof`` carries ``gflops_per_image``."""
    known = (prof.extra or {}).get("gflops_per_image") or {}
    if not known:
        return None
    return min(sorted(known), key=lambda m: abs(np.log(known[m] / gflops)))


def priced_compute(prof, gflops, grad_bytes, max_local_batch):
    """(Compute, note) of a model costing ``gflops`` training GFLOPs per image, scaled from the
    nearest calibrated model of ``prof`` (module doc); ValueError when none has a cost."""
    ref = reference_model(prof, gflops)
    if ref is None:
        raise ValueError(f"profile {prof.name!r} has no model with gflops_per_image to scale "
                         f"from; calibrate this model with tools/calibrate.py")
    known = prof.extra["gflops_per_image"][ref]
    base = prof.models[ref]
    comp = base._replace(b_s=base.b_s * gflops / known, grad_bytes=int(grad_bytes),
                         max_local_batch=int(max_local_batch))
    note = (f"priced from its own cost: {gflops:.3g} training GFLOPs per image against "
            f"{ref}'s {known:.3g} on profile {prof.name} (b = {comp.b_s * 1e3:.4g} ms per "
            f"image, a = {comp.a_s * 1e3:.3g} ms per step, *assumed* to scale with FLOPs; the "
            f"run's own step times replace it once measured)")
    return comp, note
