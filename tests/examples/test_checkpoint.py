"""Checkpoint files: round trip, atomic write, keep-N, corrupt/truncated detection + fallback."""
import errno
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from nnabla_torus.training.checkpoint_file import (CheckpointError, list_checkpoints,
                                          load_latest_checkpoint, remove_stale_temporaries,
                                          save_checkpoint)


def arrays_at(step):
    return {"conv/W": np.full((3, 2), step, np.float32), "bn/mean": np.arange(4.0) + step}


def test_round_trip_and_keep(tmp_path):
    for step in (10, 20, 30, 40):
        save_checkpoint(str(tmp_path), step, arrays_at(step), {"step": step, "epoch": step / 10})
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == \
        ["ckpt-000000020.npz.chk", "ckpt-000000030.npz.chk", "ckpt-000000040.npz.chk"]
    arrays, meta, path = load_latest_checkpoint(str(tmp_path))
    assert meta == {"step": 40, "epoch": 4.0}
    np.testing.assert_array_equal(arrays["conv/W"], arrays_at(40)["conv/W"])
    np.testing.assert_array_equal(arrays["bn/mean"], arrays_at(40)["bn/mean"])
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]   # no temp file left behind


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    save_checkpoint(str(tmp_path), 1, arrays_at(1), {"step": 1})

    def crash(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(CheckpointError, match="disk full"):
        save_checkpoint(str(tmp_path), 2, arrays_at(2), {"step": 2})
    monkeypatch.undo()
    _, meta, _ = load_latest_checkpoint(str(tmp_path))
    assert meta["step"] == 1
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]   # the failed write cleaned up


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_latest_falls_back_to_previous(tmp_path, damage):
    save_checkpoint(str(tmp_path), 1, arrays_at(1), {"step": 1})
    newest = save_checkpoint(str(tmp_path), 2, arrays_at(2), {"step": 2})
    blob = bytearray(open(newest, "rb").read())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        blob[100] ^= 0xFF
    open(newest, "wb").write(bytes(blob))
    messages = []
    _, meta, path = load_latest_checkpoint(str(tmp_path), log=messages.append)
    assert meta["step"] == 1
    assert len(messages) == 1 and os.path.basename(newest) in messages[0]
    assert ("truncated" if damage == "truncate" else "SHA-256") in messages[0]


def test_no_intact_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_latest_checkpoint(str(tmp_path))
    path = save_checkpoint(str(tmp_path), 5, arrays_at(5), {"step": 5})
    open(path, "wb").write(b"garbage")
    with pytest.raises(CheckpointError, match="no intact checkpoint.*ckpt-000000005"):
        load_latest_checkpoint(str(tmp_path), log=lambda m: None)



# -- unreadable files of every kind: (damage, reason in the log) ----------------------------
def truncate(path, monkeypatch):
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:len(blob) // 2])


def flip(path, monkeypatch):
    blob = bytearray(open(path, "rb").read())
    blob[100] ^= 0xFF
    open(path, "wb").write(bytes(blob))


def folder(path, monkeypatch):
    os.remove(path)
    os.mkdir(path)


def not_an_archive(path, monkeypatch):       # a valid trailer over bytes numpy refuses
    import hashlib
    from nnabla_torus.training.checkpoint_file import MAGIC
    open(path, "wb").write(b"junk" + MAGIC + hashlib.sha256(b"junk").digest())


