"""nnabla_torus.training.State: what a checkpoint brings back, and its docstring's example."""
import textwrap

import numpy as np

import nnabla_torus.training.state as state_module
from nnabla_torus.training import State


def test_state_round_trip_on_another_rank_count(tmp_path):
    """Counters, extras, a Generator's state and the global batch come back; split re-splits
    the global batch over this rank count."""
    rng = np.random.default_rng(5)
    state = State(None, str(tmp_path), {}, rng=rng, global_batch=96, log=print)
    state.start(resume=False)
    rng.random(3)
    state.step, state.epoch, state.images_seen = 12, 1.5, 1152
    state.extras = {"loss": 0.25, "sums": np.array([[1.5, 2.0]]), "count": np.int64(7)}
    state.save()
    expected = rng.random(2)
    state.close()
    again = State(None, str(tmp_path), {}, rng=np.random.default_rng(0), log=print)
    again.start(resume=True)
    assert (again.step, again.epoch, again.images_seen, again.global_batch) == (12, 1.5, 1152, 96)
    # numpy arrays and numbers come back as lists and numbers (AdaptiveBatch.state_dict's)
    assert again.extras == {"loss": 0.25, "sums": [[1.5, 2.0]], "count": 7}
    assert again.saved_ranks == 1
    np.testing.assert_array_equal(again.rng.random(2), expected)
    again.size = 5
    assert again.split(max_local_batch=8) == (6, 3)     # 5 ranks x 6 x 3 = 90, the nearest
    again.close()


def test_the_docstring_example_runs_and_resumes(tmp_path):
    code = textwrap.dedent(state_module.__doc__.split("::")[1]).replace(
        "/tmp/state-example", str(tmp_path))
    exec(code, {})
    exec(code.replace("resume=False", "resume=True"), {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000003.npz.chk"]


def test_the_launchers_stop_is_seen_only_under_the_launcher(tmp_path):
    import os
    import signal

    import nnabla as nn
    import nnabla.parametric_functions as PF
    with nn.parameter_scope("stop"):
        PF.affine(nn.Variable((1, 2)), 1)
        params = nn.get_parameters()
    before = signal.getsignal(signal.SIGUSR1)
    try:
        quiet = State(None, str(tmp_path / "plain"), params, announce=False)
        quiet.start(resume=False)
        assert not quiet.stop_requested()           # no launcher: never asked, no collective
        quiet.close()
        state = State(None, str(tmp_path / "launched"), params, announce=True)
        state.start(resume=False)
        assert not state.stop_requested()
        os.kill(os.getpid(), signal.SIGUSR1)        # the launcher's Ctrl-C, forwarded
        assert state.stop_requested()
        state.close()
    finally:
        signal.signal(signal.SIGUSR1, before)
