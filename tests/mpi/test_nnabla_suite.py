"""nnabla's own communicator tests (v1.39.0 ``python/test/communicator/``, not in this
repository) pass whole against our communicator on CPU: ``tools/research/nnabla_suite.py`` with a
checkout of sony/nnabla in ``NNABLA_SRC`` (skipped without one). 81 pass; nnabla skips the
other 2 itself, always ("Always skip. Deprecated.", "Skip until nccl is fixed.")."""
import os

import pytest

from tests.slowdown import scaled
from tools.research import nnabla_suite

NNABLA_SRC = os.environ.get("NNABLA_SRC")


@pytest.mark.slow
@pytest.mark.skipif(not NNABLA_SRC, reason="needs a checkout of sony/nnabla v1.39.0 in "
                    "NNABLA_SRC (git clone -b v1.39.0 https://github.com/sony/nnabla)")
def test_nnabla_communicator_suite_passes_whole():
    out, summaries = nnabla_suite.run(NNABLA_SRC, 2, timeout=scaled(1500))
    assert summaries == ["81 passed, 2 skipped"] * 2, out