def no_permission(path, monkeypatch):        # root reads any mode: refuse it in open()
    real = open

    def refuse(name, *args, **kwargs):
        if str(name) == path:
            raise PermissionError(errno.EACCES, "Permission denied", name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr("builtins.open", refuse)


UNREADABLE = [(truncate, "is truncated"), (flip, "SHA-256 mismatch"),
              (folder, "cannot be read (Is a directory)"),
              (not_an_archive, "is not a checkpoint archive (ValueError"),
              (no_permission, "cannot be read (Permission denied)")]


@pytest.mark.parametrize("damage, reason", UNREADABLE, ids=[d.__name__ for d, _ in UNREADABLE])
def test_any_unreadable_newest_falls_back_with_its_reason(tmp_path, monkeypatch, damage, reason):
    """Before: a folder, no permission or a bad archive raised a traceback (only a
    CheckpointError fell back)."""
    save_checkpoint(str(tmp_path), 1, arrays_at(1), {"step": 1})
    newest = save_checkpoint(str(tmp_path), 2, arrays_at(2), {"step": 2})
    damage(newest, monkeypatch)
    messages = []
    _, meta, _ = load_latest_checkpoint(str(tmp_path), log=messages.append)
    assert meta["step"] == 1 and len(messages) == 1 and reason in messages[0], messages
    assert f"renamed to {os.path.basename(newest)}.bad" in messages[0]


def test_clean_up_never_deletes_the_newest_intact_checkpoint(tmp_path):
    """The newest truncated, the next corrupt: the resumed run reads the intact older one and
    its keep-3 rule must not count the two bad files (before: it deleted the intact one)."""
    for step in (10, 20, 30):
        save_checkpoint(str(tmp_path), step, arrays_at(step), {"step": step})
    truncate(os.path.join(tmp_path, "ckpt-000000030.npz.chk"), None)
    flip(os.path.join(tmp_path, "ckpt-000000020.npz.chk"), None)
    _, meta, path = load_latest_checkpoint(str(tmp_path), log=lambda m: None)
    assert meta["step"] == 10
    save_checkpoint(str(tmp_path), 12, arrays_at(12), {"step": 12})
    save_checkpoint(str(tmp_path), 14, arrays_at(14), {"step": 14})
    assert [os.path.basename(p) for p in list_checkpoints(str(tmp_path))] == \
        ["ckpt-000000010.npz.chk", "ckpt-000000012.npz.chk", "ckpt-000000014.npz.chk"]
    # A folder holding newer checkpoints of another run: the file just written stays.
    written = save_checkpoint(str(tmp_path), 1, arrays_at(1), {"step": 1}, keep=1)
    assert os.path.exists(written)


def test_stale_temporaries_are_removed_at_start(tmp_path):
    """Before: each ckpt-*.tmp<pid> of a crashed writer (a whole checkpoint) stayed forever."""
    stale = [tmp_path / "ckpt-000000040.npz.chk.tmp4242", tmp_path / "ckpt-000000050.npz.tmp77.chk"]
    for path in stale:
        path.write_bytes(b"x" * 1000)
    messages = []
    assert remove_stale_temporaries(str(tmp_path), messages.append) == sorted(map(str, stale))
    assert not any(p.exists() for p in stale)
    assert "left by a write that did not finish" in messages[0]


def test_a_write_error_names_the_path_and_the_free_space(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError) as error:
        save_checkpoint(str(tmp_path), 7, arrays_at(7), {"step": 7})
    text = str(error.value)
    assert "checkpoint of " in text and f"cannot write {tmp_path}/ckpt-000000007.npz.chk:" \
        in text, text
    assert "No space left on device" in text and f"MB free on the file system of {tmp_path}" \
        in text, text


def example_report():
    """examples/imagenet/report.py, imported as train.py does (its folder on the path)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                    "imagenet"))
    import report
    return report


def test_a_blank_or_cut_monitor_line_is_dropped_on_resume(tmp_path):
    """Before: IndexError on a blank line of train_loss.series.txt."""
    report = example_report()
    (tmp_path / "train_loss.series.txt").write_text("1 2.5\n\n2 2.4\n3\n9 1.0\n")
    report.write_series(report.make_monitors(SimpleNamespace(output_dir=str(tmp_path)), 0,
                                             resumed_at=(5, 0.5)))
    assert (tmp_path / "train_loss.series.txt").read_text() == "1 2.5\n2 2.4\n"


def test_every_validation_is_one_row_at_fractional_epochs(tmp_path):
    """Before: after a mid-epoch batch change (epoch 2.08), the rows at 3.00 and 4.08 were one
    row, their mean, at 4.08."""
    report = example_report()
    monitors = report.make_monitors(SimpleNamespace(output_dir=str(tmp_path)), 0)
    for epoch, top1 in ((1.0, 0.1), (2.08, 0.2), (3.0, 0.3), (4.08, 0.4)):
        monitors["val_top1"].add(epoch, top1)
    report.write_series(monitors)
    rows = np.loadtxt(tmp_path / "val_top1.series.txt", ndmin=2)
    np.testing.assert_allclose(rows, [[1.0, 0.1], [2.08, 0.2], [3.0, 0.3], [4.08, 0.4]])


def test_a_new_run_sets_an_earlier_runs_files_aside(tmp_path):
    """A new run (no --resume) into a folder of another run's checkpoints: they move, with the
    model, prior, series and plots the run wrote, into earlier-run-<time>/, and a line says
    so and how to continue it; nothing is deleted. An empty folder is left alone."""
    from nnabla_torus.training.checkpoint_file import checkpoint_step, set_aside_earlier_run
    lines = []
    run_files = ("model.h5", "*.series.txt", "training.png")
    assert set_aside_earlier_run(str(tmp_path), run_files, lines.append) is None and lines == []
    for step in (135, 155):
        save_checkpoint(str(tmp_path), step, {"w": np.zeros(2)}, {"step": step})
    for name in ("model.h5", "train_loss.series.txt", "training.png", "notes.txt"):
        (tmp_path / name).write_text(name)
    aside = set_aside_earlier_run(str(tmp_path), run_files, lines.append)
    assert os.path.dirname(aside) == str(tmp_path)
    assert os.path.basename(aside).startswith("earlier-run-")
    assert [checkpoint_step(p) for p in list_checkpoints(aside)] == [135, 155]
    assert list_checkpoints(str(tmp_path)) == []
    assert sorted(os.listdir(aside)) == sorted(["ckpt-000000135.npz.chk", "ckpt-000000155.npz.chk",
                                                "model.h5", "train_loss.series.txt",
                                                "training.png"])
    assert (tmp_path / "notes.txt").exists()                  # not a file a run writes
    assert len(lines) == 1 and "held an earlier run (checkpoints of steps 135-155)" in lines[0]
    assert f"--output-dir {aside} --resume 1" in lines[0]
