"""Every Python block of docs/own-script.md runs as written (one process, in a fresh folder),
and the adaptive step's diff turns the restartable script into the adaptive one."""
import os
import re
import subprocess
import sys

import pytest

from tests.mpirun import REPO

PAGE = os.path.join(REPO, "docs", "own-script.md")
TEXT = open(PAGE).read()
BLOCKS = re.findall(r"^```python\n(.*?)^```$", TEXT, re.M | re.S)


def test_the_page_has_its_three_scripts():
    assert len(BLOCKS) == 3


def test_the_adaptive_diff_goes_from_the_restartable_script_to_the_adaptive_one():
    section = TEXT[TEXT.index("## 4. Adaptive"):]
    diff = re.search(r"^```diff\n(.*?)^```$", section, re.M | re.S).group(1)
    restartable, adaptive = (set(block.splitlines()) for block in BLOCKS[1:])
    for line in diff.splitlines():
        if line.startswith("-"):
            assert line[1:] in restartable and line[1:] not in adaptive, line
        elif line.startswith("+"):
            assert line[1:] in adaptive, line
        elif line != " ...":
            assert line[1:] in restartable and line[1:] in adaptive, line


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_python_block_runs(tmp_path, index):
    script = tmp_path / "script.py"
    script.write_text(BLOCKS[index])
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 40" in done.stdout, done.stdout
    assert list(tmp_path.glob("**/params.h5")), os.listdir(tmp_path)
    if "State(" in BLOCKS[index]:                         # restartable: a second run resumes
        again = subprocess.run([sys.executable, str(script), "--resume", "1"], cwd=tmp_path,
                               env=env, timeout=300, capture_output=True, text=True)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "resumed from runs/mine/ckpt-000000040.npz.chk: step 40" in again.stdout, \
            again.stdout
