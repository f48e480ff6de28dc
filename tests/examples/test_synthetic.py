"""Generated embedded data sets (synthetic.py, embedded.py): deterministic per seed, train and
val disjoint, the label noise and the class overlap the docs state, the files as the arrays."""
import os
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import data  # noqa: E402
import embedded  # noqa: E402
import synthetic  # noqa: E402

MAKERS = {"clusters": synthetic.make_clusters, "shapes": synthetic.make_shapes}


@pytest.mark.parametrize("name", MAKERS)
def test_same_seed_same_set_other_seed_other_set(name):
    a, b, c = (MAKERS[name](600, seed=s) for s in (3, 3, 4))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("name", MAKERS)
def test_train_and_val_are_disjoint_stratified_and_cover_the_set(name):
    images, labels, train, val = MAKERS[name](1000, seed=1)
    assert not set(train) & set(val) and len(train) + len(val) == len(images) == 1000
    assert len(val) == pytest.approx(200, abs=len(np.unique(labels)))
    assert images.dtype == np.uint8 and images.shape[3] == 3


def test_clusters_label_noise_is_on_training_labels_only():
    noisy = synthetic.make_clusters(20_000, seed=2)
    clean = synthetic.make_clusters(20_000, seed=2, p=dict(synthetic.CLUSTERS, label_noise=0.0))
    np.testing.assert_array_equal(noisy[0], clean[0])          # the same images
    train, val = noisy[2], noisy[3]
    wrong = noisy[1][train] != clean[1][train]
    assert wrong.mean() == pytest.approx(0.25, abs=0.015)      # the 25 % of the docs
    np.testing.assert_array_equal(noisy[1][val], clean[1][val])


def test_clusters_overlap_as_documented():
    """Nearest-mean, the Bayes rule for these isotropic Gaussians, scores ~0.86 (docs)."""
    p = synthetic.CLUSTERS
    images, labels, _, val = synthetic.make_clusters(10_000, seed=0)
    means = synthetic.smooth_means(np.random.default_rng([0, 1]), p["classes"], p["size"],
                                   p["grid"]) * p["signal"]
    x = (images[val].astype(float) - 128) / p["scale"]
    guess = ((x[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4)).argmin(axis=1)
    assert (guess == labels[val]).mean() == pytest.approx(0.86, abs=0.02)


def test_smooth_means_interpolate_their_grid():
    rng = np.random.default_rng(0)
    means = synthetic.smooth_means(np.random.default_rng(0), 2, 8, 2)
    grid = rng.standard_normal((2, 2, 2, 3))
    np.testing.assert_allclose(means[:, ::7, ::7], grid)            # the corners are the grid
    np.testing.assert_allclose(means[:, 0, 3], grid[:, 0, 0] * 4 / 7 + grid[:, 0, 1] * 3 / 7)


def test_shape_masks_have_their_areas():
    """Areas in squared radii against their formulas: disc pi, square 1.5^2, triangle
    3 sqrt(3) / 4 (circumradius 1), cross 2 x 2 x 0.6 - 0.6^2."""
    yy, xx = (np.mgrid[0:801, 0:801] - 400) / 200.0               # 200 samples per radius
    expected = {"disc": np.pi, "square": 2.25, "triangle": 3 * np.sqrt(3) / 4,
                "cross": 2 * 2 * 0.6 - 0.36}
    for label, name in enumerate(synthetic.SHAPE_NAMES):
        area = synthetic.shape_mask(label, yy, xx, 0.3).sum() / 200.0 ** 2
        assert area == pytest.approx(expected[name], rel=0.01), name


def test_written_set_holds_the_arrays_losslessly(tmp_path):
    made = synthetic.make_clusters(300, seed=5)
    build = embedded.Build("test-v1", lambda: made, "class", "PNG")
    root = embedded.ensure(build, str(tmp_path / "clusters"))
    train = data.read_dataset(os.path.join(root, "train"), os.path.join(root, "train.txt"))
    val = data.read_dataset(os.path.join(root, "val"), os.path.join(root, "val.txt"))
    assert (len(train), len(val)) == (len(made[2]), len(made[3]))
    for dataset, indices in ((train, made[2]), (val, made[3])):
        for path, label, i in zip(dataset.files[:20], dataset.labels[:20], indices[:20]):
            with Image.open(path) as image:
                np.testing.assert_array_equal(np.asarray(image), made[0][i])
            assert label == made[1][i]
    assert sorted(os.listdir(os.path.join(root, "train"))) == [f"class{k}" for k in range(10)]


def test_each_set_has_its_own_folder_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path))
    assert embedded.default_root("shapes") == str(tmp_path / "shapes")
    assert embedded.default_root("digits") == str(tmp_path / "digits")
    with pytest.raises(ValueError, match="unknown embedded data set 'cifar'.*clusters, shapes"):
        embedded.ensure_dataset("cifar")


