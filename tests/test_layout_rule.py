"""The package's one rule, checked on the code's own imports: library below, pipeline above, nothing climbs
back up, and nothing goes round in a circle. Below ``apd/pipeline/`` no module imports the pipeline, the
experiments or the command line (so none knows ``RunContext`` or an artifact path); the pipeline imports no
experiment and not the command line. The package root ``apd`` is on the ground: it imports only
``apd._version``, and re-exports the public names lazily (by name, which no import statement shows), so no
module of the package imports from it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "apd"
# Layers from the bottom; a module may import from its own layer and those below it.
LAYERS = [
    {"apd", "apd._version", "apd.errors", "apd.methods", "apd.interrupts", "apd.config", "apd.config_load", "apd.io",
     "apd.nets", "apd.toy2d", "apd.data", "apd.metrics", "apd.uncertainty", "apd.acquisition", "apd.schedules",
     "apd.cuda_graphs"},
    {"apd.samplers"},
    {"apd.distillation"},
    {"apd.posteriors"},
    {"apd.evaluation"},
    {"apd.pipeline"},
    {"apd.experiments"},
    {"apd.cli", "apd.__main__", "apd.api", "apd.docs", "apd.reproduce"},
]


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the name in :data:`LAYERS` it is, or of the package it is in (the
    root ``apd`` names itself only: every module is in it)."""
    for index, names in enumerate(LAYERS):
        if any(module == name or (name != "apd" and module.startswith(name + ".")) for name in names):
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS")


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names if alias.name.startswith("apd")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("apd") and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name == "apd" or _is_module(name)}


def _is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (PACKAGE.parent / relative).with_suffix(".py").is_file() or (PACKAGE.parent / relative).is_dir()


@pytest.mark.parametrize(("name", "path"), modules(), ids=[name for name, _ in modules()])
def test_no_import_climbs_up(name, path):
    own = layer_of(name)
    above = sorted(m for m in imported(path) if layer_of(m) > own)
    assert not above, f"{name} (layer {own}) imports {above} from a layer above it"


def test_the_rule_sees_a_climbing_import(tmp_path):
    """The walker is not blind: a ground module importing the pipeline is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from apd.pipeline.runtime import RunContext\n")
    assert layer_of("apd.nets") < max(layer_of(m) for m in imported(bad))


def test_no_module_below_the_pipeline_names_run_context_or_artifact_files():
    for name, path in modules():
        if layer_of(name) < layer_of("apd.pipeline"):
            text = path.read_text()
            assert "RunContext" not in text, name
            for artifact in ("samples.h5", "generator.pt", "results.json"):
                assert artifact not in text, f"{name} names {artifact}"


def test_no_module_imports_a_name_from_the_package_root():
    """``from apd import load`` would reach the top layer through the root's lazy names, unseen by the rule;
    ``from apd import errors`` (a module) is an import of that module."""
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "apd" and not node.level:
                names = [alias.name for alias in node.names if not _is_module(f"apd.{alias.name}")]
                assert not names, f"{name} imports {names} from the package root; import from the defining module"


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports, at the top or inside a function, with the packages above
    each (importing ``apd.a.b`` runs ``apd/a/__init__.py``) bar its own."""
    names = {name for name, _ in modules()}

    def packages(module: str) -> set[str]:
        parts = module.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    graph = {}
    for name, path in modules():
        targets = imported(path)
        targets |= set().union(*(packages(m) for m in targets)) - packages(name)
        graph[name] = {m for m in targets if m in names and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (first repeated last), or None: a depth-first walk."""
    state: dict[str, str] = {}  # "open" while on the walk's path, "done" once every path below is walked
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := walk(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_the_imports_have_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_the_cycle_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
