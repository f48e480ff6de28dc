"""BucketedAllReduce without MPI: its thread ends on close(), and a failed backward drains."""
import threading
import time

import numpy as np
import nnabla as nn
import nnabla.functions as F
import nnabla.parametric_functions as PF
import pytest

from nnabla_torus.overlap import BucketedAllReduce


class SlowComm:
    """One rank: all_reduce is the identity, after ``delay_s``; records the calls."""

    def __init__(self, delay_s=0.0):
        self.delay_s, self.calls = delay_s, 0

    def all_reduce(self, grads, division=True, inplace=False):
        time.sleep(self.delay_s)
        self.calls += 1


def small_graph():
    nn.clear_parameters()
    x = nn.Variable.from_numpy_array(np.arange(12.0).reshape(3, 4))
    h = F.relu(PF.affine(x, 5, name="fc1"))
    loss = F.mean(PF.affine(h, 2, name="fc2"))
    return loss, nn.get_parameters()


def test_closed_reducers_leave_no_threads():
    loss, params = small_graph()
    before = threading.active_count()
    for _ in range(4):
        reducer = BucketedAllReduce(SlowComm(), loss, params, bucket_mib=1e-5)
        loss.forward()
        reducer.backward(loss)
        reducer.close()
        reducer.close()                              # idempotent
    assert threading.active_count() == before


def test_failed_backward_waits_for_queued_buckets():
    loss, params = small_graph()
    comm = SlowComm(delay_s=0.1)
    reducer = BucketedAllReduce(comm, loss, params, bucket_mib=1e-5)   # a bucket per parameter
    loss.forward()
    count_down, seen = reducer.hook, []

    def failing_hook(func):
        count_down(func)
        seen.append(func.info.type_name)
        if len(seen) == 3:                 # mean, fc2's affine (2 buckets queued), relu
            raise RuntimeError("backward failed")
    reducer.hook = failing_hook
    # nnabla 1.39 wraps a hook's error in SystemError ("... returned a result with an exception
    # set"; Python 3.8 says "an error set"), the hook's own at the end of the chain
    with pytest.raises((RuntimeError, SystemError), match="backward failed|returned a result "
                       "with an (exception|error) set") as raised:
        reducer.backward(loss)
    chain, error = [], raised.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    assert chain[-1] == "backward failed", chain
    assert comm.calls == 2 and reducer.pending.unfinished_tasks == 0   # drained, none new
    reducer.close()
