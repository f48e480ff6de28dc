"""The compute the example's planner plans a network with, from the cluster profile.

The profile's own entry of the network, else one priced from the network's FLOPs
(``nnabla_torus.planning.model_cost``), else another network's, with a note that says which.
"""
from nnabla_torus.planning import model_cost


def model_key(arch, width, image_size):
    """The profile's name for the example's network, as tools/calibrate.py writes it."""
    return f"{arch}-w{width:g}-{image_size}px"


def find_compute(prof, arch, width, image_size, gflops_per_image=None):
    """(model name, Compute, note) of the compute to plan with, before any measured step.

    The exact ``arch-wW-Spx`` entry, else ``arch`` itself for the full-width network (ABCI's
    ``resnet50``), else the network priced from its own cost (``gflops_per_image``, scaled from
    the profile's calibrated model nearest in FLOPs: model_cost.priced_compute), else (a
    profile without FLOPs, or no count) the profile's entry of the same architecture or its
    first one, whose step times are another network's; the note says which.
    """
    key = model_key(arch, width, image_size)
    if key in prof.models:
        return key, prof.models[key], ""
    if width == 1 and arch in prof.models:
        return arch, prof.models[arch], ""
    if gflops_per_image and model_cost.reference_model(prof, gflops_per_image):
        comp, note = model_cost.priced_compute(prof, gflops_per_image, 1, 1)
        return key, comp, f"profile {prof.name} has no {key}: {note}"
    same_arch = sorted(m for m in prof.models if m.split("-")[0] == arch)
    borrowed = (same_arch or sorted(prof.models))[0]
    return key, prof.models[borrowed], (
        f"profile {prof.name} has no {key} and no FLOPs to scale from: compute time from "
        f"{borrowed} (calibrate this model with tools/calibrate.py --add-model-to)")
