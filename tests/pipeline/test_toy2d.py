"""The toy 2-D pipeline: its dataset, and a tiny run of every stage through to the figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from apd.cli import main
from apd.config import DataConfig
from apd.config_load import from_dict
from apd.data import available_ood, load_dataset, ood_set
from apd.errors import ConfigError
from apd.toy2d import MEANS, far_mask

PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "toy2d.toml"
TINY = [  # every stage in a few seconds: 2 chains × 1,000 SGLD iterations, 100 generator steps
    "sgld.iterations=1000", "sgld.chains=2", "sgld.burn_in=300", "sgld.checkpoint_every=500",
    "baselines.epochs=10", "distill.steps=100", "distill.eval_every=50", "distill.eval_networks=50",
    "evaluate.runs=1", "evaluate.networks=50", "evaluate.sgld_samples=50", "evaluate.mc_passes=50",
    "evaluate.ood_size=300", "evaluate.mog_components=[1, 2]", "evaluate.mog_fit_samples=100",
    "evaluate.yardstick_sizes=[2]",
]


def toy(seed: int = 0, **sizes: int):
    return load_dataset(DataConfig(dataset="toy2d", **{"val_size": 300, **sizes}), seed)


def test_toy2d_is_seeded_and_shaped():
    data = toy(train_size=200, test_size=1000)
    assert data.sizes() == {"train": 200, "val": 300, "test": 1000}
    assert data.x_train.shape == (200, 2) and data.x_train.dtype == torch.float32
    assert data.num_features == 2 and data.num_classes == 2 and data.image_shape is None
    for y in (data.y_train, data.y_val, data.y_test):
        assert y.dtype == torch.int64 and y.sum().item() == len(y) // 2  # balanced classes
    again = toy(train_size=200, test_size=1000)
    assert data.fingerprint() == again.fingerprint()
    assert toy(seed=1, train_size=200, test_size=1000).fingerprint() != data.fingerprint()
    # each split has its own stream: another validation size leaves the training points as they were
    assert torch.equal(toy(train_size=200, val_size=50, test_size=1000).x_train, data.x_train)
    assert toy(train_size=0, test_size=0).sizes() == {"train": 200, "val": 300, "test": 1000}


def test_toy2d_blobs_have_their_means_and_spread():
    data = toy(train_size=4000, test_size=10)
    for label, mean in enumerate(MEANS):
        points = data.x_train[data.y_train == label].double()
        assert torch.allclose(points.mean(0), torch.tensor(mean, dtype=torch.float64), atol=0.08)
        assert torch.allclose(points.std(0), torch.ones(2, dtype=torch.float64), atol=0.06)


def test_toy2d_ood_sets_are_far_and_seeded():
    data = toy(train_size=200, test_size=1000)
    assert available_ood(DataConfig(dataset="toy2d"), data) == ["ring", "box"]
    for name in ("ring", "box"):
        points = ood_set(name, data, 500, seed=0)
        assert points.shape == (500, 2) and bool(far_mask(points).all())
        assert torch.equal(points, ood_set(name, data, 500, seed=0))
        assert not torch.equal(points, ood_set(name, data, 500, seed=1))
    assert not far_mask(data.x_train).any()  # no training point is 4 sd from both means (here)


def test_toy2d_refuses_adversarial_attacks():
    with pytest.raises(ConfigError, match="adversarial"):
        from_dict({"data": {"dataset": "toy2d", "ood": ["ring"]}, "evaluate": {"adversarial": {"enabled": True}}})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    overrides = [arg for setting in TINY for arg in ("--set", setting)]
    for stage in ("sample", "distill", "evaluate", "toy2d-figure"):
        assert main([stage, "--config", str(PIPELINE), "--artifacts", str(root), "--quiet", *overrides]) == 0
    return root / "toy2d"


def test_tiny_toy2d_run_writes_the_figure_and_tables(tiny_run):
    figure = tiny_run / "eval" / "figures" / "toy2d.png"
    assert figure.is_file() and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((tiny_run / "eval" / "results.json").read_text())
    assert set(results["ood"]) == {"ring", "box"}
    assert results["accuracy"]["sgld"]["acc"]["mean"] > 0.85  # the Bayes classifier's is 0.933
    assert not (tiny_run / "eval" / "figures" / "sgld_first_layer.png").exists()  # no image to draw
    summary = json.loads((tiny_run / "eval" / "toy2d.json").read_text())
    assert summary["methods"]["sgd"]["bald_train"] is None  # one network: n/a, not 0
    assert summary["far_points"] > 0.3 * summary["grid"] ** 2


def test_sgld_is_more_uncertain_far_from_the_data(tiny_run):
    """SGLD's networks agree on the training points and disagree far from both blobs: the mean BALD more
    than 4 sd from both means is well above the mean at the training points."""
    sgld = json.loads((tiny_run / "eval" / "toy2d.json").read_text())["methods"]["sgld"]
    assert sgld["bald_far"] > 2.0 * sgld["bald_train"]
    assert sgld["bald_far"] > 0.02


def test_toy2d_figure_needs_a_two_feature_dataset(tmp_path, capsys):
    config = tmp_path / "digits.toml"
    config.write_text('name = "d"\n[data]\ndataset = "digits"\ntrain_size = 1000\nval_size = 300\n')
    assert main(["toy2d-figure", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 2
    assert "2-feature" in capsys.readouterr().err


def test_far_mask_matches_distances():
    points = np.array([[0.0, 0.0], [5.6, 0.0], [0.0, 4.5], [0.0, 3.5], [-5.4, 0.0]], dtype=np.float32)
    assert far_mask(points).tolist() == [False, True, True, False, False]
