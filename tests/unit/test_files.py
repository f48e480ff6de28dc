"""Whole-or-nothing writes: the old file survives a failed write, the error is one line."""
import errno
import os

import pytest

from nnabla_torus.files import WriteError, atomic_open, atomic_path, temporary_path


def test_a_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with atomic_open(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["summary.json"]


def test_the_temporary_keeps_the_extension_for_writers_that_read_it(tmp_path):
    assert temporary_path(str(tmp_path / "model.h5")) == \
        str(tmp_path / f"model.tmp{os.getpid()}.h5")
    with atomic_path(str(tmp_path / "model.h5")) as temporary:
        assert temporary.endswith(".h5")
        with open(temporary, "wb") as f:
            f.write(b"x")
    assert (tmp_path / "model.h5").read_bytes() == b"x"


def test_a_full_disk_keeps_the_old_file_and_names_it_and_the_free_space(tmp_path):
    target = tmp_path / "model.h5"
    target.write_text("good model")

    def full(*_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(WriteError, match=r"cannot write .*model\.h5: No space left on device; "
                                         r"[\d.]+ MB free on the file system of"):
        with atomic_path(str(target)) as temporary:
            with open(temporary, "w") as f:
                f.write("half")
            full()
    assert target.read_text() == "good model"
    assert os.listdir(tmp_path) == ["model.h5"]


def test_an_exception_in_the_writer_leaves_no_temporary_and_is_not_renamed(tmp_path):
    with pytest.raises(KeyError, match="boom"):
        with atomic_open(tmp_path / "a.json", "w") as f:
            f.write("{")
            raise KeyError("boom")
    assert os.listdir(tmp_path) == []


def test_a_device_is_written_directly_never_replaced_by_a_file(tmp_path):
    with atomic_open(os.devnull, "w") as f:
        f.write("thrown away")
    assert not os.path.isfile(os.devnull)          # still the device, not a renamed file
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with atomic_path(str(fifo)) as target:
        assert target == str(fifo)
