"""ResNet-18/34/50 with fused batch norm, width multiplier, any input size.

Parameters are created in the caller's ``nn.parameter_scope`` under names such as
``res2/block1/conv3/conv/W`` and ``res2/block1/conv3/bn/gamma``. Two variants are parameters
(defaults first): a bottleneck's stride on its 3x3 conv (``stride_on="3x3"``, ResNet v1.5 as
NVIDIA's DeepLearningExamples) or on its first 1x1 conv (``"1x1"``, He et al. 2016's v1);
the last BN gamma of every residual block starting at zero, so each block starts as the
identity (``zero_init_last_gamma=True``, Goyal et al. 2017), or at one.
Inputs below ``SMALL_STEM_BELOW`` pixels get a "small stem" (3x3 conv, stride 1, no max-pool,
as CIFAR ResNets) unless ``small_stem`` says otherwise: 32 px, even 8 px inputs work.
Parameter initialisers draw from ``nnabla.random.prng``; seed it (``nn.seed``) identically on
every rank or broadcast the parameters. Example::

    import nnabla as nn
    from models import get_model
    model = get_model("resnet18", num_classes=10, width=0.25)
    x = nn.Variable((8, 3, 32, 32))
    with nn.parameter_scope("net"):
        logits = model(x, test=False)        # (8, 10)
"""
import math

import nnabla as nn
import nnabla.functions as F
import nnabla.initializer as I
import nnabla.parametric_functions as PF

# arch -> (block kind, blocks per stage); ResNet-50 uses 4x wider bottleneck outputs.
ARCHS = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
}
STAGE_CHANNELS = (64, 128, 256, 512)   # at width 1.0 (bottleneck: inner channels)
BOTTLENECK_EXPANSION = 4
SMALL_STEM_BELOW = 64                  # pixels; smaller inputs get the 3x3 stride-1 stem
NO_DECAY_NAMES = ("beta", "gamma", "b", "mean", "var")   # last component of a parameter name
STRIDE_ON = ("3x3", "1x1")


def get_model(arch, num_classes, width=1.0, small_stem=None, stride_on="3x3",
              zero_init_last_gamma=True):
    """Return ``model(x, test) -> logits`` for x of shape (batch, 3, H, W), logits (batch, classes).

    arch: one of ``ARCHS``. width: channel multiplier (0.25 gives 16-32-64-128 stages).
    small_stem: True/False forces the stem; None picks the small stem when min(H, W) < 64.
    stride_on, zero_init_last_gamma: the variants of the module doc.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    if not (isinstance(num_classes, int) and num_classes >= 1):
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    if not width > 0:
        raise ValueError(f"width must be > 0 (1.0 = the published network), got {width!r}")
    if stride_on not in STRIDE_ON:
        raise ValueError(f"stride_on must be one of {STRIDE_ON} (3x3: ResNet v1.5), "
                         f"got {stride_on!r}")
    kind, depths = ARCHS[arch]
    last_gamma = I.ConstantInitializer(0.0 if zero_init_last_gamma else 1.0)

    def model(x, test):
        small = min(x.shape[2:]) < SMALL_STEM_BELOW if small_stem is None else small_stem
        h = _stem(x, _scaled(64, width), small, test)
        for stage, (depth, channels) in enumerate(zip(depths, STAGE_CHANNELS)):
            for index in range(depth):
                stride = 2 if stage > 0 and index == 0 else 1
                with nn.parameter_scope(f"res{stage + 1}/block{index + 1}"):
                    h = _block(kind, h, _scaled(channels, width), stride, test,
                               stride_on, last_gamma)
        return _classifier(F.mean(h, axis=(2, 3)), num_classes)

    return model


def is_bn_or_bias(name):
    """True for BN (beta, gamma, running stats) and bias parameters, which get no weight decay."""
    return name.rsplit("/", 1)[-1] in NO_DECAY_NAMES


def _scaled(channels, width):
    return max(1, int(round(channels * width)))


def _conv(x, channels, kernel, stride=1):
    # He initialisation on fan-out, as torchvision's ResNet.
    sigma = I.calc_normal_std_he_backward(x.shape[1], channels, kernel=(kernel, kernel))
    return PF.convolution(x, channels, (kernel, kernel), pad=(kernel // 2,) * 2,
                          stride=(stride, stride), with_bias=False,
                          w_init=I.NormalInitializer(sigma))


def _conv_bn_relu(x, channels, kernel, stride, test):
    return PF.fused_batch_normalization(_conv(x, channels, kernel, stride), batch_stat=not test)


def _stem(x, channels, small, test):
    with nn.parameter_scope("conv1"):
        if small:
            return _conv_bn_relu(x, channels, 3, 1, test)
        h = _conv_bn_relu(x, channels, 7, 2, test)
    return F.max_pooling(h, (3, 3), (2, 2), pad=(1, 1))


def _block(kind, x, channels, stride, test, stride_on="3x3", last_gamma=None):
    """One residual block: relu(bn_last(f(x)) + shortcut(x)); bn_last's gamma: ``last_gamma``."""
    if kind == "basic":
        out_channels = channels
        with nn.parameter_scope("conv1"):
            h = _conv_bn_relu(x, channels, 3, stride, test)
        with nn.parameter_scope("conv2"):
            h = _conv(h, channels, 3)
        last = "conv2"
    else:
        out_channels = channels * BOTTLENECK_EXPANSION
        first, middle = (1, stride) if stride_on == "3x3" else (stride, 1)
        with nn.parameter_scope("conv1"):
            h = _conv_bn_relu(x, channels, 1, first, test)
        with nn.parameter_scope("conv2"):
            h = _conv_bn_relu(h, channels, 3, middle, test)
        with nn.parameter_scope("conv3"):
            h = _conv(h, out_channels, 1)
        last = "conv3"
    shortcut = _shortcut(x, out_channels, stride, test)
    with nn.parameter_scope(last):
        return PF.fused_batch_normalization(h, shortcut, batch_stat=not test,
                                            param_init={"gamma": last_gamma or
                                                        I.ConstantInitializer(0.0)})


def _shortcut(x, channels, stride, test):
    if stride == 1 and x.shape[1] == channels:
        return x
    with nn.parameter_scope("shortcut"):
        return PF.batch_normalization(_conv(x, channels, 1, stride), batch_stat=not test)


def _classifier(features, num_classes):
    limit = 1.0 / math.sqrt(features.shape[1])   # torchvision's nn.Linear default
    with nn.parameter_scope("fc"):
        return PF.affine(features, num_classes, w_init=I.UniformInitializer((-limit, limit)),
                         b_init=I.UniformInitializer((-limit, limit)))
