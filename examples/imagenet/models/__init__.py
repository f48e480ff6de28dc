"""Image classification models for the ImageNet example.

Example::

    from models import ARCHS, get_model, is_bn_or_bias
    model = get_model("resnet50", num_classes=1000)          # logits = model(x, test=False)
    decayed = {k: v for k, v in nn.get_parameters().items() if not is_bn_or_bias(k)}
    export_model(model, 224, "runs/x", print)                 # model.h5 and model.nnp
"""
from .files import export_model, load_initial_parameters
from .resnet import ARCHS, get_model, is_bn_or_bias

__all__ = ["ARCHS", "get_model", "is_bn_or_bias", "export_model", "load_initial_parameters"]
