"""A multilayer perceptron for small flat inputs (the ``clusters`` task): the image flattened,
two hidden ReLU layers of ``round(256 x width)`` units, a linear classifier.

Parameters are named ``fc1/affine/W``, ``fc2/...``, ``fc/affine/W`` (biases ``b``, no weight
decay: ``is_bn_or_bias``). He initialisation on the hidden layers (He et al., "Delving Deep into
Rectifiers", ICCV 2015, 2.2); the classifier as the ResNets' (torchvision's nn.Linear).
Example::

    model = get_mlp(num_classes=10, width=1.0)
    logits = model(nn.Variable((8, 3, 8, 8)), test=False)      # (8, 10)
"""
import math

import nnabla as nn
import nnabla.functions as F
import nnabla.initializer as I
import nnabla.parametric_functions as PF

ARCHS = ("mlp",)
HIDDEN = 256             # units per hidden layer at width 1.0
DEPTH = 2                # hidden layers


def get_mlp(num_classes, width=1.0):
    """Return ``model(x, test) -> logits`` for x of shape (batch, ...), logits (batch, classes)."""
    if not width > 0:
        raise ValueError(f"width must be > 0 (1.0 = {HIDDEN} hidden units), got {width!r}")
    units = max(1, int(round(HIDDEN * width)))

    def model(x, test):
        h = F.reshape(x, (x.shape[0], -1))
        for layer in range(1, DEPTH + 1):
            sigma = I.calc_normal_std_he_forward(h.shape[1], units)
            with nn.parameter_scope(f"fc{layer}"):
                h = F.relu(PF.affine(h, units, w_init=I.NormalInitializer(sigma)))
        limit = 1.0 / math.sqrt(h.shape[1])
        with nn.parameter_scope("fc"):
            return PF.affine(h, num_classes, w_init=I.UniformInitializer((-limit, limit)),
                             b_init=I.UniformInitializer((-limit, limit)))

    return model
