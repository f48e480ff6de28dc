"""The example's progress lines (report.py): counted in dataset positions, so never above 100 %."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
import report  # noqa: E402


def test_progress_never_passes_the_total(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)   # plain lines, not a tqdm bar
    progress = report.Progress(total=17256, initial=0, every=1, enabled=True)
    progress.update(150, 16713.4, 0.83, 0.0004, 128)
    progress.update(155, 17256.0 + 1e-9, 0.64, 0.0001, 128)   # the last step's rounding
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 150: 16,713/17,256 images (96.9%), loss 0.8300"), lines
    assert lines[1].startswith("step 155: 17,256/17,256 images (100.0%)"), lines
