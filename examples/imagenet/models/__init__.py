"""Image classification models for the ImageNet example: the ResNets (resnet.py) and an MLP
(mlp.py, for the small flat inputs of the ``clusters`` task).

Example::

    from models import ARCHS, get_model, is_bn_or_bias
    model = get_model("resnet50", num_classes=1000)          # logits = model(x, test=False)
    decayed = {k: v for k, v in nn.get_parameters().items() if not is_bn_or_bias(k)}
    export_model(model, 224, "runs/x", print)                 # model.h5 and model.nnp
"""
from .files import export_model, load_initial_parameters
from . import mlp, resnet
from .resnet import is_bn_or_bias

ARCHS = (*resnet.ARCHS, *mlp.ARCHS)


def get_model(arch, num_classes, width=1.0, **resnet_options):
    """Return ``model(x, test) -> logits`` of ``arch`` (one of ``ARCHS``); ``resnet_options``
    (small_stem, stride_on, zero_init_last_gamma) apply to the ResNets only."""
    if arch in mlp.ARCHS:
        return mlp.get_mlp(num_classes, width)
    if arch not in resnet.ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    return resnet.get_model(arch, num_classes, width, **resnet_options)


__all__ = ["ARCHS", "get_model", "is_bn_or_bias", "export_model", "load_initial_parameters"]
