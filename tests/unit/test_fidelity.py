"""The shipped profiles against published runs (planning/fidelity.py): every fitting run within
10 % in images/s and time to train, the profiles' compute the least-squares fit of those runs,
and docs/fidelity.md's table the one tools/research/fidelity.py prints from the shipped profiles."""
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
    spec = importlib.util.spec_from_file_location(
        "fidelity_tool", os.path.join(ROOT, "tools", "research", "fidelity.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with open(os.path.join(ROOT, "docs", "fidelity.md"), encoding="utf-8") as f:
        doc = f.read()
    assert tool.table() in doc
    assert tool.sony_report() in doc        # Sony's runs term by term, before and after


@pytest.mark.parametrize("module", ["fidelity", "published_throughput"])
def test_docstring_examples(module):
    import doctest
    result = doctest.testmod(importlib.import_module(f"nnabla_torus.planning.{module}"))
    assert result.failed == 0 and result.attempted > 0


def test_start_up_and_evaluation_of_the_published_runs():
    """MLPerf's initialisation grows with the nodes; one evaluation on one GPU costs less on
    faster GPUs (V100 > A100 > H100)."""
    result = fidelity.run_costs_fit()
    assert 0 < result.startup_s_per_doubling < 20
    assert all(5 < s < 120 for s in result.startup_s.values())
    gpu_s = result.validation_gpu_s
    assert gpu_s["abci"] > gpu_s["dgx-a100"] > gpu_s["dgx-h100"]


def test_fixed_costs_grow_with_hosts_and_epochs_and_validation_shrinks_with_gpus():
    from nnabla_torus.planning.fixed_costs import fixed_seconds
    run = {"startup_s": 40.0, "startup_s_per_doubling": 5.0, "validation_gpu_s": 8.0,
           "validate_every_epochs": 1.0, "loader_stall_ms": 1.0}
    one, four = fixed_seconds(run, 1, 8, 90, 100), fixed_seconds(run, 4, 32, 90, 100)
    assert (one["startup"], four["startup"]) == (40.0, 50.0)
    assert one["validation"] == pytest.approx(90 * 8.0 / 8) == 4 * four["validation"]
    assert one["loader_stalls"] == pytest.approx(0.1)
    assert fixed_seconds({**run, "validate_every_epochs": 0}, 1, 8, 90, 1)["validation"] == 0
    import doctest
    from nnabla_torus.planning import fixed_costs
    assert doctest.testmod(fixed_costs).failed == 0


def test_the_profiles_hold_the_run_costs_fit_and_the_measured_error():
    fitted = fidelity.run_costs_fit()
    for name in fitted.startup_s:
        prof = load_profile(name)
        run = prof.extra["run"]
        assert run["startup_s"] == pytest.approx(fitted.startup_s[name], abs=0.05), name
        assert run["startup_s_per_doubling"] == pytest.approx(fitted.startup_s_per_doubling,
                                                              abs=0.005)
        assert run["validation_gpu_s"] == pytest.approx(fitted.validation_gpu_s[name], abs=0.05)
        assert prof.extra["calibration"]["model_error"] == pytest.approx(
            fidelity.model_error(), abs=5e-4), name