def test_clusters_recipe_crops_pass_the_pixels_unchanged(tmp_path):
    """min_crop_area 1 and val_crop 1 (clusters-mlp): training and validation both read the
    whole 8 px image, normalised, unresized: the pixels are the features."""
    made = synthetic.make_clusters(40, seed=6)
    root = embedded.ensure(embedded.Build("test-v1", lambda: made, "class", "PNG"),
                           str(tmp_path / "c"))
    val = data.read_dataset(os.path.join(root, "val"), os.path.join(root, "val.txt"))
    pixels = (made[0][made[3]].astype(np.float32) - data.PIXEL_MEAN) / data.PIXEL_STD
    n = len(val)
    for train, kwargs in ((False, dict(val_crop=1.0)),
                          (True, dict(crop_scale=(1.0, 1.0), flip=False))):
        images, _ = next(iter(data.make_loader(val, n, train=train, image_size=8, seed=0,
                                               **kwargs)))
        order = data.shard_plan(n, n, 0, 1, train, seed=0)[0]       # the rows' dataset indices
        np.testing.assert_allclose(images.transpose(0, 2, 3, 1), pixels[order], atol=1e-4)


def tiny_build(version):
    made = synthetic.make_clusters(20, seed=1)
    return embedded.Build(version, lambda: made, "class", "PNG")


def test_a_folder_the_build_did_not_make_is_never_deleted(monkeypatch, tmp_path):
    """Before: NNABLA_TORUS_DATA_CACHE set to a folder of the user's was rmtree'd by the digits
    build, and the shapes build deleted its sibling ``shapes``, silently."""
    users = tmp_path / "thesis"
    users.mkdir()
    (users / "chapter1.tex").write_text("years of work")
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "notes.txt").write_text("mine")
    (tmp_path / "shapes.tmp-1").mkdir()                      # a name a killed build would use
    (tmp_path / "shapes.tmp-1" / "keep.txt").write_text("mine too")
    monkeypatch.setenv(embedded.CACHE_ENV, str(users))
    assert embedded.default_root("digits") == str(users / "digits")     # a new folder in it
    for root in (str(users), str(tmp_path / "shapes")):
        with pytest.raises(ValueError, match=rf"refusing to replace {root}: it was not made by "
                                             rf"nnabla_torus \(no NNABLA_TORUS_DATASET file in "
                                             rf"it\), so it is not deleted\. Set "
                                             rf"NNABLA_TORUS_DATA_CACHE to a folder"):
            embedded.ensure(tiny_build("test-v1"), root)
    assert (users / "chapter1.tex").read_text() == "years of work"
    assert (tmp_path / "shapes" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "shapes.tmp-1" / "keep.txt").read_text() == "mine too"


def test_a_copy_the_build_made_is_replaced_by_a_new_version(tmp_path):
    root = embedded.ensure(tiny_build("test-v1"), str(tmp_path / "clusters"))
    (tmp_path / "clusters.tmp-7").mkdir()                     # a killed build's, marker first
    (tmp_path / "clusters.tmp-7" / embedded.MARKER).write_text("")
    embedded.ensure(tiny_build("test-v2"), root)
    assert (tmp_path / "clusters" / "VERSION").read_text() == "test-v2\n"
    assert sorted(os.listdir(tmp_path)) == ["clusters", "clusters.lock"]
