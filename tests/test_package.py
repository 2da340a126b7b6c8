"""The package as a user gets it: one version everywhere, ``import apd`` that loads none of the pipeline, and
(slow) an installed copy that runs from any directory with its shipped pipelines."""

from __future__ import annotations

import importlib
import os
import shutil
import site
import subprocess
import sys
import sysconfig
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


@pytest.mark.slow
def test_an_installed_copy_runs_outside_the_checkout(tmp_path):
    """``pip install`` (no dependencies, no build isolation, no index) into a fresh venv that sees this
    interpreter's packages, then ``apd info --config digits`` and the Python API from another directory."""
    source = tmp_path / "source"  # a copy, so that the build's files land outside the checkout
    shutil.copytree(ROOT / "apd", source / "apd", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # this interpreter's site-packages (torch, pip, setuptools, …) on the venv's path, their .pth files unread
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (purelib / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    python, elsewhere = venv / "bin" / "python", tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(*args: str | Path) -> str:
        return subprocess.run([str(a) for a in args], cwd=elsewhere, env=env, capture_output=True, text=True,
                              check=True).stdout

    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", source)
    assert "pipeline   digits  (digits, config hash" in run(venv / "bin" / "apd", "info", "--config", "digits")
    out = run(python, "-c", "import importlib.metadata as m, apd; data = apd.load_data('digits'); "
                            "print(apd.__version__, m.version('apd'), apd.__file__, *data.ood)")
    version, installed, where, *ood = out.split()
    import apd

    assert version == installed == apd.__version__
    assert Path(where).is_relative_to(venv)
    assert {"gaussian", "uniform", "photos"} <= set(ood), ood  # and fashion, where its Debian package is
