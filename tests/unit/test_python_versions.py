"""Every .py of the project parses and imports on Python 3.8, the oldest setup.cfg promises,
and the unit suite passes on 3.8 and 3.9 (CI's own venv is 3.10).

``ast.parse(feature_version=(3, 8))`` refuses 3.9+ syntax (``match``, ``except*``); the walk
below refuses what parses on 3.8 but fails when it runs there: ``dataclass(slots=...)`` and
its other 3.10 arguments, ``X | Y`` and ``list[int]`` evaluated at run time (an annotation
without ``from __future__ import annotations``, isinstance's types), str.removeprefix,
zip(strict=...), functools.cache and the like.
"""
import ast
import configparser
import glob
import os
import pathlib
import shutil
import subprocess

import pytest

from tests.slowdown import scaled

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("nnabla_torus", "examples", "tools", "tests")
OLDEST = (3, 8)
DATACLASS_310 = {"slots", "kw_only", "match_args"}
NEW_METHODS = {"removeprefix": "3.9", "removesuffix": "3.9", "bit_count": "3.10"}
NEW_FUNCTIONS = {("functools", "cache"): "3.9", ("math", "lcm"): "3.9",
                 ("itertools", "pairwise"): "3.10", ("random", "randbytes"): "3.9"}
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}


def sources():
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")
                  if ".venv" not in p.parts)


def newer_than_oldest(tree):
    """[(line, what)] of the constructs in ``tree`` that Python 3.8 cannot run."""
    lazy = any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(a.name == "annotations" for a in node.names) for node in tree.body)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            words = {k.arg for k in node.keywords}
            if name == "dataclass" and words & DATACLASS_310:
                found.append((node.lineno, f"dataclass({', '.join(words & DATACLASS_310)}=): "
                                           f"3.10"))
            if name == "zip" and "strict" in words:
                found.append((node.lineno, "zip(strict=): 3.10"))
            if name in ("isinstance", "issubclass") and len(node.args) == 2 and \
                    isinstance(node.args[1], ast.BinOp) and isinstance(node.args[1].op, ast.BitOr):
                found.append((node.lineno, f"{name}(x, A | B): 3.10"))
        if isinstance(node, ast.Attribute) and node.attr in NEW_METHODS:
            found.append((node.lineno, f".{node.attr}: {NEW_METHODS[node.attr]}"))
        used = [(getattr(node.value, "id", ""), node.attr)] if isinstance(node, ast.Attribute) \
            else [(node.module, a.name) for a in node.names] \
            if isinstance(node, ast.ImportFrom) else []
        found += [(node.lineno, f"{'.'.join(name)}: {NEW_FUNCTIONS[name]}")
                  for name in used if name in NEW_FUNCTIONS]
        if not lazy:
            for annotation in annotations(node):
                for part in ast.walk(annotation):
                    if isinstance(part, ast.BinOp) and isinstance(part.op, ast.BitOr):
                        found.append((part.lineno, "X | Y in an annotation: 3.10"))
                    if isinstance(part, ast.Subscript) and \
                            getattr(part.value, "id", "") in BUILTIN_GENERICS:
                        found.append((part.lineno, f"{part.value.id}[...] in an annotation: 3.9"))
    return found


def annotations(node):
    """The annotations of ``node`` that Python evaluates when the definition runs."""
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]
        return [a.annotation for a in every if a is not None and a.annotation is not None] + \
            ([node.returns] if node.returns is not None else [])
    return []


def test_every_source_runs_on_the_oldest_python():
    problems = []
    for path in sources():
        text = path.read_text()
        try:
            tree = ast.parse(text, str(path), feature_version=OLDEST)
        except SyntaxError as e:
            problems.append(f"{path.relative_to(ROOT)}:{e.lineno}: not Python 3.8 syntax: {e.msg}")
            continue
        problems += [f"{path.relative_to(ROOT)}:{line}: {what}"
                     for line, what in newer_than_oldest(tree)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("code, what", [
    ("import dataclasses\n@dataclasses.dataclass(slots=True)\nclass A:\n    x: int\n",
     "dataclass(slots=): 3.10"),
    ("match x:\n    case 1:\n        pass\n", "syntax"),
    ("def f(x: int | None): pass\n", "X | Y in an annotation: 3.10"),
    ("def f() -> list[int]: pass\n", "list[...] in an annotation: 3.9"),
    ("isinstance(1, int | float)\n", "isinstance(x, A | B): 3.10"),
    ("'ab'.removeprefix('a')\n", ".removeprefix: 3.9"),
    ("list(zip([1], [2], strict=True))\n", "zip(strict=): 3.10"),
    ("from functools import cache\n", "functools.cache: 3.9"),
    ("import math\nmath.lcm(2, 3)\n", "math.lcm: 3.9"),
])
def test_each_newer_construct_is_named(code, what):
    try:
        found = [w for _, w in newer_than_oldest(ast.parse(code, feature_version=OLDEST))]
    except SyntaxError:
        found = ["syntax"]
    assert found == [what]


def test_lazy_annotations_may_use_newer_forms():
    code = "from __future__ import annotations\ndef f(x: int | None) -> list[int]: pass\n"
    assert newer_than_oldest(ast.parse(code, feature_version=OLDEST)) == []


def older_python(version):
    """An interpreter of ``version`` ("3.8"): pythonX.Y on PATH, else pyenv's; None."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("pyenv") else ""
    found = [shutil.which(f"python{version}")] + sorted(
        glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}"))
        if root else [])
    return next((p for p in found if p), None)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["3.8", "3.9"])
def test_the_unit_suite_passes_on_an_older_python(version):
    """A venv of that Python (tools/setup_venv.sh, in .venv-py3.8) with the examples' packages
    but DALI, whose 3.8/3.9 wheels come from NVIDIA's index, not the registry CI reaches; then
    ``pytest tests/unit -m "not slow"`` there. Skipped, saying so, without that Python."""
    python = older_python(version)
    if python is None:
        pytest.skip(f"no Python {version} (python{version} on PATH or pyenv's)")
    venv = ROOT / f".venv-py{version}"
    setup = subprocess.run(["bash", "tools/setup_venv.sh", str(venv)], cwd=ROOT,
                           env={**os.environ, "PYTHON": python, "EXTRAS": "plot,test,simulate"},
                           capture_output=True, text=True, timeout=scaled(900))
    assert setup.returncode == 0, setup.stdout + setup.stderr
    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    wanted = [r for r in extras["options.extras_require"]["examples"].split()
              if not r.startswith("nvidia-dali")]
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *wanted],
                         capture_output=True, text=True, timeout=scaled(900))
    assert pip.returncode == 0, pip.stdout + pip.stderr
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "tests/unit", "-q",
                           "-m", "not slow", "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(900))
    tail = "\n".join(done.stdout.strip().splitlines()[-30:])
    assert done.returncode == 0, f"Python {version} ({python}):\n{tail}"
    print(f"Python {version}: {tail.splitlines()[-1]}")
