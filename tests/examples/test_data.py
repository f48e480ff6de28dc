"""DALI input of the ImageNet example: sharding, transforms, resume, batch changes, clear errors.

The test images are solid colours whose label is their index, so a loader's labels say which
files it read and its pixels have a known normalised value.
"""
import os
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import data  # noqa: E402
import image_lists  # noqa: E402

NUM_IMAGES = 23   # prime, so shards of 2 and 3 ranks differ in size


def colour(index):
    return np.array([(20 + 9 * index + 50 * k) % 256 for k in range(3)], dtype=np.float32)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """A flat folder of NUM_IMAGES 40x48 JPEGs plus a list giving image i the label i."""
    root = tmp_path_factory.mktemp("indexed")
    entries = []
    for i in range(NUM_IMAGES):
        name = f"img_{i:03d}.JPEG"
        pixels = np.broadcast_to(colour(i).astype(np.uint8), (40, 48, 3))
        Image.fromarray(np.ascontiguousarray(pixels)).save(root / name, quality=95)
        entries.append((name, i))
    image_lists.write_list(root / "list.txt", entries)
    return data.read_dataset(str(root), str(root / "list.txt"))


def read_epoch(dataset, size, rank, train, batch_size=4, **kwargs):
    """Return (labels of the images rank read in order, the loader)."""
    loader = data.make_loader(dataset, batch_size, rank, size, train=train, image_size=8, **kwargs)
    labels = np.concatenate([y[:, 0] for _, y in loader]) if len(loader) else np.zeros(0, int)
    return labels, loader


@pytest.mark.parametrize("num_images", [1000, 23, 7])
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("train", [True, False])
def test_shard_plan_is_a_disjoint_cover_with_equal_steps(num_images, size, train):
    plans = [data.shard_plan(num_images, 4, r, size, train, seed=1, epoch=2) for r in range(size)]
    real = [indices[:count] for indices, count in plans]
    assert sorted(np.concatenate(real).tolist()) == list(range(num_images))
    assert len({len(indices) for indices, _ in plans}) == 1   # same number of steps everywhere


def test_training_order_is_seeded_and_reshuffled_every_epoch():
    def order(seed, epoch):
        return data.shard_plan(100, 10, 0, 1, True, seed=seed, epoch=epoch)[0].tolist()
    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1) and order(0, 0) != order(1, 0)
    assert sorted(order(0, 1)) == list(range(100))
    assert data.shard_plan(10, 4, 0, 1, False)[0].tolist() == list(range(10)) + [0, 1]


