"""Checkpoint files that survive crashes: atomic writes, a checksum, fallback to an older one.

A checkpoint is one file ``ckpt-<step>.npz.chk``: an ``.npz`` archive (named numpy arrays plus
a JSON ``meta`` entry) followed by a trailer, ``MAGIC`` + SHA-256 of the archive, written
through :func:`nnabla_torus.files.atomic_path` (a reader sees the old set of files or the
complete new one). A file that cannot be read (truncated, corrupt, not a file, not readable:
any reason) is renamed aside to ``<name>.bad`` when the newest intact one is looked for, with
its reason logged, so that it never counts among the ``keep`` newest that clean-up spares;
clean-up never deletes the file it has just written. Temporaries of a writer that crashed
(``ckpt-*.tmp<pid>*``) are removed by ``remove_stale_temporaries`` when a run starts, under
the run folder's lock (run_lock.py), so never a live writer's. Example::

    save_checkpoint("runs/x", step=100, arrays={"conv/W": w}, meta={"epoch": 1.5})
    arrays, meta, path = load_latest_checkpoint("runs/x")   # skips unreadable files, says so
"""
import glob
import hashlib
import io
import json
import os
import re
import time

import numpy as np

from nnabla_torus.files import WriteError, atomic_path

MAGIC = b"NNTCKPT1"
TRAILER_BYTES = len(MAGIC) + 32          # magic + SHA-256 digest
NAME = re.compile(r"ckpt-(\d+)\.npz\.chk$")
BAD_SUFFIX = ".bad"                      # an unreadable checkpoint, renamed aside
# temporaries of files.atomic_path (ckpt-N.npz.tmp<pid>.chk) and of earlier versions
TEMPORARIES = ("ckpt-*.npz.tmp*.chk", "ckpt-*.npz.chk.tmp*")


class CheckpointError(RuntimeError):
    """No intact checkpoint could be read, or one could not be written."""


def checkpoint_path(directory, step):
    """The file name of the checkpoint at optimizer step ``step``."""
    return os.path.join(directory, f"ckpt-{step:09d}.npz.chk")


def numpy_as_json(value):
    """A numpy array or number as a list or Python number (``json.dumps``'s ``default``)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def save_checkpoint(directory, step, arrays, meta, keep=3):
    """Write arrays (name -> ndarray) and meta (JSON-able dict; numpy arrays and numbers in it
    are written as lists and numbers) atomically; keep the newest ``keep`` (never deleting the
    file just written). Returns the path written.

    CheckpointError names the file, the error and the free space when the write fails
    (ENOSPC, quota, permissions...).
    """
    os.makedirs(directory, exist_ok=True)
    buffer = io.BytesIO()
    text = json.dumps(meta, default=numpy_as_json)
    np.savez(buffer, __meta__=np.frombuffer(text.encode(), dtype=np.uint8), **arrays)
    payload = buffer.getvalue()
    path = checkpoint_path(directory, step)
    try:
        with atomic_path(path) as temporary, open(temporary, "wb") as f:
            f.write(payload)
            f.write(MAGIC + hashlib.sha256(payload).digest())
    except WriteError as e:
        raise CheckpointError(f"checkpoint of {len(payload) + TRAILER_BYTES} bytes: {e}") from e
    older = [p for p in list_checkpoints(directory) if p != path]
    for old in older[:max(0, len(older) - (keep - 1))]:
        os.remove(old)
    return path


def remove_stale_temporaries(directory, log=print):
    """Remove the temporaries of checkpoint writers that crashed (call once as a run starts,
    on the rank that writes, holding the folder's lock); returns their paths."""
    stale = sorted(path for pattern in TEMPORARIES
                   for path in glob.glob(os.path.join(directory, pattern)))
    for path in stale:
        os.remove(path)
        log(f"checkpoint: removed {path}, left by a write that did not finish")
    return stale


def list_checkpoints(directory):
    """Checkpoint files in ``directory``, oldest first (by step)."""
    found = [p for p in glob.glob(os.path.join(directory, "ckpt-*.npz.chk")) if NAME.search(p)]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path):
    """The optimizer step in a checkpoint's file name: ``.../ckpt-000000040.npz.chk`` -> 40."""
    return int(NAME.search(path).group(1))


