"""Generated embedded data sets, made from a seed (no download): ``clusters`` and ``shapes``.

Two tasks beside the digits whose best fixed batch differs (recipes ``clusters-mlp`` and
``shapes-cpu``), written by embedded.py in the ImageNet layout (PNG: lossless)::

    clusters  100,000 RGB 8x8 images of 10 classes: class k's images are Gaussian around a
              smooth mean image mu_k (a 2x2x3 N(0, 1) grid upsampled bilinearly), every pixel
              mu_k * 0.28 + N(0, 1) noise, stored as 128 + 40 x (clipped to 0..255); 25 % of
              the *training* labels are replaced by another class drawn uniformly (validation
              labels are the true ones). A noisy-gradient task for an MLP: the classes overlap
              (nearest-mean, the Bayes rule here, scores ~0.86 on validation) and a quarter of
              the training gradients point the wrong way (label noise as in Zhang et al.,
              "Understanding deep learning requires rethinking generalization", ICLR 2017, 3.1).
    shapes    8,000 RGB 16x16 images of 4 shape classes (disc, square, triangle, cross), each
              turned by up to +-0.3 rad at a random position and size, in a random light colour
              (each channel 128-255) on a random dark one (0-127), with N(0, 10) pixel noise.
              A clean task for a small ResNet (its per-image compute, not the step, dominates
              a CPU step).

Both are split 80/20 (stratified, seeded); the same seed gives the same files. Example::

    import embedded
    root = embedded.ensure_dataset("clusters")     # ~/.cache/nnabla_torus/clusters, ~20 s once
"""
import numpy as np

from embedded import Build, stratified_split

VAL_FRACTION = 0.2
SEED = 0                 # the generators' and the split's seed

CLUSTERS = dict(images=100_000, classes=10, size=8, grid=2, signal=0.28, label_noise=0.25,
                scale=40.0)  # signal: mean amplitude / noise std (0.28: nearest-mean ~0.86)
SHAPES = dict(images=8_000, classes=4, size=16, noise=10.0, turn=0.3)
SHAPE_NAMES = ("disc", "square", "triangle", "cross")


def make_clusters(images=CLUSTERS["images"], seed=SEED, p=CLUSTERS):
    """(uint8 images (n, 8, 8, 3), labels, train indices, val indices) of ``clusters``;
    training labels carry the label noise, validation labels are the true classes."""
    rng = np.random.default_rng([seed, 1])
    means = smooth_means(rng, p["classes"], p["size"], p["grid"])
    truth = rng.permutation(np.arange(images) % p["classes"])
    x = means[truth] * p["signal"] + rng.standard_normal((images, p["size"], p["size"], 3))
    pixels = np.clip(np.round(128 + p["scale"] * x), 0, 255).astype(np.uint8)
    train, val = stratified_split(truth, VAL_FRACTION, seed)
    labels = truth.copy()
    flip = train[rng.random(len(train)) < p["label_noise"]]
    # another class, uniform over the other classes-1
    labels[flip] = (truth[flip] + rng.integers(1, p["classes"], len(flip))) % p["classes"]
    return pixels, labels, train, val


def smooth_means(rng, classes, size, grid):
    """(classes, size, size, 3) class mean images of per-pixel std ~1: a (grid, grid, 3)
    N(0, 1) grid each, upsampled bilinearly (corners aligned) to size x size."""
    coarse = rng.standard_normal((classes, grid, grid, 3))
    t = np.linspace(0, grid - 1, size)                  # pixel centres in grid units
    weights = np.maximum(0, 1 - np.abs(t[:, None] - np.arange(grid)[None, :]))  # (size, grid)
    return np.einsum("ia,kabc,jb->kijc", weights, coarse, weights)


def make_shapes(images=SHAPES["images"], seed=SEED, p=SHAPES):
    """(uint8 images (n, 16, 16, 3), labels, train indices, val indices) of ``shapes``."""
    rng = np.random.default_rng([seed, 2])
    size = p["size"]
    labels = rng.permutation(np.arange(images) % p["classes"])
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    out = np.empty((images, size, size, 3), np.uint8)
    for i, label in enumerate(labels):
        radius = rng.uniform(0.3, 0.45) * size
        cy, cx = rng.uniform(radius, size - radius, 2)
        angle = rng.uniform(-p["turn"], p["turn"])
        mask = shape_mask(label, (yy - cy) / radius, (xx - cx) / radius, angle)
        background, foreground = rng.uniform(0, 127, 3), rng.uniform(128, 255, 3)
        image = np.where(mask[..., None], foreground, background)
        image = image + rng.normal(0, p["noise"], image.shape)
        out[i] = np.clip(np.round(image), 0, 255).astype(np.uint8)
    return (out, labels, *stratified_split(labels, VAL_FRACTION, seed))


def shape_mask(label, dy, dx, angle):
    """Boolean mask of shape ``SHAPE_NAMES[label]`` in coordinates (dy, dx) in radii from its
    centre, turned by ``angle`` (radians)."""
    c, s = np.cos(angle), np.sin(angle)
    u, v = c * dx + s * dy, -s * dx + c * dy
    r = np.hypot(u, v)
    name = SHAPE_NAMES[label]
    if name == "disc":
        return r <= 1
    if name == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.75
    if name == "triangle":      # equilateral, circumradius 1
        return (v >= -0.5) & (np.sqrt(3) * u + v <= 1) & (-np.sqrt(3) * u + v <= 1)
    # cross
    return ((np.abs(u) <= 0.3) | (np.abs(v) <= 0.3)) & (np.maximum(np.abs(u), np.abs(v)) <= 1)


BUILDS = {
    "clusters": Build(f"clusters-v1 {CLUSTERS} split80/20 seed{SEED} png", make_clusters,
                      "class", "PNG"),
    "shapes": Build(f"shapes-v5 {SHAPES} {SHAPE_NAMES} split80/20 seed{SEED} png", make_shapes,
                    "shape", "PNG"),
}
