"""One default-profile rule: every tool's --profile defaults to profile.default_profile (abci
for GPU jobs, cpu-2core for CPU jobs) and NNABLA_TORUS_PROFILE overrides it everywhere."""
import pytest

from nnabla_torus.launching import elastic
from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.planning.machine_profile import PROFILE_ENV, default_profile
from tools import simulate


def parsed_profiles():
    """{tool: the --profile its parser gives without flags} (parsers read the env when built)."""
    return {"nnabla-torus-plan": plan_cli.build_parser().parse_args([]).profile,
            "nnabla-torus-run": elastic.build_parser().parse_args([]).profile,
            "tools/simulate.py paper": simulate.build_parser().parse_args(["paper"]).profile}


def test_each_tool_defaults_to_the_rule_for_its_jobs(monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert parsed_profiles() == {"nnabla-torus-plan": default_profile(gpus=True),
                                 "nnabla-torus-run": default_profile(gpus=False),
                                 "tools/simulate.py paper": default_profile(gpus=True)}


@pytest.mark.parametrize("name", ["abci", "cpu-2core"])
def test_the_environment_names_the_profile_for_every_tool(monkeypatch, name):
    monkeypatch.setenv(PROFILE_ENV, name)
    assert set(parsed_profiles().values()) == {name}
