"""Embedded data sets (made here, no download), written once in the ImageNet layout.

A set is uint8 RGB images and int labels, split into train and val and written as::

    root/train/<prefix><k>/<prefix>_<index>.<EXT>   class folders
    root/val/<prefix>_<index>.<EXT>                 flat
    root/train.txt, root/val.txt                    "relative/path label" lists (nnabla-examples)
    root/VERSION                                    written last: marks a complete build
    root/NNABLA_TORUS_DATASET                       written first: the folder is ours to replace

Each set has its own folder ``<cache>/<name>`` ($NNABLA_TORUS_DATA_CACHE, default
~/.cache/nnabla_torus). The build goes to a temporary folder renamed into place under a file
lock, so concurrent ranks build it once and an interrupted build is redone. An old copy is
replaced only when it holds the marker: a folder of the user's is never deleted. The sets:
``digits`` (digits.py) and the generated ``clusters`` and ``shapes`` (synthetic.py);
``ensure_dataset`` builds either. Example::

    root = ensure_dataset("shapes")         # ~/.cache/nnabla_torus/shapes
"""
import fcntl
import glob
import os
import shutil

import numpy as np

from image_lists import write_list

CACHE_ENV = "NNABLA_TORUS_DATA_CACHE"
FORMATS = {"JPEG": {"quality": 95}, "PNG": {}}   # PIL format -> save options (JPEG: digits')


MARKER = "NNABLA_TORUS_DATASET"   # in every folder a build made: only those are replaced


def default_root(name="digits"):
    """The folder of set ``name``: ``<$NNABLA_TORUS_DATA_CACHE>/<name>``, by default
    ``~/.cache/nnabla_torus/<name>``."""
    cache = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "nnabla_torus")
    return os.path.join(os.path.expanduser(cache), name)


def ensure_dataset(name, root=None):
    """Build embedded set ``name`` (``DATASETS``) at ``root`` (default: ``default_root(name)``)
    unless built; return root."""
    import digits
    import synthetic

    builders = {"digits": digits.BUILD, **synthetic.BUILDS}
    if name not in builders:
        raise ValueError(f"unknown embedded data set {name!r}; choose one of "
                         f"{', '.join(builders)} (or give --data-dir)")
    return ensure(builders[name], root or default_root(name))


def ensure(build, root):
    """Write ``build`` (a ``Build``) at ``root`` unless a complete copy of its version is there."""
    root = os.path.abspath(os.path.expanduser(root))
    if _is_complete(root, build.version):
        return root
    os.makedirs(os.path.dirname(root), exist_ok=True)
    with open(root + ".lock", "a") as lock:    # "a": never truncates a file of that name
        fcntl.flock(lock, fcntl.LOCK_EX)   # other ranks wait here, then find it built
        if not _is_complete(root, build.version):
            _write(build, root)
    return root


class Build:
    """What an embedded set is: ``version`` (its VERSION line: change it when the images
    change), ``make()`` -> (uint8 images (n, H, W, 3), int labels (n,), train indices, val
    indices), the file ``prefix`` and the PIL ``image_format`` (``FORMATS``)."""

    def __init__(self, version, make, prefix, image_format):
        self.version, self.make, self.prefix, self.image_format = (version, make, prefix,
                                                                   image_format)


def stratified_split(labels, val_fraction, seed):
    """Return (train, val) sorted index arrays: a seeded split stratified by class."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_val = int(round(len(members) * val_fraction))
        val += members[:n_val].tolist()
        train += members[n_val:].tolist()
    return np.sort(train), np.sort(val)


def _is_complete(root, version):
    marker = os.path.join(root, "VERSION")
    return os.path.isfile(marker) and open(marker).read().strip() == version


def _is_ours(folder):
    """True when ``folder`` was made by a build (it holds ``MARKER``), so it may be removed."""
    return os.path.isfile(os.path.join(folder, MARKER))


def _write(build, root):
    from PIL import Image

    # Under the lock, a temporary folder left here is from a build that was killed.
    for stale in glob.glob(glob.escape(root) + ".tmp-*"):
        if _is_ours(stale):
            shutil.rmtree(stale, ignore_errors=True)
    if os.path.lexists(root) and not _is_ours(root):
        raise ValueError(f"refusing to replace {root}: it was not made by nnabla_torus (no "
                         f"{MARKER} file in it), so it is not deleted. Set {CACHE_ENV} to a "
                         f"folder for the data sets (each is built in <that folder>/<set name>)"
                         f" or move {root} away")
    tmp = f"{root}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    with open(os.path.join(tmp, MARKER), "w") as f:
        f.write("made by nnabla_torus's examples/imagenet/embedded.py; removed and rebuilt "
                "when its set changes\n")
    images, labels, train_idx, val_idx = build.make()
    digits = max(4, len(str(len(labels) - 1)))
    ext, p = build.image_format, build.prefix
    for folder, indices, name in (
            ("train", train_idx, lambda i: f"{p}{labels[i]}/{p}_{i:0{digits}d}.{ext}"),
            ("val", val_idx, lambda i: f"{p}_{i:0{digits}d}.{ext}")):
        entries = [(name(i), int(labels[i])) for i in indices]
        made = set()
        for (path, _), i in zip(entries, indices):
            target = os.path.join(tmp, folder, path)
            if os.path.dirname(target) not in made:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                made.add(os.path.dirname(target))
            Image.fromarray(images[i]).save(target, format=ext, **FORMATS[ext])
        write_list(os.path.join(tmp, f"{folder}.txt"), entries)
    with open(os.path.join(tmp, "VERSION"), "w") as f:
        f.write(build.version + "\n")
    # An old or half-written copy of ours (another version) is replaced as a whole.
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)
