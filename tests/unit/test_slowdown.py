"""tests/slowdown.py: one factor per session scales the suite's wall-clock limits."""
import pytest

from tests import slowdown


def test_the_variable_sets_the_factor(monkeypatch):
    monkeypatch.setenv(slowdown.ENV, "2.5")
    assert slowdown.slowdown() == 2.5
    assert slowdown.scaled(120) == 300.0


@pytest.mark.parametrize("text", ["0.5", "fast", "nan", ""])
def test_a_bad_value_names_itself_and_the_range(monkeypatch, text):
    monkeypatch.setenv(slowdown.ENV, text)
    with pytest.raises(ValueError, match=rf"{slowdown.ENV}='{text}' is not a valid value: must "
                                         r"be a number >= 1 \(how many times slower"):
        slowdown.slowdown()


def test_measured_once_then_reused(monkeypatch):
    """Without the variable the loop is timed, the factor stored in it (for the jobs the tests
    start) and read back from there."""
    monkeypatch.setenv(slowdown.ENV, "1")    # so that the factor stored below is undone after
    monkeypatch.delenv(slowdown.ENV)
    calls = []

    def measure():
        calls.append(1)
        return 3.0
    monkeypatch.setattr(slowdown, "measure_slowdown", measure)
    assert slowdown.slowdown() == 3.0 and slowdown.slowdown() == 3.0
    assert calls == [1]
    assert slowdown.scaled(20) == 60.0


def test_the_measured_factor_is_at_least_one(monkeypatch):
    monkeypatch.setattr(slowdown, "LOOP_LENGTH", 1000)   # a fast machine: never below 1
    assert slowdown.measure_slowdown() == 1.0
