"""Sharded DALI input: each rank's batches of one epoch, on the CPU or decoded on its GPU.

Rank ``r`` of ``size`` reads shard ``r`` of the (training: seeded, reshuffled every epoch) image
order of an ``image_lists.Dataset``; every rank runs the same number of steps, so collectives
never wait for a rank that ran out (short shards are padded; validation pads with label -1).
Undecodable images never reach DALI (``image_lists.screen``) and are replaced, so the step
count is unchanged. The contract in full (padding, the GPU path, bad images, rebuilding a
loader mid-epoch and on resume): docs/imagenet.md#sharded-input. The DALI graph is in
``dali_pipeline``, the copy of a batch into the graph's input in ``input_feed``. Example::

    loader = data.make_loader(train_set, batch_size=32, rank=comm.rank, size=comm.size,
                              train=True, image_size=224, seed=0, epoch=epoch)
    for images, labels in loader:        # len(loader) steps, identical on every rank
        data.feed(x, images)             # x: nn.Variable of shape (32, 3, 224, 224)
        data.feed(t, labels)             # (32, 1) int32, host or device
"""
import gc
import math
import os
import platform

import numpy as np

from dali_pipeline import DTYPES, PIXEL_MEAN, PIXEL_STD, VAL_CROP  # noqa: F401  (PIXEL_*: tests)
from dali_pipeline import build_pipeline as _build_pipeline   # Loader's; tests patch it here
from image_lists import PAD_LABEL, Dataset, decode_error, read_dataset, screen
from input_feed import copy_to_array, feed  # noqa: F401  (the loader's users call data.feed)


class BadImageError(RuntimeError):
    """An image cannot be decoded and the loader was told to stop (``on_bad="stop"``)."""


