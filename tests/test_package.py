"""The package as a user gets it: one version everywhere, ``import apd`` that loads none of the pipeline."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_python(*args: str, cwd: Path = ROOT) -> str:
    """stdout of this interpreter run with ``args``, importing this checkout's ``apd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout


def test_pyproject_and_apd_version_agree():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"] and "version" not in pyproject["project"]
    module, name = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"].rsplit(".", 1)
    version = getattr(importlib.import_module(module), name)
    assert run_python("-m", "apd", "--version").strip() == f"apd {version}"
    import apd

    assert apd.__version__ == version


def test_importing_apd_or_a_ground_module_loads_none_of_the_pipeline():
    loaded = run_python("-c", "import sys, apd, apd.metrics, apd.uncertainty; print(apd.__version__); "
                              "print(*sorted(m for m in sys.modules if m.startswith('apd')))").split()
    assert not [m for m in loaded if m.startswith(("apd.pipeline", "apd.api", "apd.posteriors"))], loaded


def test_the_public_names_resolve_lazily_and_unknown_ones_fail():
    import apd

    assert set(apd.__all__) <= set(dir(apd))
    for name in apd.EXPORTS:
        assert getattr(apd, name) is getattr(importlib.import_module(apd.EXPORTS[name]), name)
    with pytest.raises(AttributeError, match="^module 'apd' has no attribute 'bogus'$"):
        apd.bogus  # noqa: B018