def read_checkpoint(path):
    """Return (arrays, meta) of one file; raise CheckpointError with the reason when it cannot
    be read: truncated, corrupt, a folder, no permission, not an archive, no meta..."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror or e})") from e
    payload, trailer = blob[:-TRAILER_BYTES], blob[-TRAILER_BYTES:]
    if len(blob) < TRAILER_BYTES or not trailer.startswith(MAGIC):
        raise CheckpointError(f"{path} is truncated (no checksum trailer)")
    if hashlib.sha256(payload).digest() != trailer[len(MAGIC):]:
        raise CheckpointError(f"{path} is corrupt (SHA-256 mismatch)")
    try:
        with np.load(io.BytesIO(payload)) as archive:
            arrays = {name: archive[name] for name in archive.files if name != "__meta__"}
            meta = json.loads(archive["__meta__"].tobytes().decode())
    except Exception as e:  # noqa: BLE001 -- an intact checksum over a payload numpy refuses
        raise CheckpointError(f"{path} is not a checkpoint archive ({type(e).__name__}: "
                              f"{e})") from e
    return arrays, meta


def load_latest_checkpoint(directory, log=print):
    """Return (arrays, meta, path) of the newest intact checkpoint in ``directory``.

    Files that cannot be read are reported through ``log`` with the reason, renamed aside
    (``<name>.bad``, out of the clean-up's count) and skipped in favour of the previous one;
    raises CheckpointError naming every file tried when none is intact, and FileNotFoundError
    when there is none at all.
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
            log(f"checkpoint: {e}; {set_aside(path)}; trying the previous one")
            continue
        return arrays, meta, path
    raise CheckpointError(f"no intact checkpoint in {directory}: " + "; ".join(problems) +
                          " (each renamed to *.bad). Start without --resume, or resume from a "
                          "copy of a good checkpoint")


def set_aside_earlier_run(directory, run_files=(), log=print):
    """Move what an earlier run left in ``directory`` (its checkpoints, and the files matching
    the patterns ``run_files``: its model, plots...) into ``directory/earlier-run-<time of its
    newest file>`` before a new run (no --resume) writes there; returns that folder, or None
    when there is nothing. A new run then never mixes its checkpoints with another run's nor
    overwrites its model, and the earlier run's files stay whole (it resumes from the new
    folder)."""
    found = list_checkpoints(directory)
    moved = [p for pattern in ("ckpt-*.npz.chk*",) + tuple(run_files)
             for p in glob.glob(os.path.join(directory, pattern)) if os.path.isfile(p)]
    if not moved:
        return None
    newest = max(os.path.getmtime(p) for p in found or moved)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(newest))
    aside = os.path.join(directory, f"earlier-run-{stamp}")
    suffix = 1
    while os.path.exists(aside):
        suffix += 1
        aside = os.path.join(directory, f"earlier-run-{stamp}-{suffix}")
    os.makedirs(aside)
    for path in moved:
        os.replace(path, os.path.join(aside, os.path.basename(path)))
    held = (f"checkpoints of steps {checkpoint_step(found[0])}-{checkpoint_step(found[-1])}"
            if found else "no checkpoints, its model or plots")
    log(f"warning: {directory} held an earlier run ({held}): its {len(moved)} files moved to "
        f"{aside}" + (f" (continue it with --output-dir {aside} --resume 1)" if found else ""))
    return aside


def set_aside(path):
    """Rename an unreadable checkpoint to ``<path>.bad``; returns what was done (for the log)."""
    try:
        os.replace(path, path + BAD_SUFFIX)
    except OSError as e:
        return f"could not rename it aside ({e.strerror or e}), left in place"
    return f"renamed to {os.path.basename(path) + BAD_SUFFIX}"
