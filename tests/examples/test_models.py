"""ResNet models of the ImageNet example: parameter counts, small inputs, zero-init, names."""
import os
import sys

import nnabla as nn
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
from models import get_model, is_bn_or_bias  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_parameters():
    nn.clear_parameters()
    yield
    nn.clear_parameters()


def build(arch, num_classes, size, batch=1, **kwargs):
    x = nn.Variable((batch, 3, size, size))
    with nn.parameter_scope("net"):
        y = get_model(arch, num_classes, **kwargs)(x, test=False)
    return x, y


def trainable_count():
    return sum(int(np.prod(v.shape)) for v in nn.get_parameters(grad_only=True).values())


@pytest.mark.parametrize("arch, count", [
    ("resnet50", 25_557_032),   # the published figure (and torchvision's)
    ("resnet18", 11_689_512),   # torchvision's figures for the same networks
    ("resnet34", 21_797_672),
])
def test_parameter_count_at_1000_classes(arch, count):
    build(arch, 1000, 64, small_stem=False)   # the count does not depend on the input size
    assert trainable_count() == count


@pytest.mark.parametrize("size", [32, 8])
def test_resnet18_quarter_width_trains_on_small_inputs(size):
    nn.seed(0)
    x, y = build("resnet18", 10, size, batch=4, width=0.25)
    assert y.shape == (4, 10)
    x.d = np.random.default_rng(0).standard_normal(x.shape)
    loss = nn.functions.mean(y ** 2)
    loss.forward()
    loss.backward()
    assert np.isfinite(y.d).all()
    grads = [v.g for v in nn.get_parameters().values()]
    assert all(np.isfinite(g).all() for g in grads)
    assert nn.get_parameters()["net/res1/block1/conv1/conv/W"].shape == (16, 16, 3, 3)


def test_small_stem_is_picked_below_64_pixels():
    build("resnet18", 10, 32, width=0.25)
    assert nn.get_parameters()["net/conv1/conv/W"].shape == (16, 3, 3, 3)
    nn.clear_parameters()
    build("resnet18", 10, 64, width=0.25)
    assert nn.get_parameters()["net/conv1/conv/W"].shape == (16, 3, 7, 7)
    nn.clear_parameters()
    build("resnet18", 10, 64, width=0.25, small_stem=True)
    assert nn.get_parameters()["net/conv1/conv/W"].shape == (16, 3, 3, 3)


@pytest.mark.parametrize("arch, last, blocks",
                         [("resnet18", "conv2", 8), ("resnet50", "conv3", 16)])
def test_last_bn_gamma_of_every_block_starts_at_zero(arch, last, blocks):
    build(arch, 10, 32, width=0.25)
    gammas = {k: v.d for k, v in nn.get_parameters().items() if k.endswith("/gamma")}
    zero = {k for k, d in gammas.items() if not d.any()}
    assert len(zero) == blocks
    assert all(k.endswith(f"/{last}/bn/gamma") and "/block" in k for k in zero)
    assert all((d == 1).all() for k, d in gammas.items() if k not in zero)


@pytest.mark.parametrize("kind, channels", [("basic", 8), ("bottleneck", 2)])
def test_residual_blocks_start_as_identity(kind, channels):
    # The last BN (gamma 0, beta 0) outputs zeros, so the block gives relu(x) = x for x >= 0.
    from models.resnet import _block
    x = nn.Variable((2, 8, 6, 6))
    x.d = np.abs(np.random.default_rng(0).standard_normal(x.shape)).astype(np.float32)
    y = _block(kind, x, channels, 1, test=True)
    y.forward()
    np.testing.assert_array_equal(y.d, x.d)


def test_bn_and_bias_names():
    build("resnet18", 10, 32, width=0.25)
    names = nn.get_parameters(grad_only=True).keys()
    no_decay = [k for k in names if is_bn_or_bias(k)]
    decay = [k for k in names if not is_bn_or_bias(k)]
    assert "net/fc/affine/b" in no_decay and "net/fc/affine/W" in decay
    assert all(k.endswith(("/beta", "/gamma", "/b")) for k in no_decay)
    assert all(k.endswith("/W") for k in decay)


@pytest.mark.parametrize("kwargs, message", [
    (dict(arch="resnet101", num_classes=10), "unknown arch"),
    (dict(arch="resnet18", num_classes=0), "num_classes"),
    (dict(arch="resnet18", num_classes=10, width=0), "width"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        get_model(**kwargs)


def conv_strides(y):
    """(kernel, stride) of every convolution in the graph of ``y``, inputs first."""
    found = []
    y.visit(lambda f: found.append((f.inputs[1].shape[2], f.info.args["stride"][0]))
            if f.info.type_name == "Convolution" else None)
    return found


@pytest.mark.parametrize("stride_on, strided", [("3x3", {3: 3, 1: 3}), ("1x1", {1: 6})])
def test_stride_on_picks_the_bottleneck_conv_that_downsamples(stride_on, strided):
    _, y = build("resnet50", 10, 64, width=0.0625, stride_on=stride_on)
    # Stages 2-4 downsample in their first block's main path and shortcut (a 1x1/2 each);
    # the stem's 7x7/2 aside, v1.5 strides the 3x3, v1 the first 1x1.
    kernels = [k for k, s in conv_strides(y) if s == 2 and k != 7]
    assert {k: kernels.count(k) for k in set(kernels)} == strided
    assert y.shape == (1, 10)


def test_last_gamma_can_start_at_one():
    build("resnet18", 10, 32, width=0.25, zero_init_last_gamma=False)
    gammas = {k: v.d for k, v in nn.get_parameters().items() if k.endswith("conv2/bn/gamma")}
    assert gammas and all(np.all(g == 1.0) for g in gammas.values())
    with pytest.raises(ValueError, match=r"stride_on must be one of \('3x3', '1x1'\)"):
        get_model("resnet50", 10, stride_on="2x2")
