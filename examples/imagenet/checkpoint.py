"""Checkpoints that survive crashes: atomic writes, a checksum, and fallback to an older one.

A checkpoint is one file ``ckpt-<step>.npz.chk``: an ``.npz`` archive (named numpy arrays plus
a JSON ``meta`` entry) followed by a trailer, ``MAGIC`` + SHA-256 of the archive. It is written
to a temporary file in the same folder, flushed to disk and renamed (then the folder is
flushed), so a reader sees either the old set of files or the complete new one, never half a
file. Example::

    save_checkpoint("runs/x", step=100, arrays={"conv/W": w}, meta={"epoch": 1.5})
    arrays, meta, path = load_latest_checkpoint("runs/x")   # skips corrupt files, says so
"""
import contextlib
import glob
import hashlib
import io
import json
import os
import re

import numpy as np

MAGIC = b"NNTCKPT1"
TRAILER_BYTES = len(MAGIC) + 32          # magic + SHA-256 digest
NAME = re.compile(r"ckpt-(\d+)\.npz\.chk$")


class CheckpointError(RuntimeError):
    """No intact checkpoint could be read."""


def checkpoint_path(directory, step):
    """The file name of the checkpoint at optimizer step ``step``."""
    return os.path.join(directory, f"ckpt-{step:09d}.npz.chk")


def save_checkpoint(directory, step, arrays, meta, keep=3):
    """Write arrays (name -> ndarray) and meta (JSON-able dict) atomically; keep the newest ``keep``.

    Returns the path written.
    """
    os.makedirs(directory, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    payload = buffer.getvalue()
    path = checkpoint_path(directory, step)
    temp = f"{path}.tmp{os.getpid()}"
    try:
        with open(temp, "wb") as f:
            f.write(payload)
            f.write(MAGIC + hashlib.sha256(payload).digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)            # atomic on POSIX within one file system
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)               # only left when writing or renaming failed
    fsync_directory(directory)            # the rename itself survives a power loss
    for old in list_checkpoints(directory)[:-keep]:
        os.remove(old)
    return path


def fsync_directory(directory):
    """Flush ``directory``'s entries (new and renamed names) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(directory):
    """Checkpoint files in ``directory``, oldest first (by step)."""
    found = [p for p in glob.glob(os.path.join(directory, "ckpt-*.npz.chk")) if NAME.search(p)]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path):
    """The optimizer step in a checkpoint's file name: ``.../ckpt-000000040.npz.chk`` -> 40."""
    return int(NAME.search(path).group(1))


def read_checkpoint(path):
    """Return (arrays, meta) of one file; raise CheckpointError if truncated or corrupt."""
    with open(path, "rb") as f:
        blob = f.read()
    payload, trailer = blob[:-TRAILER_BYTES], blob[-TRAILER_BYTES:]
    if len(blob) < TRAILER_BYTES or not trailer.startswith(MAGIC):
        raise CheckpointError(f"{path} is truncated (no checksum trailer)")
    if hashlib.sha256(payload).digest() != trailer[len(MAGIC):]:
        raise CheckpointError(f"{path} is corrupt (SHA-256 mismatch)")
    with np.load(io.BytesIO(payload)) as archive:
        arrays = {name: archive[name] for name in archive.files if name != "__meta__"}
        meta = json.loads(archive["__meta__"].tobytes().decode())
    return arrays, meta


def load_latest_checkpoint(directory, log=print):
    """Return (arrays, meta, path) of the newest intact checkpoint in ``directory``.

    Corrupt or truncated files are reported through ``log`` and skipped in favour of the
    previous one; raises CheckpointError naming every file tried when none is intact, and
    FileNotFoundError when there is none at all.
    """
    candidates = list_checkpoints(directory)
    if not candidates:
        raise FileNotFoundError(f"--resume: no checkpoint (ckpt-*.npz.chk) in {directory}; "
                                f"start without --resume or point --output-dir at the run")
    problems = []
    for path in reversed(candidates):
        try:
            arrays, meta = read_checkpoint(path)
        except CheckpointError as e:
            problems.append(str(e))
            log(f"checkpoint: {e}; trying the previous one")
            continue
        return arrays, meta, path
    raise CheckpointError(f"no intact checkpoint in {directory}: " + "; ".join(problems) +
                          ". Delete them and start without --resume")


MODEL_FLAGS = {"arch": "--arch", "width": "--width", "classes": "the training list's labels",
               "recipe": "-C"}


def check_model(meta, path, model, shapes, arrays):
    """Raise ValueError unless the checkpoint at ``path`` holds this run's model.

    ``model``: this run's {arch, width, classes, image_size, recipe}, compared with the one
    the checkpoint recorded (``meta["model"]``); ``shapes``: parameter name -> shape of this
    run, compared with the checkpoint's ``arrays`` (also for checkpoints without the record).
    Another recipe is refused too (its schedule and optimizer would continue another run's
    state). Returns a note for the log when only the image size differs (it changes the
    training, not the parameters), else "".
    """
    saved = meta.get("model") or {}
    differ = [f"{key} {saved[key]!r} (this run: {model[key]!r}, {flag})"
              for key, flag in MODEL_FLAGS.items() if key in saved and saved[key] != model[key]]
    wrong = [name for name, shape in shapes.items()
             if name not in arrays or arrays[name].shape != tuple(shape)]
    if differ or wrong:
        what = ", ".join(differ) if differ else (
            f"parameters that do not fit this model (first: {wrong[0]}, "
            f"{arrays[wrong[0]].shape if wrong[0] in arrays else 'missing'} there, "
            f"{tuple(shapes[wrong[0]])} here)")
        raise ValueError(f"--resume: {path} was written with {what}; resume with that run's "
                         f"settings, or start a new run in another --output-dir")
    changed = [f"{key} {saved[key]!r} -> {model[key]!r}" for key in ("image_size",)
               if key in saved and saved[key] != model[key]]
    return f"resume: changed since the checkpoint: {', '.join(changed)}" if changed else ""
