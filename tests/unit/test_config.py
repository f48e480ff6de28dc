"""Typed config: precedence CLI > recipe > env > default, recipes by value, clear errors."""
import pytest

from examples.imagenet.config import TrainConfig, load_recipe, parse_config


def test_default_is_digits_recipe_and_data_dir_picks_resnet50(monkeypatch):
    monkeypatch.delenv("NNABLA_TORUS_RECIPE", raising=False)
    cfg = parse_config([])
    assert cfg.recipe == "digits-cpu" and cfg.arch == "resnet18" and cfg.data_dir == ""
    cfg = parse_config(["--data-dir", "/data/imagenet"])
    assert cfg.recipe == "resnet50-90ep" and cfg.arch == "resnet50"


def test_precedence_cli_over_recipe_over_env_over_default(monkeypatch):
    monkeypatch.setenv("NNABLA_TORUS_EPOCHS", "7")          # recipe sets epochs: recipe wins
    monkeypatch.setenv("NNABLA_TORUS_BUCKET_MIB", "3.5")    # recipe is silent: env wins
    cfg = parse_config(["-C", "sony-224s", "--optimizer", "momentum"])
    assert (cfg.epochs, cfg.source["epochs"]) == (90.0, "recipe")
    assert (cfg.bucket_mib, cfg.source["bucket_mib"]) == (3.5, "env")
    assert (cfg.optimizer, cfg.source["optimizer"]) == ("momentum", "cli")
    assert (cfg.seed, cfg.source["seed"]) == (TrainConfig().seed, "default")
    cfg = parse_config(["-C", "sony-224s", "--epochs", "2", "--overlap", "0"])
    assert (cfg.epochs, cfg.overlap) == (2.0, False)
    assert "epochs" in cfg.describe() and "(cli)" in cfg.describe()


def test_sony_recipe_published_values():
    recipe = load_recipe("sony-224s")
    assert recipe["batch_schedule"] == "0:34816,5:69632"
    assert recipe["local_batch"] == 32 and recipe["type_config"] == "half"
    assert recipe["warmup_epochs"] == 5 and recipe["label_smoothing"] > 0


def test_unknown_recipe_key_is_named_with_valid_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("epochs: 3\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['learning_rate'\].*base_lr"):
        parse_config(["-C", str(path)])


def test_bad_values_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="recipe 'nope' not found.*sony-224s"):
        parse_config(["-C", "nope"])
    path = tmp_path / "typed.yaml"
    path.write_text("epochs: ten\n")
    with pytest.raises(ValueError, match="epochs = 'ten' must be a float"):
        parse_config(["-C", str(path)])
    with pytest.raises(ValueError, match="local_batch = 0 must be > 0"):
        parse_config(["--local-batch", "0"])
    with pytest.raises(ValueError, match="label_smoothing"):
        parse_config(["--label-smoothing", "1.5"])