@pytest.mark.parametrize("size", [2, 3])
def test_dali_training_shards_are_disjoint_and_cover_the_data(indexed, size):
    seen = []
    for rank in range(size):
        labels, loader = read_epoch(indexed, size, rank, train=True, seed=5, epoch=1)
        steps = -(-(-(-NUM_IMAGES // size)) // 4)               # ceil(ceil(23 / size) / 4)
        assert len(loader) == steps and len(labels) == 4 * steps
        seen.append(labels[:loader.shard_size])
        assert set(labels[loader.shard_size:]) <= set(seen[-1])   # padding repeats the shard
    assert sorted(np.concatenate(seen).tolist()) == list(range(NUM_IMAGES))


@pytest.mark.parametrize("size", [2, 3])
def test_dali_validation_shards_cover_the_data_once_and_pad_with_minus_one(indexed, size):
    seen = [read_epoch(indexed, size, rank, train=False)[0] for rank in range(size)]
    labels = np.concatenate(seen)
    assert sorted(labels[labels >= 0].tolist()) == list(range(NUM_IMAGES))
    assert (labels[labels < 0] == data.PAD_LABEL).all()
    assert np.array_equal(seen[0][:4], [0, 1, 2, 3])              # validation keeps file order


@pytest.mark.parametrize("train", [True, False])
def test_transforms_give_nchw_float32_normalised_in_0_255_scale(indexed, train):
    loader = data.make_loader(indexed, 5, 0, 1, train=train, image_size=16)
    images, labels = next(loader)
    assert images.shape == (5, 3, 16, 16) and images.dtype == np.float32
    assert labels.shape == (5, 1) and labels.dtype == np.int32
    mean, std = np.array(data.PIXEL_MEAN), np.array(data.PIXEL_STD)
    for image, label in zip(images, labels[:, 0]):
        expected = (colour(label) - mean) / std           # a solid colour survives crop and flip
        np.testing.assert_allclose(image.mean(axis=(1, 2)), expected, atol=0.05)
        assert image.std(axis=(1, 2)).max() < 0.05


def test_resume_replays_to_the_same_images_and_augmentation(indexed):
    uninterrupted = data.make_loader(indexed, 3, 1, 2, True, image_size=8, seed=3, epoch=4)
    first = next(uninterrupted)
    state = uninterrupted.state()
    rest = list(uninterrupted)
    resumed = data.make_loader(indexed, 99, 1, 2, True, image_size=8, seed=3, resume=state)
    for (x, y), (x2, y2) in zip(rest, resumed):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    assert state["consumed_steps"] == 1 and len(first[0]) == 3


def test_changing_the_batch_mid_epoch_still_covers_the_shard(indexed):
    size, rank = 3, 2
    small = data.make_loader(indexed, 2, rank, size, True, image_size=8, epoch=1)
    labels = [next(small)[1][:, 0] for _ in range(2)]
    big = data.make_loader(indexed, 3, rank, size, True, image_size=8, epoch=1,
                           start_image=small.position)
    labels += [y[:, 0] for _, y in big]
    indices, count = data.shard_plan(NUM_IMAGES, 2, rank, size, True, epoch=1)
    assert small.position == 4 and len(big) == 2                  # ceil((8 - 4) / 3)
    assert np.array_equal(np.concatenate(labels)[:count], indices[:count])


def test_class_folders_get_sorted_indices(tmp_path):
    for name in ("n02", "n01"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (4, 4)).save(tmp_path / name / "a.JPEG")
    dataset = data.read_dataset(str(tmp_path))
    assert [os.path.basename(os.path.dirname(f)) for f in dataset.files] == ["n01", "n02"]
    assert dataset.labels.tolist() == [0, 1] and dataset.num_classes == 2


def write_list(folder, text):
    path = folder / "list.txt"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("layout, error, message", [
    ("missing folder", FileNotFoundError, "does not exist"),
    ("no class folders", FileNotFoundError, "no class folders"),
    ("empty class folder", FileNotFoundError, "holds no images"),
    ("missing list", FileNotFoundError, "list file .* does not exist"),
    ("missing image", FileNotFoundError, "1 image.* do not exist, first: .*gone.JPEG"),
    ("bad label", ValueError, r"list.txt:2: expected .* got 'b.JPEG cat'"),
    ("negative label", ValueError, r"list.txt:1: .*'a.JPEG -1'"),
    ("empty list", ValueError, "names no images"),
])
def test_missing_or_malformed_data_names_the_path(tmp_path, layout, error, message):
    Image.new("RGB", (4, 4)).save(tmp_path / "a.JPEG")
    Image.new("RGB", (4, 4)).save(tmp_path / "b.JPEG")
    folder, list_file = str(tmp_path), None
    if layout == "missing folder":
        folder = str(tmp_path / "nowhere")
    elif layout == "empty class folder":
        (tmp_path / "n01").mkdir()
    elif layout == "missing list":
        list_file = str(tmp_path / "absent.txt")
    elif layout != "no class folders":
        list_file = write_list(tmp_path, {
            "missing image": "a.JPEG 0\ngone.JPEG 1\n",
            "bad label": "a.JPEG 0\nb.JPEG cat\n",
            "negative label": "a.JPEG -1\n",
            "empty list": "\n",
        }[layout])
    with pytest.raises(error, match=message):
        data.make_loader(folder, 2, list_file=list_file)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(rank=3, size=3), r"rank must be in \[0, 3\)"),
    (dict(size=30), "cannot be sharded over 30 ranks"),
    (dict(start_image=13), r"start_image must be in \[0, 12\]"),
])
def test_bad_shard_arguments_are_named(indexed, kwargs, message):
    args = {**dict(batch_size=4, rank=0, size=2), **kwargs}
    with pytest.raises(ValueError, match=message):
        data.make_loader(indexed, **args)


def test_issue19_dali_threads_come_from_the_cpu_count():
    """DALI ran with num_threads=1 whatever the host: the mixed decoder's host stage was
    single-threaded. Each rank now gets its share of the CPUs."""
    assert data.threads_per_rank(8, cpus=96) == 12
    assert data.threads_per_rank(4, cpus=2) == 1 and data.threads_per_rank(0, cpus=4) == 4


