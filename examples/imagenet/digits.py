"""Embedded default dataset: scikit-learn's handwritten digits written in the ImageNet layout.

``load_digits`` holds 1,797 grey 8x8 images of 10 classes (bundled with scikit-learn, no
download). They are upscaled to 32x32 RGB and written once as JPEG (quality 95)::

    root/train/digit<k>/digit_<index>.JPEG   class folders, 1,438 images (80 % of each class)
    root/val/digit_<index>.JPEG              flat, 359 images (20 %)
    root/train.txt, root/val.txt             "relative/path label" lists (nnabla-examples format)
    root/VERSION                             written last: its presence marks a complete build

The split is stratified and seeded, so every build is identical. The build goes to a temporary
folder renamed into place under a file lock, so concurrent ranks build it once and an
interrupted build is redone. Example::

    import digits, data
    root = digits.ensure_digits_dataset()          # ~/.cache/nnabla_torus/digits
    train_set = data.read_dataset(f"{root}/train", f"{root}/train.txt")
"""
import fcntl
import glob
import os
import shutil

import numpy as np

from image_lists import write_list

VERSION = "digits-v1 32px jpeg95 split80/20 seed0"
IMAGE_SIZE = 32      # pixels per side of the written images
JPEG_QUALITY = 95
VAL_FRACTION = 0.2
SPLIT_SEED = 0
CACHE_ENV = "NNABLA_TORUS_DATA_CACHE"


def default_root():
    """Return $NNABLA_TORUS_DATA_CACHE, else ~/.cache/nnabla_torus/digits."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "nnabla_torus", "digits")


def ensure_digits_dataset(root=None):
    """Build the digits dataset at ``root`` (default: ``default_root()``) unless built; return root."""
    root = os.path.abspath(os.path.expanduser(root or default_root()))
    if _is_complete(root):
        return root
    os.makedirs(os.path.dirname(root), exist_ok=True)
    with open(root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # other ranks wait here, then find it built
        if not _is_complete(root):
            _build(root)
    return root


def _is_complete(root):
    marker = os.path.join(root, "VERSION")
    return os.path.isfile(marker) and open(marker).read().strip() == VERSION


def _build(root):
    # Under the lock, any temporary folder left here is from a build that was killed.
    for stale in glob.glob(glob.escape(root) + ".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = f"{root}.tmp-{os.getpid()}"
    images, labels = _load_images()
    train_idx, val_idx = _split(labels)
    train_entries = [(f"digit{labels[i]}/digit_{i:04d}.JPEG", labels[i]) for i in train_idx]
    val_entries = [(f"digit_{i:04d}.JPEG", labels[i]) for i in val_idx]
    for folder, entries, indices in (("train", train_entries, train_idx),
                                     ("val", val_entries, val_idx)):
        for (name, _), i in zip(entries, indices):
            _save_jpeg(images[i], os.path.join(tmp, folder, name))
        write_list(os.path.join(tmp, f"{folder}.txt"), entries)
    with open(os.path.join(tmp, "VERSION"), "w") as f:
        f.write(VERSION + "\n")
    # An old or half-written copy (no VERSION, or another version) is replaced as a whole.
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)


def _load_images():
    """Return uint8 RGB images (n, IMAGE_SIZE, IMAGE_SIZE, 3) and int labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    grey = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)   # values are 0..16
    big = [np.asarray(Image.fromarray(g).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC))
           for g in grey]
    return np.repeat(np.stack(big)[..., None], 3, axis=3), digits.target.astype(int)


def _split(labels):
    """Return (train, val) index arrays: a seeded split stratified by class."""
    rng = np.random.default_rng(SPLIT_SEED)
    train, val = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_val = int(round(len(members) * VAL_FRACTION))
        val += members[:n_val].tolist()
        train += members[n_val:].tolist()
    return np.sort(train), np.sort(val)


def _save_jpeg(image, path):
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(image).save(path, format="JPEG", quality=JPEG_QUALITY)
