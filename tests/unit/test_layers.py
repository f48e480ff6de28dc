"""The package's imports run one way: knobs <- comm <- planning, testing, overlap <- sim,
launching <- cli, with no cycle. Every import counts, those inside functions too: a lazy
import is still a dependency. The package root (``nnabla_torus/__init__.py``) is the one
place that wires layers together (it registers auto's profile loader and the test double
backend), so it may import any of them; nothing below it imports the root (auto's cache key
gets the package version handed in)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "nnabla_torus")
# The first name under nnabla_torus -> its layer; a module may import its own layer or lower.
LAYERS = {"knobs": 0, "comm": 1, "planning": 2, "testing": 2, "overlap": 2, "loss_scaling": 2,
          "files": 0, "sim": 3, "launching": 3, "training": 3, "cli": 4}


def module_names():
    """{dotted module name: path} of every module of the package."""
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = "nnabla_torus." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imports(module, path, modules):
    """The package modules ``module`` imports (a ``from X import name`` counts as X.name
    when that is a module, else as X), with the names imported from the root."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found |= {(a.name, None) for a in node.names if a.name.startswith("nnabla_torus")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            if base.startswith("nnabla_torus"):
                for a in node.names:
                    full = f"{base}.{a.name}"
                    found.add((full, None) if full in modules else (base, a.name))
    return found


def layer(module):
    return LAYERS[module.split(".")[1]]


def edges():
    modules = module_names()
    return {m: imports(m, p, modules) for m, p in modules.items()}


EDGES = edges()


def test_every_module_has_a_layer():
    assert {m.split(".")[1] for m in module_names() if m != "nnabla_torus"} <= set(LAYERS)


def test_no_import_runs_up_a_layer():
    """A lower layer that needs something from a higher one gets it handed in (an argument, or
    a registration by the package root), or the thing moves down to where both can see it."""
    up = []
    for source, targets in EDGES.items():
        if source == "nnabla_torus":
            continue   # the root wires the layers together
        for target, name in targets:
            if target == "nnabla_torus":
                up.append(f"{source} -> nnabla_torus" + (f".{name}" if name else ""))
            elif layer(target) > layer(source):
                up.append(f"{source} -> {target}")
    assert up == []


def test_there_is_no_import_cycle():
    graph = {m: {t for t, _ in ts if t in EDGES and t != m} for m, ts in EDGES.items()}
    on_path, done, cycles = [], set(), []

    def visit(node):
        on_path.append(node)
        for nxt in sorted(graph[node]):
            if nxt in on_path:
                cycles.append(on_path[on_path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt)
        on_path.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node)
    assert cycles == []
