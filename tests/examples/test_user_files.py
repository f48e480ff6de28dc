"""A full disk never costs a user a file (issue 65): the model export and the monitor series
go through a temporary, and the job ends with one line naming the file and the free space.

The full disk is real: a tmpfs of a few hundred KB (``mount -t tmpfs -o size=...``, root
only; skipped elsewhere)."""
import hashlib
import os
import subprocess

import numpy as np
import pytest

from nnabla_torus.files import WriteError
from tests.examples.test_train_export import TINY
from tests.mpirun import REPO, run_mpi

TRAIN = os.path.join(REPO, "examples", "imagenet", "train.py")


@pytest.fixture
def small_disk(tmp_path):
    """mount(kilobytes) -> a folder on a fresh tmpfs of that size, unmounted after the test."""
    mounted = []

    def mount(kilobytes):
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs",
                               str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); needs root")
        mounted.append(folder)
        return folder
    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_model():
    import nnabla as nn
    from models import get_model
    nn.clear_parameters()
    model = get_model("resnet18", 10, 0.125)
    model(nn.Variable((1, 3, 16, 16)), test=True)                  # creates the parameters
    return model


def test_a_full_disk_at_the_export_keeps_the_old_model(small_disk):
    """Before: model.h5 rewritten in place (a half-written file when the disk filled in the
    middle), then h5py's OSError and RuntimeError tracebacks; model.nnp missing."""
    from models import export_model
    disk = small_disk(1200)                                         # model.h5 is ~820 KB
    model = tiny_model()
    (disk / "model.h5").write_bytes(np.random.default_rng(0).bytes(820_000))  # an old model
    old = digest(disk / "model.h5")
    with pytest.raises(WriteError, match=rf"^cannot write {disk}/model\.h5: No space left on "
                                         rf"device; [\d.]+ MB free on the file system of "
                                         rf"{disk}\. Free some space or write elsewhere$"):
        export_model(model, 16, str(disk), print)
    assert digest(disk / "model.h5") == old
    assert os.listdir(disk) == ["model.h5"]                          # no temporary left


def test_a_full_disk_keeps_the_old_series_file_whole(small_disk):
    """Before: nnabla's MonitorSeries emptied the file when created (a resumed run lost the
    rows it kept until it wrote them back) and appended in place (a cut last line)."""
    from types import SimpleNamespace
    import report
    disk = small_disk(64)
    rows = "".join(f"{step} {0.5 + step:g}\n" for step in range(1, 6))
    (disk / "train_loss.series.txt").write_text(rows)
    monitors = report.make_monitors(SimpleNamespace(output_dir=str(disk)), 0, resumed_at=(3, 0))
    assert (disk / "train_loss.series.txt").read_text() == rows     # untouched until written
    (disk / "filler").write_bytes(b"\0" * (60 << 10))               # the disk fills up
    monitors["train_loss"].add(4, 9.0)
    with pytest.raises(WriteError, match=r"train_loss\.series\.txt: No space left on device"):
        report.write_series(monitors)
    assert (disk / "train_loss.series.txt").read_text() == rows
    os.remove(disk / "filler")
    report.write_series(monitors)
    assert (disk / "train_loss.series.txt").read_text() == "1 1.5\n2 2.5\n3 3.5\n4 9\n"


@pytest.mark.slow
def test_train_on_a_full_disk_ends_with_one_line_and_loses_nothing(small_disk):
    """2 ranks: the disk fills at the model export (the checkpoint still fits), then a disk
    full from the start. Before: three h5py tracebacks and a segfault (exit 139), model.h5
    overwritten; a traceback at the first monitor line."""
    disk = small_disk(2600)              # old model.h5 ~820 KB + checkpoint ~1470 KB + series
    (disk / "model.h5").write_bytes(np.random.default_rng(1).bytes(820_000))
    old = digest(disk / "model.h5")
    log = run_mpi(2, [TRAIN] + TINY + ["--output-dir", str(disk)], timeout=180, check=False)
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1, log
    assert "Traceback" not in log and "Segmentation" not in log, log
    assert (f"train.py: error: cannot write {disk}/model.h5: No space left on device; "
            in errors[0]), log
    # the earlier run's model was set aside whole before this run wrote anything
    aside = [name for name in os.listdir(disk) if name.startswith("earlier-run-")]
    assert len(aside) == 1 and digest(disk / aside[0] / "model.h5") == old, os.listdir(disk)
    assert not (disk / "model.h5").exists()            # the failed export left nothing
    assert not [name for name in os.listdir(disk) if ".tmp" in name]

    full = small_disk(64)
    log = run_mpi(2, [TRAIN] + TINY + ["--output-dir", str(full)], timeout=180, check=False)
    errors = [line for line in log.splitlines() if "error:" in line]
    assert len(errors) == 1 and "No space left on device" in errors[0], log
    assert "Traceback" not in log, log
