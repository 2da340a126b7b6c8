"""``apd experiment gan-variants`` on the tiny pipeline: outputs, one row per formulation, the collapse rule."""

from __future__ import annotations

import json

import torch

from apd.experiments.gan_variants import LOSSES, spread_ratio
from tests.tiny_pipeline import run_experiment_on_copy


def test_three_formulations_judged_on_the_same_footing(tiny_pipeline, tmp_path):
    out = run_experiment_on_copy(tiny_pipeline, tmp_path, "gan-variants", "steps=40", "every=20", "networks=10")
    results = json.loads((out / "gan_variants.json").read_text())
    assert [run["loss"] for run in results["runs"]] == list(LOSSES)
    for run in results["runs"]:
        assert [h["step"] for h in run["history"]] == [20, 40] or run["diverged"]
        for h in run["history"]:
            assert 0 <= h["val_accuracy"] <= 1 and h["criterion"] >= 0 and 0 <= h["tuning_bald_auroc"] <= 100
            assert h["spread_ratio"] >= 0
    markdown = (out / "gan_variants.md").read_text()
    assert markdown.count("\n| ") == 1 + 4 and "| SGLD (reference) |" in markdown
    assert (out / "gan_variants.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spread_ratio_is_the_median_ratio_of_standard_deviations():
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(4000, 3, generator=generator) * torch.tensor([1.0, 2.0, 4.0])
    generated = torch.randn(4000, 3, generator=generator) * torch.tensor([0.5, 1.0, 1.0])
    assert abs(spread_ratio(generated, reference) - 0.5) < 0.03  # ratios 0.5, 0.5, 0.25: the median is 0.5