def shard_plan(num_images, batch_size, rank, size, train, seed=0, epoch=0, start_image=0,
               order=None):
    """Return (indices, real) of the images rank ``rank`` reads this epoch, from ``start_image`` on.

    ``indices`` has ``steps * batch_size`` entries with ``steps = ceil((ceil(N/size) - start_image)
    / batch_size)`` on every rank; the first ``real`` entries are this rank's shard (contiguous
    block of the epoch order, which for training is a permutation seeded by (seed, epoch)), the
    rest pad it (training: the shard again; validation: entries to mask out). ``order``: the
    epoch's image order when it is not the seeded one (an epoch resharded over another world
    size, resize.py); ``num_images`` is then ``len(order)``.
    """
    if order is not None:
        num_images = len(order)
    _check_shard_args(num_images, batch_size, rank, size, start_image)
    if order is None:
        order = (np.random.default_rng([seed, epoch]).permutation(num_images) if train
                 else np.arange(num_images))
    shard = order[num_images * rank // size: num_images * (rank + 1) // size]
    remaining = shard[start_image:]
    steps = math.ceil((math.ceil(num_images / size) - start_image) / batch_size)
    return np.resize(remaining if len(remaining) else shard, steps * batch_size), len(remaining)


def _check_shard_args(num_images, batch_size, rank, size, start_image):
    if num_images < size:
        raise ValueError(f"{num_images} images cannot be sharded over {size} ranks; use at "
                         f"most {num_images} ranks or more data")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    if not 0 <= start_image <= math.ceil(num_images / size):
        raise ValueError(f"start_image must be in [0, {math.ceil(num_images / size)}] (images "
                         f"per rank per epoch), got {start_image}")


class Loader:
    """Iterator over one rank's batches of one epoch (see the module docstring).

    Attributes: ``images_per_epoch`` (all ranks), ``shard_size`` (real images this rank reads
    from ``start_image`` on), ``len()`` = steps (same on every rank), ``position`` (images per
    rank consumed this epoch, counted in whole batches, same on every rank), ``epoch``.
    """

    def __init__(self, dataset, batch_size, rank, size, train, image_size, seed, epoch,
                 start_image, device_id, num_threads, prefetch, crop_scale, flip, on_bad, dtype,
                 order=None, val_crop=VAL_CROP):
        self.batch_size, self.train, self.epoch = batch_size, train, epoch
        self.on_device = device_id is not None
        self.labels_on_device = self.on_device and train     # validation masks on the host
        self.start_image = self.position = start_image
        self.images_per_epoch = len(dataset)
        self.num_classes = dataset.num_classes
        self._indices, self.shard_size = shard_plan(len(dataset), batch_size, rank, size, train,
                                                    seed, epoch, start_image, order)
        self.steps = len(self._indices) // batch_size
        self._per_rank = math.ceil((len(dataset) if order is None else len(order)) / size)
        self._step = 0
        self._pipe = None
        self._dataset, self._rank, self._on_bad = dataset, rank, on_bad
        pipe_seed = int(np.random.SeedSequence([seed, rank, epoch, start_image, batch_size])
                        .generate_state(1)[0] & 0x7FFFFFFF)
        self._build = lambda files, labels: _build_pipeline(
            files, labels, batch_size, train, image_size, pipe_seed, device_id, num_threads,
            prefetch, crop_scale, flip, val_crop, dtype)
        self._window = prefetch + 2      # batches DALI may have decoded ahead of the one asked
        if self.steps:
            self._start()

    def _start(self):
        """(Re)build the pipeline from the current step on, known bad images replaced. Only
        the batches DALI reads first are screened (each file opened twice: on NFS or Lustre the
        whole shard took minutes before the first batch); a bad image further on fails DALI's
        batch and is found then (``_find_bad``), or taken out once for all by
        ``tools/make_imagenet_lists.py --verify``."""
        first = self._step * self.batch_size
        self._screen(self._indices[first:first + self._window * self.batch_size])
        rows = self._indices[first:].copy()
        bad = np.isin(rows, list(self._dataset.bad))
        if bad.any():
            good = [i for i in self._indices[:self.shard_size] if i not in self._dataset.bad] \
                or [i for i in range(len(self._dataset)) if i not in self._dataset.bad]
            if not good:
                raise BadImageError(f"no image of {self._dataset.root} can be decoded")
            rows[bad] = np.resize(good, bad.sum())       # training: other images of the shard
        labels = self._dataset.labels[rows]
        if not self.train:
            # Padding rows (past this rank's shard) and bad images are masked out of validation.
            labels[max(0, self.shard_size - first):] = PAD_LABEL
            labels[bad] = PAD_LABEL
        self._pipe = self._build([self._dataset.files[i] for i in rows], labels.tolist())

    def _screen(self, rows):
        """Add the images among ``rows`` that fail ``screen`` to ``dataset.bad`` (once each)."""
        todo = np.unique(rows[~self._dataset.screened[rows]])
        for i in todo.tolist():
            reason = screen(self._dataset.files[i])
            if reason:
                self._bad(i, reason)
        self._dataset.screened[todo] = True

    def _bad(self, index, reason):
        """Record an undecodable image, or raise BadImageError naming it (``on_bad="stop"``)."""
        if self._on_bad == "stop":
            raise BadImageError(
                f"rank {self._rank} on {platform.node()}: cannot decode "
                f"{self._dataset.files[index]} ({reason}); leave it out with "
                f"tools/make_imagenet_lists.py --verify, or skip undecodable images with "
                f"--bad-images skip")
        self._dataset.bad.add(index)

    def _run(self):
        """One batch from DALI; on a decoding failure find the bad image(s), skip or stop."""
        while True:                      # ends: each retry leaves out at least one more image
            try:
                return self._pipe.run()
            except RuntimeError as error:
                failure = str(error)
            # Out of the except block: its traceback holds the failed pipeline, which DALI
            # must have released before a new one runs (else the next failure crashes).
            self._pipe = None
            gc.collect()
            if not self._find_bad():
                raise RuntimeError(f"rank {self._rank} on {platform.node()}: DALI failed on a "
                                   f"batch whose images all decode with PIL: {failure}")
            self._start()

    def _find_bad(self):
        """Decode the next batches' images with PIL; record the bad ones; return how many.

        The batches DALI may have read ahead are tried first, then the rest of the shard.
        """
        first = self._step * self.batch_size
        window = first + self._window * self.batch_size
        for rows in (self._indices[first:window], self._indices[window:]):
            found = 0
            for i in dict.fromkeys(rows.tolist()):
                reason = None if i in self._dataset.bad else decode_error(self._dataset.files[i])
                if reason:
                    self._bad(i, reason)
                    found += 1
            if found:
                return found
        return 0

    def close(self):
        """Drop the DALI pipeline (``state()``, ``epoch`` and ``position`` stay) and hand the
        memory it held in DALI's pools back (``release_dali_memory``). Call it before building
        the next pipeline, so the two are never held at once."""
        if self._pipe is not None:
            self._pipe = None
            release_dali_memory()

    def skipped(self):
        """Images of this rank's shard (from ``start_image`` on) left out as undecodable."""
        return len(set(self._indices[:self.shard_size].tolist()) & self._dataset.bad)

    def __len__(self):
        return self.steps

    def __iter__(self):
        return self

    def __next__(self):
        if self._step >= self.steps:
            raise StopIteration
        images, labels = self._run()
        # A GPU batch stays in device memory (valid until the next batch: feed it first).
        images = images if self.on_device else images.as_array()
        if not self.labels_on_device:
            labels = labels.as_array().reshape(self.batch_size, 1).astype(np.int32)
        self._step += 1
        # Counted in whole batches (not real images) so that it is the same on every rank.
        self.position = min(self.start_image + self._step * self.batch_size, self._per_rank)
        return images, labels

    def state(self):
        """Return what ``make_loader(..., resume=state)`` needs to continue exactly here."""
        return {"epoch": self.epoch, "start_image": self.start_image,
                "batch_size": self.batch_size, "consumed_steps": self._step}


def release_dali_memory():
    """Free the blocks of DALI's device and pinned-host memory pools that no pipeline uses.

    DALI keeps the memory of a destroyed pipeline in its pools for the next one
    (``nvidia.dali.backend.ReleaseUnusedMemory``: "Only blocks that are completely free are
    released"), so per-epoch pipelines would otherwise keep their peak on the GPU, beside
    nnabla's and NCCL's memory. ``gc.collect()`` first: a pipeline in a reference cycle is
    destroyed only then. On a CPU run the pools are (nearly) empty and the call is harmless."""
    from nvidia.dali.backend import ReleaseUnusedMemory
    gc.collect()
    ReleaseUnusedMemory()


def make_loader(source, batch_size, rank=0, size=1, train=True, image_size=224, seed=0,
                device_id=None, list_file=None, epoch=0, start_image=0, resume=None,
                num_threads=1, prefetch=2, crop_scale=(0.08, 1.0), flip=True, on_bad="skip",
                dtype="float", order=None, val_crop=VAL_CROP):
    """Return a ``Loader`` over rank ``rank``'s batches of epoch ``epoch``.

    source: a ``Dataset`` or an image folder (read with ``read_dataset(source, list_file)``).
    batch_size: images per rank per step. image_size: output side in pixels.
    seed: must be the same on every rank (it orders the epoch; augmentation also mixes in rank).
    device_id: None decodes on CPU; a GPU id decodes with nvJPEG ("mixed") and augments on it.
    start_image: images per rank already consumed this epoch, as ``loader.position`` counts them
    (same value on every rank); used to continue an epoch after a batch change.
    resume: a ``Loader.state()`` dict; replaces epoch/start_image/batch_size and replays the
    consumed steps so that images and augmentation continue exactly.
    num_threads, prefetch: DALI worker threads and batches prepared ahead (memory: prefetch
    batches). crop_scale: area fraction range of the training random-resized crop. flip: random
    horizontal flips in training. on_bad: "skip" undecodable images (see the module doc) or
    "stop" (raise BadImageError naming the file). dtype: "float" (float32 images) or "half"
    (float16, for FP16 training on a GPU: half the bytes of the copy in ``feed``, no cast before
    the first layer). order: the epoch's image order (indices into the dataset) instead of the
    seeded one, for an epoch resharded over another world size (resize.py). val_crop: share of
    the shorter side the validation centre crop covers (the side is resized to image_size /
    val_crop first; 1: the whole image).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    dataset = source if isinstance(source, Dataset) else read_dataset(source, list_file)
    replay = 0
    if resume is not None:
        epoch, start_image = resume["epoch"], resume["start_image"]
        batch_size, replay = resume["batch_size"], resume["consumed_steps"]
    loader = Loader(dataset, batch_size, rank, size, train, image_size, seed, epoch, start_image,
                    device_id, num_threads, prefetch, tuple(crop_scale), flip, on_bad, dtype,
                    order, val_crop)
    for _ in range(replay):
        next(loader)
    return loader


MAX_THREADS = 16   # DALI threads per rank at most: ranks that share one binding mask (Open MPI
#                    binds to the package above 2 ranks) would otherwise each take all of it


def rank_cpus(local_ranks):
    """(CPUs this rank may use, whence): Slurm's --cpus-per-task (``SLURM_CPUS_PER_TASK``) within
    the rank's affinity mask; else the mask (``os.sched_getaffinity``: cgroups, taskset, mpirun's
    binding), shared by the host's ``local_ranks`` ranks when it is the whole host (no binding).
    ``os.cpu_count()`` counts the host whatever the job was given."""
    mask = len(os.sched_getaffinity(0))
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return min(int(slurm), mask), "Slurm's --cpus-per-task"
    if mask >= (os.cpu_count() or mask):
        return max(1, mask // max(1, local_ranks)), f"the host's CPUs / {local_ranks} ranks"
    return mask, "the rank's CPU binding"


def threads_per_rank(local_ranks, cpus=None):
    """DALI worker threads for one of ``local_ranks`` ranks on this host: the CPUs it may use
    (``rank_cpus``; ``cpus``: the host's, shared), at least 1, at most MAX_THREADS. The mixed
    (GPU) JPEG decoder still parses and does its Huffman stage on these host threads, so one
    thread starves a GPU: bind each rank to its cores near its GPU (docs/gpu.md, "Binding")."""
    if cpus is None:
        cpus = rank_cpus(local_ranks)[0]
    else:
        cpus //= max(1, local_ranks)
    return max(1, min(MAX_THREADS, cpus))
