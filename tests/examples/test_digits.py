"""Embedded digits dataset: ImageNet layout, counts, deterministic split, cache and rebuild."""
import os
import sys
import time

import numpy as np
import pytest
from PIL import Image

from tests.slowdown import scaled

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import data  # noqa: E402
import digits  # noqa: E402
import embedded  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return digits.ensure_digits_dataset(str(tmp_path_factory.mktemp("cache") / "digits"))


def test_layout_and_counts(root):
    train = data.read_dataset(os.path.join(root, "train"), os.path.join(root, "train.txt"))
    val = data.read_dataset(os.path.join(root, "val"), os.path.join(root, "val.txt"))
    assert (len(train), len(val)) == (1438, 359)                 # all 1,797 digits, 80/20
    assert sorted(os.listdir(os.path.join(root, "train"))) == [f"digit{k}" for k in range(10)]
    assert all(os.path.dirname(f) == os.path.join(root, "val") for f in val.files)
    # The folder order and the list agree, so both ways of reading give the same labels.
    folders = data.read_dataset(os.path.join(root, "train"))
    assert sorted(zip(folders.files, folders.labels)) == sorted(zip(train.files, train.labels))
    assert np.bincount(val.labels).min() >= 34                   # stratified: every class in val
    assert not set(map(os.path.basename, train.files)) & set(map(os.path.basename, val.files))
    with Image.open(val.files[0]) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (32, 32))


def test_second_call_uses_the_cache(root):
    marker = os.path.join(root, "VERSION")
    before = os.stat(marker).st_mtime_ns
    start = time.perf_counter()
    assert digits.ensure_digits_dataset(root) == root
    assert time.perf_counter() - start < scaled(0.1)
    assert os.stat(marker).st_mtime_ns == before


def test_interrupted_build_is_redone_identically(root, tmp_path):
    copy = str(tmp_path / "digits")
    os.makedirs(os.path.join(copy, "train"))                     # a build cut short: no VERSION
    os.makedirs(copy + ".tmp-99999")                             # and a killed build's leftovers
    for folder in (copy, copy + ".tmp-99999"):                   # both made by a build
        open(os.path.join(folder, embedded.MARKER), "w").close()
    digits.ensure_digits_dataset(copy)
    for name in ("train.txt", "val.txt"):
        assert open(os.path.join(copy, name)).read() == open(os.path.join(root, name)).read()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_default_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(digits.CACHE_ENV, str(tmp_path / "here"))
    assert digits.default_root() == str(tmp_path / "here" / "digits")
    monkeypatch.delenv(digits.CACHE_ENV)
    assert digits.default_root().endswith(os.path.join(".cache", "nnabla_torus", "digits"))
