"""docs/planner.md's user loop, run as written on 2 ranks: with only the public API
(``nnabla_torus.training.AdaptiveBatch``) its global batch grows from B0 during the run.

Before this API the page's snippet measured the noise scale but never moved the batch (its
throughput was flat: "throughput 1 -> 1 samples/s"); the loop here must see a change.
"""
import os
import re

import pytest

from tests.mpirun import REPO, run_mpi

PAGE = os.path.join(REPO, "docs", "planner.md")


def loop_of_page():
    """The Python block of the page's section "In a training loop"."""
    text = open(PAGE, encoding="utf-8").read()
    section = text[text.index("## In a training loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_documented_loop_changes_its_global_batch(tmp_path):
    program = tmp_path / "loop.py"
    program.write_text(loop_of_page())
    out = run_mpi(2, [str(program)], timeout=240)
    starts = re.findall(r"step 0: epoch 0\.00: goodput: start at B0 = 16 ", out)
    assert len(starts) == 1, out                                   # rank 0 alone prints
    changes = re.findall(r"step (\d+): epoch [\d.]+: goodput: change, .* realised as 2 ranks "
                         r"x (\d+) x (\d+) accumulation = (\d+),", out)
    assert changes, out
    for step, local, accum, global_batch in changes:
        assert int(global_batch) == 2 * int(local) * int(accum) > 16, changes
        assert int(global_batch) <= 512 and int(local) <= 256, changes
    # decided on the run's rank-mean measured step times (2 warm-up + 5 steps at B0 first)
    assert int(changes[0][0]) >= 7, changes
    assert "throughput from measured step times" in out, out
    assert "adaptive batch: fixed" not in out, out


def test_the_api_docstring_shows_the_same_loop():
    import textwrap

    from nnabla_torus.training import adaptive
    doc = adaptive.__doc__
    example = textwrap.dedent(doc[doc.index("::\n\n") + 4:])
    assert example.strip() == loop_of_page().strip()
