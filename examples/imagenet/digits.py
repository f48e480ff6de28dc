"""Embedded default dataset: scikit-learn's handwritten digits written in the ImageNet layout.

``load_digits`` holds 1,797 grey 8x8 images of 10 classes (bundled with scikit-learn, no
download). They are upscaled to 32x32 RGB and written once as JPEG (quality 95) by
embedded.py::

    root/train/digit<k>/digit_<index>.JPEG   class folders, 1,438 images (80 % of each class)
    root/val/digit_<index>.JPEG              flat, 359 images (20 %)
    root/train.txt, root/val.txt             "relative/path label" lists (nnabla-examples format)
    root/VERSION                             written last: its presence marks a complete build

The split is stratified and seeded, so every build is identical. Example::

    import digits, data
    root = digits.ensure_digits_dataset()          # ~/.cache/nnabla_torus/digits
    train_set = data.read_dataset(f"{root}/train", f"{root}/train.txt")
"""
import numpy as np

import embedded
from embedded import CACHE_ENV  # noqa: F401  (tests read it here)

VERSION = "digits-v1 32px jpeg95 split80/20 seed0"
IMAGE_SIZE = 32      # pixels per side of the written images
VAL_FRACTION = 0.2
SPLIT_SEED = 0


def default_root():
    """Return $NNABLA_TORUS_DATA_CACHE/digits, else ~/.cache/nnabla_torus/digits."""
    return embedded.default_root("digits")


def ensure_digits_dataset(root=None):
    """Build the digits dataset at ``root`` (default: ``default_root()``) unless built; return
    root."""
    return embedded.ensure(BUILD, root or default_root())


def _make():
    """Return uint8 RGB images (n, IMAGE_SIZE, IMAGE_SIZE, 3), int labels and the split."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)   # values are 0..16
    big = [np.asarray(Image.fromarray(g).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC))
           for g in grey]
    labels = digits.target.astype(int)
    return (np.repeat(np.stack(big)[..., None], 3, axis=3), labels,
            *embedded.stratified_split(labels, VAL_FRACTION, SPLIT_SEED))


BUILD = embedded.Build(VERSION, _make, "digit", "JPEG")
