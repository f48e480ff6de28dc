"""YAML of user files (recipes, profiles) is read by one loader that refuses aliases
(nnabla_torus/planning/safe_yaml.py): a 235-byte recipe of nested aliases took 510 MB and
printed a 28 MB error line; now one line at the alias."""
import ast
import pathlib

import pytest
import yaml

from nnabla_torus.planning import safe_yaml
from nnabla_torus.planning.machine_profile import load_profile
from nnabla_torus.planning.recipe_files import read_recipe
from nnabla_torus.planning.run_forecast import load_recipe

ROOT = pathlib.Path(__file__).resolve().parents[2]


def nested_aliases(levels, key="milestones"):
    """A recipe line whose value is 9 ** levels items by aliases, in ~30 bytes a level."""
    parts, previous = ["&a0 [x,x,x,x,x,x,x,x,x]"], "a0"
    for level in range(1, levels):
        parts.append(f"&a{level} [" + ",".join([f"*{previous}"] * 9) + "]")
        previous = f"a{level}"
    return f"{key}: [" + ", ".join(parts) + "]\n"


def test_an_alias_is_refused_at_its_line():
    assert safe_yaml.load("epochs: 12\nmilestones: [30, 60]\n") == {"epochs": 12,
                                                                      "milestones": [30, 60]}
    with pytest.raises(yaml.YAMLError) as caught:
        safe_yaml.load("epochs: &e 12\nwarmup_epochs: *e\n")
    assert caught.value.problem == "alias *e: aliases are not accepted, write each value out"
    assert caught.value.problem_mark.line == 1


@pytest.mark.parametrize("read", [lambda p: read_recipe(p), lambda p: load_recipe(p),
                                  lambda p: load_profile(p)], ids=["recipe", "plan", "profile"])
def test_nested_aliases_are_one_short_line(tmp_path, read):
    path = tmp_path / "bomb.yaml"
    path.write_text("epochs: 2\n" + nested_aliases(6))
    with pytest.raises(ValueError) as caught:
        read(str(path))
    line = str(caught.value)
    assert "alias *a0: aliases are not accepted, write each value out" in line, line
    assert "\n" not in line and len(line) < 300 + 3 * len(str(path)), line


def test_every_yaml_load_goes_through_the_safe_loader():
    """No module but safe_yaml calls yaml.safe_load, yaml.load or yaml.full_load."""
    loads = ("load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all")
    found = []
    for path in sorted(p for folder in ("nnabla_torus", "examples", "tools")
                       for p in (ROOT / folder).rglob("*.py")):
        if path.name == "safe_yaml.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in loads and \
                    getattr(node.value, "id", "") == "yaml":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: yaml.{node.attr}")
    assert not found, found
