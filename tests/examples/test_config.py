"""Typed config: precedence flag > env > recipe > default recipe > built-in default, recipes
by value, clear errors."""
import types

import pytest

from examples.imagenet.config import TrainConfig, build_schedules, load_recipe, parse_config


def test_default_is_digits_recipe_and_data_dir_picks_resnet50(monkeypatch, tmp_path):
    monkeypatch.delenv("NNABLA_TORUS_RECIPE", raising=False)
    cfg = parse_config([])
    assert cfg.recipe == "digits-cpu" and cfg.arch == "resnet18" and cfg.data_dir == ""
    for split in ("train", "val"):                     # class folders: a valid layout
        (tmp_path / split / "n01").mkdir(parents=True)
    cfg = parse_config(["--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "run")])
    assert cfg.recipe == "resnet50-90ep" and cfg.arch == "resnet50"


def test_precedence_flag_env_recipe_default_recipe_builtin(monkeypatch):
    """flag > environment > the recipe given with -C > the default recipe > built-in default,
    each level beating the next on one knob (docs/imagenet.md#where-each-setting-comes-from)."""
    monkeypatch.delenv("NNABLA_TORUS_RECIPE", raising=False)
    monkeypatch.delenv("NNABLA_TORUS_EPOCHS", raising=False)
    cfg = parse_config([])                                   # default recipe > built-in
    assert (cfg.epochs, cfg.source["epochs"]) == (12.0, "default recipe")      # digits-cpu's
    assert (cfg.seed, cfg.source["seed"]) == (TrainConfig().seed, "default")   # in no recipe
    cfg = parse_config(["-C", "clusters-mlp"])               # -C's recipe > the default recipe
    assert (cfg.epochs, cfg.source["epochs"]) == (4.0, "recipe")
    monkeypatch.setenv("NNABLA_TORUS_EPOCHS", "7")           # environment > any recipe
    monkeypatch.setenv("NNABLA_TORUS_BUCKET_MIB", "3.5")
    for argv in ([], ["-C", "sony-224s"]):
        cfg = parse_config(argv)
        assert (cfg.epochs, cfg.source["epochs"]) == (7.0, "env"), argv
        assert (cfg.bucket_mib, cfg.source["bucket_mib"]) == (3.5, "env")
    cfg = parse_config(["-C", "sony-224s", "--epochs", "9", "--optimizer", "momentum"])
    assert (cfg.epochs, cfg.source["epochs"]) == (9.0, "cli")            # flag > environment
    assert (cfg.optimizer, cfg.source["optimizer"]) == ("momentum", "cli")
    # the logged table says where each value came from
    table = cfg.describe()
    assert table.startswith("config (recipe sony-224s; flag > environment > recipe > default "
                            "recipe > built-in default):\n")
    assert "  epochs            = 9.0                      (flag --epochs)\n" in table
    assert "  bucket_mib        = 3.5                      (env NNABLA_TORUS_BUCKET_MIB)\n" in table
    assert "  batch_schedule    = '0:34816,5:69632'        (recipe sony-224s)\n" in table
    assert "  seed              = 313                      (built-in default)\n" in table
    monkeypatch.delenv("NNABLA_TORUS_EPOCHS")
    assert "  epochs            = 12.0                     (default recipe digits-cpu)\n" in \
        parse_config([]).describe()
    cfg = parse_config(["-C", "sony-224s", "--epochs", "2", "--warmup-epochs", "1",
                        "--overlap", "0"])
    assert (cfg.epochs, cfg.overlap) == (2.0, False)


def test_a_recipe_says_checkpoint_every_auto(tmp_path, monkeypatch):
    """The flag and the variable took ``auto``; the recipe key, typed int, refused it."""
    monkeypatch.delenv("NNABLA_TORUS_CHECKPOINT_EVERY", raising=False)
    path = tmp_path / "auto.yaml"
    for text in ("auto", "Auto", "'auto'"):
        path.write_text(f"checkpoint_every: {text}\n")
        cfg = parse_config(["-C", str(path)])
        assert (cfg.checkpoint_every, cfg.source["checkpoint_every"]) == ("auto", "recipe")
    path.write_text("checkpoint_every: 40\n")
    assert parse_config(["-C", str(path)]).checkpoint_every == 40
    path.write_text("checkpoint_every: often\n")
    with pytest.raises(ValueError, match="checkpoint_every = 'often' must be an int or auto$"):
        parse_config(["-C", str(path)])
    path.write_text("checkpoint_every: -3\n")
    with pytest.raises(ValueError, match="checkpoint_every must be an integer >= 0 .or auto."):
        parse_config(["-C", str(path)])


def test_sony_recipe_published_values():
    recipe = load_recipe("sony-224s")
    assert recipe["batch_schedule"] == "0:34816,5:69632"
    assert recipe["local_batch"] == 32 and recipe["type_config"] == "half"
    assert recipe["warmup_epochs"] == 5 and recipe["label_smoothing"] == 0   # v1: none
    assert load_recipe("sony-122s")["label_smoothing"] > 0                     # v2 adds it


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
    path.write_text("local_batch: 0\n")               # a recipe value skips argparse's check
    with pytest.raises(ValueError,
                       match=r"local_batch must be an integer >= 1, got 0 \(set --local"):
        parse_config(["-C", str(path)])
    with pytest.raises(ValueError, match="warmup_epochs = 1.0 must be below epochs = 1.0"):
        parse_config(["--epochs", "1"])
    with pytest.raises(SystemExit):                   # argparse: "argument --label-smoothing"
        parse_config(["--label-smoothing", "1.5"])


def batch_and_lr(cfg, world_size, epoch):
    controller, lr_schedule = build_schedules(cfg, types.SimpleNamespace(size=world_size))
    plan = controller.plan(epoch)
    return (plan.global_batch, plan.local_batch, plan.accum_steps,
            lr_schedule.lr(epoch) * plan.lr_factor)


def test_sony_recipe_batch_and_lr_per_epoch():
    cfg = parse_config(["-C", "sony-224s"])
    # 1,088 GPUs x 32 during the 5 warm-up epochs, then 2,176 x 32 (the paper doubles GPUs).
    assert batch_and_lr(cfg, 1088, 0.0)[:3] == (34816, 32, 1)
    assert batch_and_lr(cfg, 2176, 5.0)[:3] == (69632, 32, 1)
    # On the warm-up's 1,088 GPUs the doubled batch is two accumulated micro-batches.
    assert batch_and_lr(cfg, 1088, 5.0)[:3] == (69632, 32, 2)
    # lr = 0.1 per 256 images, linear scaling, linear warm-up over 5 epochs, then poly(2);
    # batch_change_lr keep: the rate stays 0.1 x 136 when the batch doubles at epoch 5.
    expected = {0.0: 0.0, 2.5: 0.05 * 136, 4.99: 0.1 * 4.99 / 5 * 136, 5.0: 0.1 * 136,
                47.5: 0.1 * 0.25 * 136, 90.0: 0.0}
    for epoch, lr in expected.items():
        assert batch_and_lr(cfg, 2176, epoch)[3] == pytest.approx(lr, rel=1e-9, abs=1e-12), epoch


def test_resnet50_90ep_recipe_batch_and_lr_per_epoch():
    cfg = parse_config(["-C", "resnet50-90ep"])
    assert batch_and_lr(cfg, 8, 0.0)[:3] == (256, 32, 1)
    assert batch_and_lr(cfg, 2, 10.0)[:3] == (256, 32, 4)       # 2 ranks accumulate 4 x 32
    for epoch, lr in {0.0: 0.1, 29.9: 0.1, 30.0: 0.01, 60.0: 0.001, 85.0: 0.0001}.items():
        assert batch_and_lr(cfg, 8, epoch)[3] == pytest.approx(lr), epoch


def test_digits_recipe_batch_and_lr_per_epoch():
    cfg = parse_config([])
    first, later = batch_and_lr(cfg, 4, 0.5), batch_and_lr(cfg, 4, 1.0)
    assert first[:3] == (64, 16, 1) and later[:3] == (128, 32, 1)
    assert first[3] == pytest.approx(cfg.base_lr * 0.5)                   # half-way through warm-up
    assert later[3] == pytest.approx(2 * cfg.base_lr)                      # x2 for batch 128


def test_the_profile_knob_shares_the_tools_environment_variable():
    from examples.imagenet.config import env_of
    from nnabla_torus.planning.machine_profile import PROFILE_ENV
    assert env_of("profile") == PROFILE_ENV


def test_tf32_is_a_recipe_key_set_before_the_cuda_extension_loads(monkeypatch):
    """nnabla sets NVIDIA_TF32_OVERRIDE=0 at the extension's import unless
    NNABLA_CUDA_ALLOW_TF32 says otherwise (ext src/nbla/cuda/init.cpp.tmpl ~76-83): the key
    must be in the environment before get_extension_context imports the extension."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "imagenet"))
    import run_context
    import train
    cfg = parse_config(["-C", "resnet50-90ep"])
    assert cfg.allow_tf32 is True and parse_config([]).allow_tf32 is False
    assert parse_config(["-C", "resnet50-90ep", "--allow-tf32", "0"]).allow_tf32 is False
    seen = {}

    def context(*args, **kwargs):
        seen["tf32"] = os.environ.get("NNABLA_CUDA_ALLOW_TF32")
        raise RuntimeError("stop here")
    monkeypatch.setattr(run_context, "get_extension_context", context)
    monkeypatch.delenv("NNABLA_CUDA_ALLOW_TF32", raising=False)
    with pytest.raises(RuntimeError, match="stop here"):
        train.make_context_and_comm(cfg, print)
    assert seen["tf32"] == "1"


def test_help_is_plain_text_without_argparse_artefacts():
    """Before: "25 % label noise" in --dataset's help was read as a format: argparse printed
    its own dict ({'option_strings': ['--dataset'], ...}) in the middle of the text."""
    from examples.imagenet.config import build_parser
    text = build_parser().format_help()
    assert "{'" not in text and "%(" not in text and "%%" not in text
    assert "25 % label noise" in " ".join(text.split())


@pytest.mark.parametrize("val_crop, side", [(1e-9, "16,000,000,000"), (0.001, "16,000")])
def test_a_val_crop_that_asks_dali_for_huge_images_is_refused_at_parse_time(val_crop, side):
    """Before: accepted; 1e-9 crashed DALI at the first validation (restarted under the
    launcher), 0.001 asked it for 16,000-pixel images."""
    with pytest.raises(ValueError, match=rf"^val_crop = {val_crop:g} would resize validation "
                                         rf"images to a {side}-pixel shorter side .* must be in "
                                         rf"\[0.003906, 1\] .* e\.g\. 0\.875 \(--val-crop\)$"):
        parse_config(["--val-crop", str(val_crop), "--image-size", "16"])
    assert parse_config(["--val-crop", "0.004", "--image-size", "16"]).val_crop == 0.004
