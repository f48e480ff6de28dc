"""The recommendation moves away from the simplest plan (fewer GPUs, nnabla's native all-reduce,
rows inside hosts) only when the predicted gain beats the model's error (planning/simplest.py)."""
import doctest

import numpy as np

from nnabla_torus.planning import simplest
from nnabla_torus.planning.costmodel import ALGORITHMS

NATIVE, TORUS = ALGORITHMS.index("native"), ALGORITHMS.index("torus2d")


def cols(gpus, algorithm, grid_x, goodput):
    return {"gpus": np.array(gpus), "algorithm": np.array(algorithm),
            "grid_x": np.array(grid_x), "goodput": np.array(goodput, float)}


def test_docstring_example():
    result = doctest.testmod(simplest)
    assert result.failed == 0 and result.attempted > 0


def test_a_gain_beyond_the_error_moves_and_one_within_it_does_not():
    c = cols([8, 8], [NATIVE, TORUS], [8, 2], [100.0, 110.0])
    assert simplest.choose(c, 0.04, 8, ALGORITHMS) == (1, 1)      # 10 % > 4 %: torus2d
    assert simplest.choose(c, 0.12, 8, ALGORITHMS) == (0, 1)      # within 12 %: native
    assert "native kept" in simplest.why(c, 0, 1, 0.12, 8, ALGORITHMS)


def test_fewer_gpus_then_native_then_rows_inside_hosts():
    # 16 GPUs on 2 hosts of 8: rows of 16 cross hosts, rows of 8 do not
    c = cols([8, 16, 16, 16], [TORUS, NATIVE, TORUS, TORUS], [8, 16, 16, 8],
             [100.0, 199.0, 200.0, 199.5])
    chosen, best = simplest.choose(c, 0.01, 8, ALGORITHMS)
    assert (chosen, best) == (1, 2)          # 16 GPUs pay (2x); native within 1 % of the best
    c["algorithm"][1] = TORUS                # no native: the row inside hosts wins
    chosen, _ = simplest.choose(c, 0.01, 8, ALGORITHMS)
    assert chosen == 3 and "rows inside hosts" in simplest.why(c, 3, 2, 0.01, 8, ALGORITHMS)


def test_a_mask_leaves_out_candidates_and_an_empty_one_gives_none():
    c = cols([8, 16], [NATIVE, NATIVE], [8, 16], [100.0, 200.0])
    assert simplest.choose(c, 0.04, 8, ALGORITHMS, mask=np.array([True, False])) == (0, 0)
    assert simplest.choose(c, 0.04, 8, ALGORITHMS, mask=np.array([False, False])) == (None, None)
