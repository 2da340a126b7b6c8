"""The package's one rule, checked on the code's own imports: library below, pipeline above, nothing climbs
back up. Below ``apd/pipeline/`` no module imports the pipeline, the experiments or the command line (so
none knows ``RunContext`` or an artifact path); the pipeline imports no experiment and not the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "apd"
# Layers from the bottom; a module may import from its own layer and those below it.
LAYERS = [
    {"apd.errors", "apd.interrupts", "apd.config", "apd.config_load", "apd.io", "apd.nets", "apd.toy2d",
     "apd.data", "apd.metrics", "apd.uncertainty", "apd.acquisition", "apd.schedules"},
    {"apd.samplers"},
    {"apd.distillation"},
    {"apd.posteriors"},
    {"apd.evaluation"},
    {"apd.pipeline"},
    {"apd.experiments"},
    {"apd.cli", "apd.__main__", "apd.api", "apd.docs", "apd.reproduce", "apd"},
]


def layer_of(module: str) -> int:
    for index, names in reversed(list(enumerate(LAYERS))):
        if any(module == name or module.startswith(name + ".") for name in names if name != "apd"):
            return index
    assert module == "apd", module
    return len(LAYERS) - 1


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
    above = sorted(m for m in imported(path) if m != "apd" and layer_of(m) > own)
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
