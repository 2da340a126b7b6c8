"""``apd experiment storage`` on the tiny pipeline: outputs, storage by hand, shares, break-even, and that it
judges only on validation images and the OOD tuning pool."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import apd.evaluation.protocol as protocol
import apd.evaluation.yardstick as yardstick
import apd.experiments.storage as storage
from apd.cli import main
from apd.docs import render_table
from apd.errors import ConfigError
from apd.experiments.options import plan_from_options
from apd.experiments.storage import METRICS, StoragePlan, break_even
from apd.pipeline.recipes import evaluation_inputs
from tests.tiny_pipeline import tiny_context

D = 64 * 32 + 32 + 32 * 10 + 10  # weights of the tiny 64-32-10 network: 2,410
RANK = 3
OPTIONS = ["mog_components=[1,2]", f"ranks=[{RANK}]", "widths=[[8],[16]]", "steps=20",
           "peers=['sgd','ensemble','laplace-kfac']", "kept_sizes=[1,2,5,1000]"]
NAMES = ["SGLD", "MoG k=1", "MoG k=2", f"APD r={RANK} width 8", f"APD r={RANK} width 16", "SGD", "deep ensemble",
         "Laplace KFAC"]


@pytest.fixture(scope="module")
def experiment(tiny_pipeline, tmp_path_factory):
    """The study on a copy of the tiny pipeline's samples and baselines (one draw per method), every input it
    judges on and the inputs of SGLD's reference predictive recorded on the way."""
    root, config = tiny_pipeline
    target = tmp_path_factory.mktemp("storage")
    shutil.copytree(root / "tiny", target / "tiny", ignore=shutil.ignore_patterns("eval", "experiments", ".lock"))
    judged, references = [], []

    def spy(function, record):
        def wrapper(*args, **kwargs):
            record.append(args)
            return function(*args, **kwargs)
        return wrapper

    args = ["experiment", "storage", "--config", str(config), "--artifacts", str(target), "--quiet",
            "--set", "evaluate.runs=1", *(arg for option in OPTIONS for arg in ("--option", option))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(protocol, "judge_probs", spy(protocol.judge_probs, judged))
        patch.setattr(yardstick, "judge_probs", spy(yardstick.judge_probs, judged))
        patch.setattr(storage, "reference_sums", spy(storage.reference_sums, references))
        assert main(args) == 0
    out = target / "tiny" / "experiments"
    return json.loads((out / "storage.json").read_text()), out, judged, references


def test_outputs_hold_one_row_per_method_and_per_kept_set(experiment):
    results, out, _, _ = experiment
    assert [row["name"] for row in results["rows"]] == NAMES
    assert [row["k"] for row in results["kept"]] == [1, 2, 5]  # 1000 is more than the store holds
    assert results["ood_sets"] == ["gaussian", "uniform"] and results["dim"] == D and results["runs"] == 1
    markdown = (out / "storage.md").read_text()
    assert markdown.count("\n| ") == 1 + len(NAMES) + 3  # header, methods, kept sets
    assert "| replaces (mean BALD AUROC) |" in markdown and "| kept SGLD k=5 | 5 | 12,050 |" in markdown
    assert (out / "storage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_storage_counted_by_hand(experiment):
    rows = {row["name"]: row for row in experiment[0]["rows"]}
    assert rows["SGLD"]["parameters"] == 200 * D and rows["SGLD"]["in_sgld_samples"] == 200
    for k in (1, 2):  # k means, k variances and k weights
        assert rows[f"MoG k={k}"]["parameters"] == k * (2 * D + 1)
    codec = (RANK + 1) * D + RANK  # μ, the basis and the r spreads
    for width in (8, 16):  # the generator z(32) → width → r
        row = rows[f"APD r={RANK} width {width}"]
        assert row["parameters"] == codec + 32 * width + width + width * RANK + RANK
        assert row["steps"] == 20 and row["in_sgld_samples"] == pytest.approx(row["parameters"] / D, abs=1e-3)
    assert rows["SGD"]["parameters"] == D and rows["deep ensemble"]["parameters"] == 2 * D  # two members
    assert rows["deep ensemble"]["members"] == 2 and rows["Laplace KFAC"]["members"] == 20


def test_shares_and_break_even_follow_from_the_values(experiment):
    results = experiment[0]
    sgld, *others = results["rows"]
    assert sgld["shares"] == {m: 1.0 for m in METRICS}
    kept = {m: [(r["k"], r["evenly_spaced"][m]) for r in results["kept"]] for m in METRICS}
    assert kept["mean_bald_auroc"][0] == (1, None)  # one network has no BALD
    for row in results["rows"]:
        for metric, higher in METRICS.items():
            stat = row["quality"][metric]
            if stat is None:  # SGD: no BALD
                assert row["name"] == "SGD" and metric == "mean_bald_auroc" and row["break_even"][metric] is None
                continue
            assert row["shares"][metric] == pytest.approx(stat["mean"] / sgld["quality"][metric]["mean"])
            assert row["break_even"][metric] == break_even(stat["mean"], kept[metric], higher)
        assert 0.5 < row["shares"]["acc"] < 1.1
    assert sgld["break_even"]["mean_bald_auroc"] != "<2"  # SGLD's own ensemble beats two kept samples


def test_judged_only_on_validation_images_and_the_ood_tuning_pool(experiment, tmp_path):
    _, _, judged, references = experiment
    ctx = tiny_context(tmp_path)
    tuning, reported = evaluation_inputs(ctx, role="tuning"), evaluation_inputs(ctx)
    assert len(judged) >= 8 + 3 * (1 + ctx.cfg.evaluate.yardstick_subsets)  # every method, every kept set
    for args in judged:
        inputs = args[1]
        assert torch.equal(inputs.x_test, ctx.data.x_val) and torch.equal(inputs.y_test, ctx.data.y_val)
        assert list(inputs.ood) == list(tuning.ood)
        for name, x in inputs.ood.items():
            assert torch.equal(x, tuning.ood[name]) and not torch.equal(x, reported.ood[name])
    assert len(references) == 1 and torch.equal(references[0][1].x_test, ctx.data.x_val)
    assert all(torch.equal(x, tuning.ood[name]) for name, x in references[0][1].ood.items())


def test_break_even_by_hand():
    curve = [(1, 0.80), (2, 0.85), (5, 0.90), (10, 0.92)]
    assert break_even(0.87, curve, True) == "5"  # 2 kept samples fall short, 5 are at least as good
    assert break_even(0.85, curve, True) == "2"  # a tie counts as at least as good
    assert break_even(0.80, curve, True) == "1"
    assert break_even(0.79, curve, True) == "<1"  # worse than a single kept sample
    assert break_even(0.95, curve, True) == ">10"  # better than the most kept
    nll = [(1, 0.5), (2, 0.3), (5, 0.2)]  # lower is better
    assert (break_even(0.25, nll, False), break_even(0.6, nll, False), break_even(0.1, nll, False)) == ("5", "<1", ">5")
    bald = [(1, None), (2, 80.0), (5, 90.0)]  # one network has no BALD: the curve starts at 2
    assert (break_even(70.0, bald, True), break_even(85.0, bald, True)) == ("<2", "5")
    assert break_even(0.86, [(1, 0.8), (3, 0.85), (2, 0.9)], True) == "2"  # the smallest k, whatever the order
    assert break_even(None, curve, True) is None and break_even(0.5, [(1, None)], True) is None


def test_plan_options_are_checked():
    plan = plan_from_options(["ranks=[4]", "widths=[[16, 16]]", "peers=['swag']"], StoragePlan)
    assert (plan.ranks, plan.widths, plan.peers, plan.mog_components) == ([4], [[16, 16]], ["swag"],
                                                                         [1, 2, 5, 10, 20, 40, 60])
    with pytest.raises(ConfigError, match="'peers\\[0\\]' must be one of"):
        plan_from_options(["peers=['apd']"], StoragePlan)
    with pytest.raises(ConfigError, match="'widths\\[0\\]' must be a list of positive integers"):
        plan_from_options(["widths=[[0]]"], StoragePlan)


def test_make_docs_renders_the_table_from_the_json(experiment, tmp_path):
    _, out, _, _ = experiment
    (tmp_path / "docs" / "results" / "tiny").mkdir(parents=True)
    shutil.copy(out / "storage.json", tmp_path / "docs" / "results" / "tiny" / "storage.json")
    assert render_table("tiny", "storage-study", tmp_path) == (out / "storage.md").read_text().strip()
