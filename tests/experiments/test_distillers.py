"""``apd experiment distillers`` on a tiny digits pipeline: outputs, storage by hand, shares, errors."""

from __future__ import annotations

import json

import pytest
import torch

from apd.cli import main
from apd.distillation.codec import fit_codec
from apd.errors import ConfigError
from apd.experiments.distillers import DecoupledResidual, DistillerPlan, ProjectedSamples, variants
from apd.experiments.options import plan_from_options
from apd.posteriors import SGLDSamples
from apd.samplers.store import SampleStore
from tests.tiny_pipeline import TINY, toml

D = 64 * 32 + 32 + 32 * 10 + 10  # weights of the tiny 64-32-10 network: 2,410
RANK = 4
OPTIONS = [f"ranks=[{RANK}]", f"residual_ranks=[{RANK}]", "fitted_residual_ranks=[]", f"kronecker_ranks=[{RANK}]",
           "mog_components=[2]", "diagonal=false", "dense_steps=0", "subspace_steps=60"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """SGLD samples of the tiny pipeline, then the experiment with subspace APD and its null model, one run."""
    root = tmp_path_factory.mktemp("artifacts")
    config = root / "tiny.toml"
    config.write_text(toml(TINY))
    assert main(["sample", "--config", str(config), "--artifacts", str(root), "--quiet"]) == 0
    args = ["experiment", "distillers", "--config", str(config), "--artifacts", str(root), "--quiet",
            "--set", "evaluate.runs=1", *(arg for option in OPTIONS for arg in ("--option", option))]
    assert main(args) == 0
    out = root / "tiny" / "experiments"
    return json.loads((out / "distillers.json").read_text()), out


def test_outputs_hold_one_row_per_distiller(experiment):
    results, out = experiment
    assert [row["name"] for row in results["rows"]] == ["SGLD", f"SGLD in subspace r={RANK}",
                                                        f"SGLD in subspace r={RANK} + another sample's residual",
                                                        f"subspace APD r={RANK}",
                                                        f"subspace APD r={RANK} + matched residual",
                                                        f"subspace APD r={RANK} + Kronecker residual",
                                                        f"Gaussian r={RANK}", f"Gaussian r={RANK} + matched residual",
                                                        f"Gaussian r={RANK} + Kronecker residual", "MoG-2"]
    assert results["runs"] == 1 and results["ood_sets"] == ["gaussian", "uniform"] and results["dim"] == D
    markdown = (out / "distillers.md").read_text()
    assert markdown.count("\n| ") == 1 + 10  # header and ten rows
    assert "| SGLD | 200 |" in markdown and "(reference)" in markdown
    assert (out / "distillers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_storage_counted_by_hand(experiment):
    sgld, projected, decoupled, gan, gan_residual, gan_kronecker, gaussian, gaussian_residual, _, mog = \
        experiment[0]["rows"]
    assert sgld["in_sgld_samples"] == 200  # the tiny store: (2500 − 500) / 10 samples
    assert projected["parameters"] == gaussian["parameters"] + 200 * RANK  # the codec and r numbers per sample
    assert decoupled["parameters"] == 200 * D  # the whole store: residuals are drawn from it
    # μ (D) + basis (D × r) + σ (r): r + 1 weight vectors and r numbers.
    assert gaussian["parameters"] == D * (RANK + 1) + RANK
    assert gaussian["in_sgld_samples"] == pytest.approx(RANK + 1 + RANK / D)
    # The generator z(32) → 32 → r adds its weights and biases to the same codec.
    assert gan["parameters"] - gaussian["parameters"] == 32 * 32 + 32 + 32 * RANK + RANK
    assert gan["steps"] == 60 and gaussian["steps"] is None
    # The residual adds its D per-weight scales.
    assert gan_residual["parameters"] == gan["parameters"] + D
    assert gaussian_residual["parameters"] == gaussian["parameters"] + D
    # The Kronecker residual keeps, per layer, the top kronecker_rank = 50 eigenpairs of A (all 33 in
    # layer 2) and the tail's mean eigenvalue, all of G's eigenpairs; and N, λ and α.
    layer_1 = 65 * 50 + 50 + 1 + 32 * 32 + 32
    layer_2 = 33 * 33 + 33 + 1 + 10 * 10 + 10
    assert gan_kronecker["parameters"] == gan["parameters"] + layer_1 + layer_2 + 3
    assert mog["parameters"] == 2 * (2 * D + 1)  # per component a mean, D variances and a weight


def test_matched_residuals_record_their_scale(experiment):
    results, out = experiment
    scales = {row["name"]: row["residual_scale"] for row in results["rows"]}
    for name in (f"subspace APD r={RANK} + matched residual", f"Gaussian r={RANK} + matched residual",
                 f"subspace APD r={RANK} + Kronecker residual", f"Gaussian r={RANK} + Kronecker residual"):
        assert 0.0 <= scales.pop(name) <= 2.0
        assert f"{name} (α = " in (out / "distillers.md").read_text()
    assert set(scales.values()) == {None}


def test_numbers_in_range_and_shares_relative_to_sgld(experiment):
    sgld, *others = experiment[0]["rows"]
    assert sgld["accuracy_share"] == 1 and sgld["mean_auroc_share"] == {"bald": 1, "max_prob": 1}
    assert sgld["worst_auroc_gap"] == {"bald": 0, "max_prob": 0}
    assert sgld["accuracy"]["mean"] > 0.85 and sgld["missed_targets"] is None and sgld["fidelity"] is None
    for row in others:
        assert row["accuracy_share"] == pytest.approx(row["accuracy"]["mean"] / sgld["accuracy"]["mean"])
        assert 0.8 < row["accuracy_share"] < 1.1
        for by_set in row["auroc"].values():
            assert all(0 <= stat["mean"] <= 100 and stat["std"] == 0 for stat in by_set.values())  # one run
        # every weight of a diagonal mixture's draw is independent noise: further from each sample (3.1 here)
        assert 0.3 < row["fidelity"]["nn_ratio"] < 5
        for score, by_set in row["auroc"].items():  # the largest shortfall against SGLD over the OOD sets
            assert row["worst_auroc_gap"][score] == pytest.approx(
                max(sgld["auroc"][score][name]["mean"] - stat["mean"] for name, stat in by_set.items()))
        assert "time" not in row["missed_targets"]
        assert ("storage" in row["missed_targets"]) == (row["family"] == "decoupled")  # it keeps the whole store


def test_projection_keeps_rank_r_and_the_full_span_keeps_the_samples(experiment):
    """Projecting on the span of all centred samples gives them back, to the accuracy a float32 SVD
    guarantees: its backward error is at most p(n, D)·ε₃₂·‖A‖₂ for the centred samples A (Golub & Van
    Loan, §8.6), taken with p = max(n, D), and ‖A‖₂ bounds every entry."""
    _, out = experiment
    with SampleStore.open(out.parent / "samples.h5") as store:
        sgld, samples = SGLDSamples(store), store.read_all()
        for rank in (3, len(store) - 1):  # centred samples span len(store) − 1 dimensions
            codec = fit_codec("subspace", samples, rank, residual=False)
            projected = ProjectedSamples(sgld, codec, "p").sample_weights(len(store), torch.Generator().manual_seed(1))
            assert torch.linalg.matrix_rank(projected - codec.mean, rtol=1e-4) == rank
        original = sgld.sample_weights(len(store), torch.Generator().manual_seed(1))
        bound = max(samples.shape) * torch.finfo(torch.float32).eps * torch.linalg.matrix_norm(
            samples - samples.mean(0), ord=2)
        assert (projected - original).abs().max() <= bound


def test_decoupled_residual_joins_one_draw_inside_the_subspace_to_another_outside(experiment):
    _, out = experiment
    with SampleStore.open(out.parent / "samples.h5") as store:
        sgld = SGLDSamples(store)
        codec = fit_codec("subspace", store.read_all(), RANK, residual=False)
        mixed = DecoupledResidual(sgld, codec, "d").sample_weights(50, torch.Generator().manual_seed(2))
        replay = torch.Generator().manual_seed(2)
        first, second = sgld.sample_weights(50, replay), sgld.sample_weights(50, replay)
        inside = codec.decode(codec.encode(mixed))
        torch.testing.assert_close(inside, codec.decode(codec.encode(second)), atol=1e-4, rtol=0)
        torch.testing.assert_close(mixed - inside, first - codec.decode(codec.encode(first)), atol=1e-4, rtol=0)
        assert DecoupledResidual(sgld, codec, "d").stored_parameters() == len(store) * D


def test_plan_options_are_checked():
    plan = plan_from_options(["ranks=[3, 5]", "max_seconds=60", "diagonal=false"], DistillerPlan)
    assert (plan.ranks, plan.max_seconds, plan.diagonal) == ([3, 5], 60.0, False)
    plan = DistillerPlan(ranks=[3], residual_ranks=[4], fitted_residual_ranks=[5], kronecker_ranks=[6],
                         mog_components=[2])
    names = [v.name for v in variants(plan)]
    assert names == ["SGLD", "SGLD in subspace r=3", "SGLD in subspace r=3 + another sample's residual", "dense APD",
                     "subspace APD r=3", "subspace APD r=4 + matched residual", "subspace APD r=5 + fitted residual",
                     "subspace APD r=6 + Kronecker residual", "Gaussian r=3", "Gaussian r=4 + matched residual",
                     "Gaussian r=6 + Kronecker residual", "diagonal Gaussian", "MoG-2"]
    with pytest.raises(ConfigError, match="unknown key 'rank'"):
        plan_from_options(["rank=[3]"], DistillerPlan)
    with pytest.raises(ConfigError, match="'dense_steps' must be at least 0"):
        plan_from_options(["dense_steps=-1"], DistillerPlan)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        plan_from_options(["ranks"], DistillerPlan)


def test_too_large_a_rank_is_a_config_error(experiment, capsys):
    _, out = experiment
    config, root = out.parent.parent / "tiny.toml", out.parent.parent
    assert main(["experiment", "distillers", "--config", str(config), "--artifacts", str(root), "--quiet",
                 "--option", "ranks=[201]"]) == 2
    assert "a subspace rank can be at most 200 here" in capsys.readouterr().err


def test_missing_samples_name_the_stage(tmp_path, capsys):
    config = tmp_path / "p.toml"
    config.write_text(toml({**TINY, "name": "nothing"}))
    assert main(["experiment", "distillers", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 2
    assert "run `apd sample --config" in capsys.readouterr().err


def test_the_mixtures_fit_the_samples_aligned_as_the_generators_see_them(monkeypatch, tmp_path):
    """A mixture row is fit to the store with the permutations the study's training samples carry (the
    alignment of ``apd distill``, as ``apd evaluate``'s MoG), not to the samples as stored."""
    from types import SimpleNamespace

    from apd.experiments import distillers
    from tests.tiny_pipeline import tiny_context

    fitted = []
    monkeypatch.setattr(distillers, "fit_mixture", lambda *args: fitted.append(args) or "mixture")
    perms = torch.arange(6).reshape(2, 3)
    store = SimpleNamespace(spec=None)
    built = distillers.build(distillers.Variant("MoG-2", "mog", components=2), tiny_context(tmp_path), store,
                             DistillerPlan(), 0.0, SimpleNamespace(perms=perms))
    assert built.method == "mixture" and fitted[0][0] is store and fitted[0][1] == 2 and fitted[0][-1] is perms
