"""One default-profile rule (machine_profile.profile_rule) for nnabla-torus-plan,
nnabla-torus-run and train.py: cpu-2core for CPU jobs, the profile of this host's GPU model for
GPU jobs, else abci, with the reason printed; NNABLA_TORUS_PROFILE overrides it everywhere."""
import pytest

from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.launching import elastic
from nnabla_torus.planning import machine_profile
from nnabla_torus.planning.machine_profile import (PROFILE_ENV, default_profile, profile_rule,
                                                   resolve_profile)
from nnabla_torus.planning.profile_files import GPU_PROFILES, list_profiles
from tools.research import simulate


def parsed_profiles():
    """{tool: the --profile its parser gives without flags} (parsers read the env when built)."""
    return {"nnabla-torus-plan": plan_cli.build_parser().parse_args([]).profile,
            "nnabla-torus-run": elastic.build_parser().parse_args([]).profile,
            "tools/research/simulate.py paper":
                simulate.build_parser().parse_args(["paper"]).profile}


def test_no_flag_leaves_the_choice_to_the_rule(monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    assert set(parsed_profiles().values()) == {None}


@pytest.mark.parametrize("name", ["abci", "cpu-2core", "dgx-h100"])
def test_the_environment_names_the_profile_for_every_tool(monkeypatch, name):
    monkeypatch.setenv(PROFILE_ENV, name)
    assert set(parsed_profiles().values()) == {name}
    assert resolve_profile(name, gpus=True) == (name, "named by --profile / NNABLA_TORUS_PROFILE")


@pytest.mark.parametrize("gpus, gpu_name, want", [
    (False, "NVIDIA A100-SXM4-80GB", "cpu-2core"),      # a CPU job, whatever the host has
    (True, "Tesla V100-SXM2-16GB", "abci"),
    (True, "NVIDIA A100-SXM4-40GB", "dgx-a100"),
    (True, "NVIDIA H100 80GB HBM3", "dgx-h100"),
    (True, "NVIDIA H200", "dgx-h200"),   # issue 48: its own profile (was dgx-h100's)
    (True, "NVIDIA GeForce RTX 4090", "abci"),           # unknown GPU: the paper's, said so
    (True, "", "abci"),                                  # no GPU here (planning from a laptop)
])
def test_the_rule(gpus, gpu_name, want):
    name, why = profile_rule(gpus, gpu_name)
    assert name == want == default_profile(gpus, gpu_name)
    if gpus:   # a GPU job says how to describe the cluster
        assert "--hosts N --gpus-per-host G" in why and "--profile" in why
    if gpus and want == "abci":
        said = ("V100 class" if "V100" in gpu_name else
                "an unknown GPU" if gpu_name else "no GPU seen on this host")
        assert said in why


@pytest.mark.parametrize("model", GPU_PROFILES)
def test_each_gpu_model_picks_its_shipped_profile(model):
    """A GPU_PROFILES entry names a profile file that ships (docs/contributing.md)."""
    assert GPU_PROFILES[model] in list_profiles(), GPU_PROFILES[model]
    assert profile_rule(True, f"NVIDIA {model.upper()}")[0] == GPU_PROFILES[model]


def test_every_tool_prints_the_profile_and_why(monkeypatch, capsys):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    monkeypatch.setattr(machine_profile, "local_gpu_name", lambda: "")
    plan_cli.main(["--model", "resnet50", "--max-gpus", "8"])
    assert "# profile abci (the default for GPU jobs (no GPU seen on this host" in \
        capsys.readouterr().out
    args = elastic.parse_args(["--dry-run", "--schedule", "0:32", "--slots", "2"])
    monkeypatch.setattr(elastic, "local_gpu_name", lambda: "")
    assert elastic.load_launcher_profile(args).name == "cpu-2core"
    assert "profile cpu-2core (the default for CPU jobs)" in capsys.readouterr().out
    assert args.job_env == {PROFILE_ENV: "cpu-2core"}
