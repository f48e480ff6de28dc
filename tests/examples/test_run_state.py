"""train.py's run state (run_state.py): a misspelt field fails loudly instead of adding one."""
import pytest

from examples.imagenet.run_state import Parallel, Progress, RunState, Settings


def test_a_misspelt_field_raises():
    progress = Progress()
    progress.step += 1
    with pytest.raises(AttributeError, match="stpe"):
        progress.stpe = 2
    run = RunState(Settings(cfg=None, log=print, type_config="float", device_id=None),
                   Parallel(comm=None), data=None, net=None, planning=None, state=None)
    with pytest.raises(AttributeError, match="comm"):
        run.comm = None                      # a field of run.parallel, not of the run
    assert run.progress.step == 0 and run.progress.history == []
