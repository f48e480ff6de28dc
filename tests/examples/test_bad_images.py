"""Undecodable images and labels outside the class set, in the data loader and the list tool.

The bad files: a JPEG cut in half, a zero-byte file, a text file named .JPEG, and a JPEG cut in
half whose end marker was put back (only a full decode shows it: the PIL fallback path).
"""
import io
import os
import re
import sys

import numpy as np
import pytest
from PIL import Image

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "examples", "imagenet"))
import data  # noqa: E402
import make_imagenet_lists  # noqa: E402

GOOD_PER_CLASS = 10


def jpeg_bytes(value):
    buffer = io.BytesIO()
    rng = np.random.default_rng(value)      # noise: a JPEG of many bytes, cut in the middle
    Image.fromarray(rng.integers(0, 255, (24, 24, 3), np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def write_bad(folder):
    """The bad files in ``folder``; returns their names."""
    blob = jpeg_bytes(0)
    files = {"cut.JPEG": blob[:len(blob) // 2], "empty.JPEG": b"",
             "text.JPEG": b"not an image\n", "cut-end.JPEG": blob[:len(blob) // 2] + b"\xff\xd9"}
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return sorted(files)


@pytest.fixture
def train_dir(tmp_path):
    """train/c0, train/c1 with GOOD_PER_CLASS good images each, the bad files in c0."""
    for label in range(2):
        folder = tmp_path / "train" / f"c{label}"
        folder.mkdir(parents=True)
        for k in range(GOOD_PER_CLASS):
            (folder / f"img{k}.JPEG").write_bytes(jpeg_bytes(label * 100 + k))
    write_bad(tmp_path / "train" / "c0")
    return tmp_path / "train"


def test_screen_names_empty_foreign_and_cut_files(tmp_path):
    write_bad(tmp_path)
    Image.new("RGB", (4, 4)).save(tmp_path / "png-named.JPEG", "PNG")
    (tmp_path / "good.JPEG").write_bytes(jpeg_bytes(1))
    assert data.screen(str(tmp_path / "empty.JPEG")) == "empty file"
    assert data.screen(str(tmp_path / "text.JPEG")).startswith("not an image")
    assert data.screen(str(tmp_path / "cut.JPEG")) == "truncated (no end marker)"
    for name in ("good.JPEG", "png-named.JPEG", "cut-end.JPEG"):   # the last needs a decode
        assert data.screen(str(tmp_path / name)) is None, name
    assert data.decode_error(str(tmp_path / "cut-end.JPEG"))
    assert data.decode_error(str(tmp_path / "good.JPEG")) is None


@pytest.mark.parametrize("size,rank", [(1, 0), (2, 0), (2, 1)])
def test_training_skips_bad_images_and_keeps_the_step_count(train_dir, size, rank):
    dataset = data.read_dataset(str(train_dir))
    names = [os.path.basename(f) for f in dataset.files]
    bad = {i for i, n in enumerate(names) if not n.startswith("img")}
    loader = data.make_loader(dataset, 4, rank, size, train=True, image_size=8, seed=2)
    # The step count is a function of the number of files, the same on every rank.
    assert len(loader) == -(-(-(-len(dataset) // size)) // 4)
    batches = list(loader)
    assert len(batches) == len(loader)
    shard = set(loader._indices[:loader.shard_size].tolist())
    # cut-end.JPEG only fails a full decode; a random crop's partial decode may not reach its cut.
    cut_end = names.index("cut-end.JPEG")
    assert dataset.bad - {cut_end} == (bad - {cut_end}) & shard
    assert loader.skipped() == len(dataset.bad & shard)
    assert all(np.isfinite(images).all() for images, _ in batches)


def test_validation_masks_bad_images(train_dir):
    dataset = data.read_dataset(str(train_dir))
    loader = data.make_loader(dataset, 6, 0, 1, train=False, image_size=8)
    labels = np.concatenate([lab for _, lab in loader])[:, 0]
    names = [os.path.basename(f) for f in dataset.files]
    expected = [-1 if not n.startswith("img") else lab for n, lab in zip(names, dataset.labels)]
    assert labels[:len(names)].tolist() == expected
    assert loader.skipped() == 4


def test_stop_names_the_file(train_dir):
    dataset = data.read_dataset(str(train_dir))
    with pytest.raises(data.BadImageError, match=r"rank 0 on .*: cannot decode .*c0/"
                                                 r"(cut|empty|text)\.JPEG .*--bad-images skip"):
        list(data.make_loader(dataset, 4, 0, 1, train=True, image_size=8, on_bad="stop"))


def test_decode_failure_behind_a_good_header_is_found_by_pil(train_dir):
    """cut-end.JPEG passes the screen; DALI fails its batch, PIL finds it, the epoch goes on."""
    for name in ("cut.JPEG", "empty.JPEG", "text.JPEG"):
        os.remove(train_dir / "c0" / name)
    dataset = data.read_dataset(str(train_dir))
    loader = data.make_loader(dataset, 4, 0, 1, train=False, image_size=8)   # full decodes
    assert len(list(loader)) == len(loader)
    assert [os.path.basename(dataset.files[i]) for i in dataset.bad] == ["cut-end.JPEG"]


def write_list(tmp_path, name, labels):
    folder = tmp_path / "flat"
    folder.mkdir(exist_ok=True)
    for k in range(len(labels)):
        Image.new("RGB", (4, 4)).save(folder / f"{k}.JPEG")
    (tmp_path / name).write_text("".join(f"{k}.JPEG {lab}\n" for k, lab in enumerate(labels)))
    return str(folder), str(tmp_path / name)


def test_training_label_outside_the_class_set_names_the_line(tmp_path):
    folder, listing = write_list(tmp_path, "train.txt", [0, 1, 2, 999, 1])
    with pytest.raises(ValueError, match=r"train.txt:4: label 999 is outside the class set 0..3"):
        data.read_dataset(folder, listing)
    folder, listing = write_list(tmp_path, "gap.txt", [0, 2, 2])      # a gap: label 1 missing
    with pytest.raises(ValueError, match=r"gap.txt:2: label 2 is outside the class set 0..1"):
        data.read_dataset(folder, listing)


def test_validation_labels_outside_the_training_classes_are_masked_and_counted(tmp_path):
    folder, listing = write_list(tmp_path, "val.txt", [0, 12, 1, 10])
    val = data.read_dataset(folder, listing, num_classes=10)
    assert val.labels.tolist() == [0, -1, 1, -1]
    assert val.outside[0] == 2 and val.outside[1].endswith("val.txt:2")


def test_list_tool_verify_leaves_bad_images_out(train_dir, capsys):
    make_imagenet_lists.main(["--train-dir", str(train_dir), "--verify", "1", "--workers", "2"])
    out = capsys.readouterr().out
    assert "train.txt: 4 of 24 image(s) do not decode, left out:" in out
    for name in ("cut.JPEG", "empty.JPEG", "text.JPEG", "cut-end.JPEG"):
        assert f"c0/{name}: " in out
    lines = (train_dir.parent / "train.txt").read_text().splitlines()
    assert len(lines) == 2 * GOOD_PER_CLASS and all("/img" in line for line in lines)


def test_class_folders_alone_are_a_data_dir_and_validation_labels_follow_the_names(tmp_path):
    """docs/imagenet.md: class folders or lists. Before: train.py required train.txt/val.txt.
    Validation folders take the training labels by name (a missing class shifts nothing)."""
    from image_lists import read_dataset, split_source
    for split, classes in (("train", ("cat", "dog", "eel")), ("val", ("dog", "eel", "fox"))):
        for name in classes:
            (tmp_path / split / name).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(tmp_path / split / name / "a.jpg")
    folder, listing = split_source(str(tmp_path), "train")
    assert (folder, listing) == (str(tmp_path / "train"), None)
    train = read_dataset(folder, listing)
    assert train.class_names == ["cat", "dog", "eel"] and list(train.labels) == [0, 1, 2]
    val = read_dataset(*split_source(str(tmp_path), "val"), num_classes=train.num_classes,
                       class_names=train.class_names)
    assert list(val.labels) == [1, 2, -1]                     # fox is no training class
    assert val.outside == (1, str(tmp_path / "val" / "fox" / "a.jpg"))
    (tmp_path / "val.txt").write_text("dog/a.jpg 1\n")        # a list wins over the folders
    assert split_source(str(tmp_path), "val")[1] == str(tmp_path / "val.txt")


def test_every_layout_is_documented(tmp_path, monkeypatch):
    """The list files split_source names when it finds no layout (train.txt, ...) are in
    docs/imagenet.md and in train.py's --data-dir error (docs/contributing.md)."""
    from config import parse_config
    from image_lists import split_source
    with pytest.raises(ValueError) as none_found:
        split_source(str(tmp_path), "train")
    listed = set(re.findall(r"\btrain\.\w+", str(none_found.value)))
    monkeypatch.delenv("NNABLA_TORUS_RECIPE", raising=False)
    with pytest.raises(ValueError) as not_a_folder:
        parse_config(["--data-dir", str(tmp_path / "absent")])
    docs = open(os.path.join(ROOT, "docs", "imagenet.md")).read()
    missing = [name for name in listed
               if f"`{name}`" not in docs or name not in str(not_a_folder.value)]
    assert listed and not missing, missing