def test_issue47_threads_come_from_the_cpus_the_rank_was_given(monkeypatch):
    """Issue 33 gave a GPU pipeline the host's share (os.cpu_count() / ranks) whatever the
    rank's binding; issue 47: that ignores cgroups, taskset and Slurm's --cpus-per-task and
    puts threads on cores another rank was given. Now: Slurm's CPUs per task, else the
    affinity mask (shared by the host's ranks only when it is the whole host), capped."""
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(data.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: {3})   # bound to one core
    assert data.threads_per_rank(8) == 1
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: set(range(6)))  # 6 cores
    assert data.threads_per_rank(8) == 6
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: set(range(64)))  # unbound
    assert data.threads_per_rank(8) == 8 and data.threads_per_rank(2) == data.MAX_THREADS
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    assert data.threads_per_rank(8) == 2 and data.rank_cpus(8)[1] == "Slurm's --cpus-per-task"


def test_issue47_only_the_first_batches_are_screened_before_the_first_batch(indexed,
                                                                            monkeypatch):
    """Every file of the shard was opened (head and tail) before the first batch: minutes on
    NFS or Lustre. Now only the batches DALI reads first; the rest is found when read."""
    opened = []
    monkeypatch.setattr(data, "screen", lambda path: opened.append(path))
    monkeypatch.setattr(indexed, "screened", np.zeros_like(indexed.screened))  # the module's
    # fixture is shared: earlier tests' loaders screened its files already
    loader = data.make_loader(indexed, 2, rank=0, size=1, train=False, image_size=16,
                              prefetch=1)
    next(loader)
    assert 0 < len(opened) <= (1 + 2) * 2 < len(indexed), (len(opened), len(indexed))


def test_issue66_every_rebuild_frees_the_old_pipeline_and_dalis_pools_first(indexed,
                                                                            monkeypatch):
    """A batch change, an epoch's end and validation each destroy their DALI pipeline and then
    release DALI's unused pool memory, before the next pipeline is built: on a 16 GB GPU two
    pipelines' pools are never held at once (before: the old one lived until replaced, and its
    memory stayed in DALI's pools)."""
    import types
    import weakref
    from nvidia.dali import backend
    import stream
    pipes, events = [], []
    real_build = data._build_pipeline

    def alive():
        return sum(ref() is not None for ref in pipes)

    def build(*args):
        pipe = real_build(*args)
        pipes.append(weakref.ref(pipe))
        events.append(("build", alive()))
        return pipe
    monkeypatch.setattr(data, "_build_pipeline", build)
    monkeypatch.setattr(backend, "ReleaseUnusedMemory", lambda: events.append(("release",
                                                                               alive())))
    cfg = types.SimpleNamespace(seed=1, image_size=8, min_crop_area=0.5, flip=True,
                                bad_images="skip")
    comm = types.SimpleNamespace(rank=1, size=2, local_size=2)
    train = stream.TrainStream(indexed, cfg, comm, device_id=None)   # 12 images per rank
    for batch in (4, 4, 3, 3):          # a batch change after 8 images, the epoch's end at 11
        train.next_batch(batch)
    assert train.at_epoch_end()
    train.close_finished()
    assert events == [("build", 1), ("release", 0), ("build", 1), ("release", 0)]
    train.next_batch(3)                 # the next epoch: the finished one is closed already
    assert events[-1] == ("build", 1) and len(events) == 5
    val = data.make_loader(indexed, 5, 0, 2, train=False, image_size=8)
    list(val)
    val.close()
    assert events[-2:] == [("build", 2), ("release", 1)]        # the training one is alive
    assert val.skipped() == 0 and val.state()["consumed_steps"] == 3


def test_issue66_releasing_dalis_pools_on_a_cpu_run_is_harmless(indexed):
    first = data.make_loader(indexed, 4, 0, 1, train=True, image_size=8, seed=2)
    x, y = next(first)
    first.close()                       # the real ReleaseUnusedMemory: no GPU here
    again = data.make_loader(indexed, 4, 0, 1, train=True, image_size=8, seed=2)
    x2, y2 = next(again)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
