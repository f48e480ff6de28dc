"""tools/make_imagenet_lists.py: lists for class-folder and flat validation sets, clear errors."""
import os
import sys

import pytest
from PIL import Image

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "examples", "imagenet"))
import data  # noqa: E402
import make_imagenet_lists  # noqa: E402

WNIDS = ("n03", "n01", "n02")   # written unsorted: indices must follow the sorted order


def image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4)).save(path)


@pytest.fixture
def imagenet(tmp_path):
    for wnid in WNIDS:
        for k in range(2):
            image(tmp_path / "train" / wnid / f"{wnid}_{k}.JPEG")
    for k, wnid in enumerate(WNIDS):
        image(tmp_path / "val" / f"ILSVRC2012_val_{k + 1:08d}.JPEG")
    return tmp_path


def run(imagenet, *extra):
    make_imagenet_lists.main(["--train-dir", str(imagenet / "train"), *extra])
    return (imagenet / "train.txt").read_text().splitlines()


def test_train_list_indices_follow_sorted_wnids(imagenet):
    lines = run(imagenet)
    assert lines[:3] == ["n01/n01_0.JPEG 0", "n01/n01_1.JPEG 0", "n02/n02_0.JPEG 1"]
    dataset = data.read_dataset(str(imagenet / "train"), str(imagenet / "train.txt"))
    assert dataset.labels.tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("kind", ["txt", "csv"])
def test_flat_val_with_a_mapping_file(imagenet, kind):
    if kind == "txt":
        text = "".join(f"ILSVRC2012_val_{k + 1:08d}.JPEG {w}\n" for k, w in enumerate(WNIDS))
    else:
        text = "ImageId,PredictionString\n" + "".join(
            f"ILSVRC2012_val_{k + 1:08d},{w} 1 2 3 4\n" for k, w in enumerate(WNIDS))
    (imagenet / f"map.{kind}").write_text(text)
    run(imagenet, "--val-dir", str(imagenet / "val"), "--val-map", str(imagenet / f"map.{kind}"))
    assert (imagenet / "val.txt").read_text().splitlines() == [
        "ILSVRC2012_val_00000001.JPEG 2", "ILSVRC2012_val_00000002.JPEG 0",
        "ILSVRC2012_val_00000003.JPEG 1"]


def test_val_in_class_folders_uses_the_training_indices(imagenet, tmp_path):
    image(tmp_path / "val2" / "n02" / "x.JPEG")
    run(imagenet, "--val-dir", str(tmp_path / "val2"), "--out-dir", str(tmp_path))
    assert (tmp_path / "val.txt").read_text() == "n02/x.JPEG 1\n"


def test_environment_twin_sets_the_training_folder(imagenet, monkeypatch):
    monkeypatch.setenv("NNABLA_TORUS_TRAIN_DIR", str(imagenet / "train"))
    make_imagenet_lists.main([])
    assert len((imagenet / "train.txt").read_text().splitlines()) == 6


@pytest.mark.parametrize("case, message", [
    ("no map", "no class folders; pass --val-map"),
    ("unknown wnid", "class 'n09' in .*map.txt has no folder in the training set"),
    ("missing image", "names ILSVRC2012_val_00000009.JPEG, which is not in"),
    ("bad line", r"map.txt:1: expected 'image wnid'"),
])
def test_bad_validation_inputs_are_named(imagenet, case, message):
    """A message (SystemExit "error: ..."), not a traceback."""
    (imagenet / "map.txt").write_text({
        "no map": "", "unknown wnid": "ILSVRC2012_val_00000001 n09\n",
        "missing image": "ILSVRC2012_val_00000009.JPEG n01\n", "bad line": "a\n"}[case])
    extra = [] if case == "no map" else ["--val-map", str(imagenet / "map.txt")]
    with pytest.raises(SystemExit, match="^error: .*" + message):
        run(imagenet, "--val-dir", str(imagenet / "val"), *extra)
