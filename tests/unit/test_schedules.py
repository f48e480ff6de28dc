"""Batch and learning-rate schedules: hand-worked values and bad input."""
import math
import re

import pytest

from nnabla_torus.planning.schedules import BatchSchedule, LearningRateSchedule


def test_batch_schedule_phases_and_parse():
    bs = BatchSchedule.parse("0:34K,5:68K")
    assert bs.phases == [(0.0, 34816), (5.0, 69632)]
    assert [bs.batch(e) for e in (0, 4.999, 5, 89)] == [34816, 34816, 69632, 69632]
    assert str(BatchSchedule([(0, 1), (5, 2)])) == "0:1,5:2"


@pytest.mark.parametrize("bad, why", [
    ("5:256", "batch schedule 5:256 must start at epoch 0, e.g. '0:34816,5:69632'"),
    ("0:abc", "batch schedule item '0:abc' is not 'epoch:batch' (e.g. '0:34816,5:69632' or"),
    ("0:0", "batch schedule 0:0: every global batch must be >= 1"),
    ("0:1,0:2", "batch schedule 0:1,0:2: epochs must increase strictly from one phase to the"),
    ("0:64,5:128,3:256", "0:64,5:128,3:256: epochs must increase strictly"),
    ("nan:128", "batch schedule nan:128 must start at epoch 0"),
    ("0:64,inf:128", "batch schedule 0:64,inf:128: epochs must be finite"),
])
def test_batch_schedule_rejects(bad, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        BatchSchedule.parse(bad)


def test_warmup_is_linear_and_reaches_base():
    lr = LearningRateSchedule(0.4, epochs=90, warmup_epochs=5, warmup_start_lr=0.1)
    assert lr.lr(0) == pytest.approx(0.1)
    assert lr.lr(2.5) == pytest.approx(0.25)
    assert lr.lr(5) == pytest.approx(0.4)


def test_decays():
    cos = LearningRateSchedule(1.0, 10, warmup_epochs=0, decay="cosine")
    assert cos.lr(5) == pytest.approx(0.5) and cos.lr(10) == pytest.approx(0.0, abs=1e-12)
    step = LearningRateSchedule(1.0, 90, warmup_epochs=0, decay="step", milestones=(30, 60))
    assert [step.lr(e) for e in (29, 30, 61)] == pytest.approx([1.0, 0.1, 0.01])
    poly = LearningRateSchedule(1.0, 10, warmup_epochs=0, decay="poly", power=2.0)
    assert poly.lr(5) == pytest.approx(0.25)
    assert LearningRateSchedule(1.0, 10, 0, decay="none").lr(9) == 1.0
    assert math.isclose(cos.lr(20), 0.0, abs_tol=1e-12)   # clamps past the end


def test_lr_schedule_rejects():
    with pytest.raises(ValueError, match="decay"):
        LearningRateSchedule(0.1, 90, decay="exp")
    with pytest.raises(ValueError, match="warmup"):
        LearningRateSchedule(0.1, 5, warmup_epochs=5)
