"""The recommendation that respects the model's error: the simplest plan whose predicted goodput
is within the model's error of the best, and the reason when the best is not taken.

Simplest, in this order: fewer GPUs, then nnabla's own all-reduce (``native``: NCCL through
``all_reduce_callback``, nothing of ours on the path), then torus rows inside hosts (a row that
crosses hosts puts the n-byte phase on the slower links). A plan further down that order is
taken only when its predicted goodput beats every simpler plan's by more than the error the model
makes on the published runs it was fitted to (:func:`.fidelity.model_error`). Example::

    >>> import numpy as np

from .candidates import gpus_text
    >>> cols = {"gpus": np.array([8, 8]), "algorithm": np.array([3, 1]),   # one 8-GPU host
    ...         "grid_x": np.array([8, 2]), "goodput": np.array([100.0, 100.15])}
    >>> names = ("ring", "torus2d", "hierarchical", "native")    # costmodel.ALGORITHMS
    >>> chosen, best = choose(cols, 0.04, 8, names)
    >>> int(chosen), int(best)
    (0, 1)
    >>> why(cols, chosen, best, 0.04, 8, names)
    'torus2d on 2x4 would be 0.15% faster by the model, within its error (4.0%): native kept'
"""
import numpy as np

from .candidates import gpus_text


def _crosses_hosts(cols, gpus_per_host):
    return cols["grid_x"] > gpus_per_host


def choose(cols, error, gpus_per_host, algorithms, mask=None):
    """(chosen index, best index) of the candidate columns ``cols`` (gpus, algorithm index
    into ``algorithms``, grid_x, goodput): the best by goodput, and the simplest within
    ``error`` (a fraction) of it. (None, None) when ``mask`` leaves nothing."""
    value = np.where(mask if mask is not None else True, cols["goodput"], -np.inf)
    if not np.isfinite(value.max()):
        return None, None
    best = int(np.argmax(value))
    near = value * (1.0 + error) >= value[best]
    native = np.asarray(algorithms)[cols["algorithm"]] == "native"
    keys = (-value, _crosses_hosts(cols, gpus_per_host), ~native, cols["gpus"])
    order = np.lexsort(keys)                     # the last key sorts first
    return int(order[np.flatnonzero(near[order])[0]]), best


def why(cols, chosen, best, error, gpus_per_host, algorithms):
    """One line when the simplest plan is kept over a predicted-faster one ('' otherwise, and
    between algorithms on one GPU, where nothing is all-reduced)."""
    if chosen == best or cols["gpus"][chosen] == cols["gpus"][best] == 1:
        return ""
    gain = cols["goodput"][best] / cols["goodput"][chosen] - 1.0

    def name(i):
        grid = f"{int(cols['grid_x'][i])}x{int(cols['gpus'][i] // cols['grid_x'][i])}"
        return f"{algorithms[int(cols['algorithm'][i])]} on {grid}"
    kept = [algorithms[int(cols["algorithm"][chosen])]]
    if cols["gpus"][chosen] < cols["gpus"][best]:
        kept.append(gpus_text(int(cols['gpus'][chosen])))
    if _crosses_hosts(cols, gpus_per_host)[best] and not _crosses_hosts(cols, gpus_per_host)[
            chosen]:
        kept.append("rows inside hosts")
    more = (f" with {gpus_text(int(cols['gpus'][best]))}"
            if cols["gpus"][best] != cols["gpus"][chosen] else "")
    return (f"{name(best)}{more} would be {gain:.2%} faster by the model, within its error "
            f"({error:.1%}): {', '.join(kept)} kept")
