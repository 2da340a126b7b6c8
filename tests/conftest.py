"""Shared fixtures: the small digits dataset and a skip for CUDA-only tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import threadpoolctl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `from tests.helpers import …`

from apd.config import DataConfig  # noqa: E402
from apd.data import load_dataset  # noqa: E402

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

# Tests use small tensors, which gain nothing from a second thread and lose much when cores are shared: `make
# test` runs one test process per core, and two threads each (torch's, and the OpenMP and OpenBLAS pools of
# numpy, scipy and scikit-learn, whose idle threads spin) took the suite 1.4 times as long (2 cores). One thread for
# every pool here, and through the environment for the processes the tests start.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")
threadpoolctl.threadpool_limits(1)
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def digits():
    """The default pipeline's digits split (1000 / 300 / 497)."""
    return load_dataset(DataConfig(dataset="digits", train_size=1000, val_size=300), seed=0)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """The tiny pipeline (tests/tiny_pipeline.py) run through sample, distill and evaluate once per session:
    (artifacts root, config path)."""
    from apd.cli import main
    from tests.tiny_pipeline import TINY, toml

    root = tmp_path_factory.mktemp("artifacts")
    config = root / "tiny.toml"
    config.write_text(toml(TINY))
    for stage in ("sample", "distill", "evaluate"):
        assert main([stage, "--config", str(config), "--artifacts", str(root), "--quiet"]) == 0
    return root, config
