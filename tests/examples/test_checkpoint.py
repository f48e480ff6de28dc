"""Checkpoint files: round trip, atomic write, keep-N, corrupt/truncated detection + fallback."""
import os

import numpy as np
import pytest

from examples.imagenet.checkpoint import (CheckpointError, list_checkpoints,
                                          load_latest_checkpoint, save_checkpoint)


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
    with pytest.raises(OSError):
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

