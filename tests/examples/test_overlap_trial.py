"""The example's overlap trial (examples/imagenet/overlap_trial.py): the cost model's choice
runs first, then the other configuration, and the run keeps the one its own steps timed
faster (issue 33: the choice was the cost model's alone, with an assumed backward share)."""
import numpy as np

from examples.imagenet.overlap_trial import TIMED_STEPS, WARMUP_STEPS, OverlapTrial
from nnabla_torus.planning.overlap_choice import OverlapChoice, describe


class TwoRanks:
    """allreduce_numpy of two ranks whose times are equal: the sum is twice ours."""
    size = 2

    def allreduce_numpy(self, array):
        return array * 2


def run(trial, seconds):
    """Observe steps of ``seconds[algorithm]`` until the trial is done; the switches made."""
    switches = []
    for _ in range(3 * (WARMUP_STEPS + TIMED_STEPS)):
        switch = trial.observe(TwoRanks(), seconds[trial.running])
        if switch:
            switches.append(switch)
    return switches


def test_the_measured_faster_configuration_wins_over_the_model():
    model = OverlapChoice("native", 0.08, 0.053, 0.013, 0.015, 0.093, 0.080, 0.0)
    trial = OverlapTrial(model, "4x2")
    assert trial.running == "native"
    switches = run(trial, {"native": 0.120, "torus2d": 0.100})
    assert switches == ["torus2d"] and trial.done and trial.running == "torus2d"
    assert trial.choice.algorithm == "torus2d" and trial.choice.measured == ("native", "torus2d")
    assert np.isclose(trial.choice.native_step_s, 0.120)
    assert "from the run's measured step times" in describe(trial.choice, "abci")


def test_the_model_s_choice_kept_when_it_is_measured_faster():
    model = OverlapChoice("torus2d", 0.08, 0.053, 0.013, 0.015, 0.093, 0.095, 0.0)
    trial = OverlapTrial(model, "4x2")
    switches = run(trial, {"native": 0.120, "torus2d": 0.100})
    assert switches == ["native", "torus2d"] and trial.choice.algorithm == "torus2d"
    assert trial.observe(TwoRanks(), 1.0) is None     # done: no more switches
