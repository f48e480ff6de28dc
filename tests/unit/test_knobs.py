import argparse

import pytest

from nnabla_torus.knobs import add_knob, env_value, parse_bool


def test_precedence_is_cli_then_environment_then_default(monkeypatch):
    parser = argparse.ArgumentParser()
    monkeypatch.setenv("NNABLA_TORUS_TEST_ITERS", "7")
    add_knob(parser, "--iters", "NNABLA_TORUS_TEST_ITERS", 3, "timed calls", type=int)
    assert parser.parse_args([]).iters == 7
    assert parser.parse_args(["--iters", "9"]).iters == 9
    monkeypatch.delenv("NNABLA_TORUS_TEST_ITERS")
    assert env_value("NNABLA_TORUS_TEST_ITERS", 3, int) == 3


def test_help_names_the_environment_twin_and_the_default():
    parser = argparse.ArgumentParser()
    action = add_knob(parser, "--grid", "NNABLA_TORUS_TEST_GRID", None, "process grid XxY")
    assert action.help.endswith("(env: NNABLA_TORUS_TEST_GRID, default: None)")


@pytest.mark.parametrize("text,value", [("1", True), ("On", True), ("no", False), ("FALSE", False)])
def test_booleans(text, value):
    assert parse_bool(text) is value


def test_bad_environment_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("NNABLA_TORUS_TEST_FLAG", "maybe")
    with pytest.raises(ValueError, match="NNABLA_TORUS_TEST_FLAG='maybe'"):
        env_value("NNABLA_TORUS_TEST_FLAG", False, bool)
    monkeypatch.setenv("NNABLA_TORUS_TEST_ROWS", "every")
    with pytest.raises(ValueError, match="NNABLA_TORUS_TEST_ROWS='every' is not one of log, all"):
        add_knob(argparse.ArgumentParser(), "--rows", "NNABLA_TORUS_TEST_ROWS", "log", "rows",
                 choices=["log", "all"])


@pytest.mark.parametrize("below", ["", "sub/run"])
def test_an_output_folder_through_a_dangling_symlink_is_refused_at_parse_time(tmp_path, below):
    """Before: accepted, then FileExistsError from makedirs after the set-up."""
    import os
    from nnabla_torus.knobs import check_output_path
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    path = os.path.join(str(link), below) if below else str(link)
    with pytest.raises(ValueError, match=rf"^--output-dir = '{path}' cannot be created: {link} "
                                         rf"is a symlink to {tmp_path}/gone, which does not "
                                         rf"exist \(create that, or remove the link\); choose a "
                                         rf"writable folder$"):
        check_output_path("--output-dir", path, folder=True)
    (tmp_path / "gone").mkdir()
    assert check_output_path("--output-dir", path, folder=True) == path
