"""The shipped profiles against published runs (planning/fidelity.py): every fitting run within
10 % in images/s and time to train, the profiles' compute the least-squares fit of those runs,
and docs/fidelity.md's table the one tools/fidelity.py prints from the shipped profiles."""
import importlib
import importlib.util
import os

import pytest

from nnabla_torus.planning import fidelity
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.published_throughput import RUNS, runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOAL = 0.10   # the goal for fitting runs


@pytest.mark.parametrize("run", runs(role="fit"), ids=lambda r: f"{r.profile}: {r.system}")
def test_every_fitting_run_is_predicted_within_ten_percent(run):
    predicted = fidelity.predict(run)
    assert abs(predicted.images_per_s / run.images_per_s - 1) <= GOAL
    if run.time_s:   # training only against a published time that counts evaluation too
        assert abs(predicted.time_s / run.time_s - 1) <= GOAL


def test_the_profiles_hold_the_fit_of_the_fitting_runs():
    result = fidelity.fit()
    for name, b_s in result.b_s.items():
        comp = load_profile(name).models[fidelity.MODEL]
        assert comp.b_s == pytest.approx(b_s, rel=1e-3), name          # 4 digits in the YAML
        assert comp.a_s == pytest.approx(result.a_s, rel=1e-3), name
        assert comp.gamma == result.gamma, name
    # every GPU profile has at least one fitting run, and every GPU but the H200 two batches
    batches = {n: {r.local_batch for r in runs(n, "fit")} for n in result.b_s}
    assert sorted(batches) == ["abci", "dgx-a100", "dgx-h100", "dgx-h200"]
    assert all(len(b) >= 2 for n, b in batches.items() if n != "dgx-h200")


def test_check_runs_are_reported_and_sane():
    """More than 8 nodes: not fitted, so not held to the goal; predicted within 2x."""
    checks = fidelity.errors(role="check")
    assert len(checks) >= 8 and all(r.nodes > 8 for r in checks)
    assert all(-0.5 < e < 1.0 for e in checks.values())


def test_model_error_is_the_largest_fitting_error():
    errors = fidelity.errors()
    assert fidelity.model_error() == max(abs(e) for e in errors.values()) <= GOAL
    assert fidelity.model_error("dgx-h100") <= fidelity.model_error()


def test_every_run_names_its_source_and_a_role():
    from nnabla_torus.planning.published_throughput import SOURCES
    assert all(r.source in SOURCES and r.role in ("fit", "check", "other") for r in RUNS)
    assert all(r.note for r in RUNS if r.role == "other")
    assert all(r.nodes <= 8 for r in runs(role="fit"))


def test_the_docs_table_is_the_tools_output():
    spec = importlib.util.spec_from_file_location("fidelity_tool",
                                                  os.path.join(ROOT, "tools", "fidelity.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with open(os.path.join(ROOT, "docs", "fidelity.md"), encoding="utf-8") as f:
        doc = f.read()
    assert tool.table() in doc


@pytest.mark.parametrize("module", ["fidelity", "published_throughput"])
def test_docstring_examples(module):
    import doctest
    result = doctest.testmod(importlib.import_module(f"nnabla_torus.planning.{module}"))
    assert result.failed == 0 and result.attempted > 0
