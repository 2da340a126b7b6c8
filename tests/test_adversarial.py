"""Adversarial part of `apd evaluate` on the tiny digits pipeline, and its pieces on hand-made cases."""

from __future__ import annotations

import json
from contextlib import ExitStack

import h5py
import pytest
import torch
from torch import Tensor

from apd.cli import main
from apd.config import from_dict
from apd.errors import ConfigError
from apd.evaluate import load_methods
from apd.experiments import adversarial as adv
from apd.experiments.adversarial import (
    ATTACK_NAMES,
    DETECTION_SCORES,
    GRAY_BOX,
    WHITE_BOX,
    AdversarialSet,
    adversarial_path,
    adversarial_set,
    attacked_model,
    craft_successful,
    dropout_predictive_fn,
    ensemble_scores,
    evaluate_adversarial,
    load_set,
)
from apd.nets import mlp
from apd.uncertainty import scores as uncertainty_scores
from tests.test_pipeline import TINY, _toml, tiny_context

SOURCES = ("mcdropout", "sgld", "apd")
TARGETS = ("sgd", "mcdropout", "sgld", "apd", "mog")
ADVERSARIAL = {"adversarial": True, "adv_examples": 60, "adv_samples": 20, "adv_whitebox_examples": 30}


def adversarial_context(root, **evaluate):
    return tiny_context(root, evaluate={**ADVERSARIAL, **evaluate})


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The tiny pipeline run through the CLI with the adversarial part on: (root, results)."""
    root = tmp_path_factory.mktemp("artifacts")
    config = root / "tiny.toml"
    config.write_text(_toml({**TINY, "evaluate": {**TINY["evaluate"], **ADVERSARIAL}}))
    for stage in ("sample", "distill", "evaluate"):
        assert main([stage, "--config", str(config), "--artifacts", str(root), "--quiet"]) == 0
    return root, json.loads((root / "tiny" / "eval" / "results.json").read_text())


@pytest.fixture
def methods(evaluated):
    root, _ = evaluated
    ctx = adversarial_context(root)
    with ExitStack() as stack:
        loaded, _ = load_methods(ctx, stack)
        yield ctx, loaded


def test_digits_run_produces_the_full_table(evaluated):
    root, results = evaluated
    gray, white = results["adversarial"], results["adversarial_whitebox"]
    assert set(gray) == set(SOURCES) and set(white) == set(SOURCES)
    cells = [gray[s][a][t] for s in SOURCES for a in ATTACK_NAMES for t in TARGETS]
    cells += [white[t][a] for t in SOURCES for a in ATTACK_NAMES]
    assert all(set(gray[s]) == set(ATTACK_NAMES) and set(gray[s][a]) == set(TARGETS)
               for s in SOURCES for a in ATTACK_NAMES)
    for cell in cells:
        assert set(cell) == {*DETECTION_SCORES, "accuracy"}
        assert all(0.0 <= cell[score]["auroc"] <= 100.0 for score in DETECTION_SCORES)
        assert 0.0 <= cell["accuracy"] <= 1.0
    # a single network has no spread over members: BALD and model variance cannot separate anything
    assert gray["sgld"]["pgd"]["sgd"]["bald"]["auroc"] == 50.0
    meta = results["adversarial_meta"]
    assert meta["members"] == {"sgd": 1, "mcdropout": 20, "sgld": 20, "apd": 20, "mog": 20}
    assert all(meta[GRAY_BOX][s][a]["examples"] == 60 for s in SOURCES for a in ATTACK_NAMES)
    assert results["timing"]["adversarial"] > 0
    tables = (root / "tiny" / "eval" / "tables.md").read_text()
    for title in ("## Adversarial-example detection", "### Gray-box, score: BALD (AUROC %)",
                  "### Gray-box: target accuracy on the adversarial inputs", "### White-box"):
        assert title in tables
    assert "| SGLD | PGD |" in tables


def test_stored_examples_are_successful_and_within_budget(evaluated, methods):
    root, _ = evaluated
    ctx, loaded = methods
    data = ctx.data
    grid = torch.tensor(ctx.cfg.evaluate.fgsm_eps_grid)
    for setting in (GRAY_BOX, WHITE_BOX):
        for source in SOURCES:
            for attack in ATTACK_NAMES:
                path = adversarial_path(ctx, setting, source, attack)
                with h5py.File(path, "r") as fh:
                    assert (fh.attrs["source"], fh.attrs["attack"]) == (source, attack)
                    assert fh["x_adv"].dtype == "float32" and fh["y"].dtype == "int64"
                    n_attempted = int(fh.attrs["n_attempted"])
                stored = load_set(path, {"source": source})
                n = len(stored.y)
                assert n == (60 if setting == GRAY_BOX else 30) <= n_attempted
                assert torch.equal(stored.y, data.y_val[stored.index])
                distance = (stored.x_adv - data.x_val[stored.index]).abs().amax(1)
                assert bool((distance <= stored.eps + 1e-6).all())
                assert stored.x_adv.min() >= -1.0 and stored.x_adv.max() <= 1.0
                if attack == "fgsm" and setting == GRAY_BOX:
                    assert bool(torch.isclose(stored.eps[:, None], grid).any(1).all())
                else:
                    torch.testing.assert_close(stored.eps, torch.full((n,), 0.3))
                if attack == "pgd" and setting == GRAY_BOX:
                    with torch.no_grad(), attacked_model(ctx, loaded[source], setting, source) as model_fn:
                        accuracy = (model_fn(stored.x_adv).argmax(-1) == stored.y).float().mean().item()
                    # one weight sample is deterministic: its own examples all fool it
                    assert accuracy < 0.3 if source == "mcdropout" else accuracy == 0.0


def test_second_run_reuses_the_files_and_repeats_the_numbers(evaluated, methods):
    root, results = evaluated
    ctx, loaded = methods
    files = sorted((root / "tiny" / "adversarial").glob("*.h5"))
    assert len(files) == 2 * len(SOURCES) * len(ATTACK_NAMES)
    mtimes = [path.stat().st_mtime_ns for path in files]
    again = evaluate_adversarial(ctx, loaded)
    assert [path.stat().st_mtime_ns for path in files] == mtimes
    assert json.loads(json.dumps(again)) == {key: results[key] for key in again}


def test_stale_or_corrupt_sets_are_crafted_again(evaluated, methods, tmp_path):
    _, loaded = methods
    ctx = adversarial_context(tmp_path, adv_examples=10)
    path = adversarial_path(ctx, GRAY_BOX, "sgld", "pgd")
    first = adversarial_set(ctx, loaded["sgld"], GRAY_BOX, "sgld", "pgd")
    mtime = path.stat().st_mtime_ns
    assert torch.equal(adversarial_set(ctx, loaded["sgld"], GRAY_BOX, "sgld", "pgd").x_adv, first.x_adv)
    assert path.stat().st_mtime_ns == mtime
    smaller = adversarial_context(tmp_path, adv_examples=10, pgd_eps=0.1)
    recrafted = adversarial_set(smaller, loaded["sgld"], GRAY_BOX, "sgld", "pgd")
    assert float((recrafted.x_adv - smaller.data.x_val[recrafted.index]).abs().max()) <= 0.1 + 1e-6
    path.write_bytes(b"not an HDF5 file")
    assert len(adversarial_set(ctx, loaded["sgld"], GRAY_BOX, "sgld", "pgd").y) == 10
    assert not path.with_name(path.name + ".tmp").exists()


def test_attacked_mc_dropout_is_seeded_and_leaves_rng_and_mode_alone(methods):
    ctx, loaded = methods
    dropout = loaded["mcdropout"]
    dropout.module.eval()
    x = ctx.data.x_val[:50]
    rng_before = torch.get_rng_state()
    outputs = []
    for _ in range(2):
        with torch.no_grad(), attacked_model(ctx, dropout, GRAY_BOX, "mcdropout") as model_fn:
            outputs.append(torch.stack([model_fn(x), model_fn(x)]))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    assert not torch.equal(outputs[0][0], outputs[0][1])  # a fresh mask on each call
    assert torch.equal(torch.get_rng_state(), rng_before) and not dropout.module.training


def test_craft_successful_keeps_the_first_successes_in_order(monkeypatch):
    """A linear model that predicts class 0 exactly when x₀ > 0; with ε = 0 FGSM leaves x as it is,
    so with every label 0 the successes are the inputs with x₀ < 0."""
    monkeypatch.setattr(adv, "ATTEMPT_BATCH", 4)
    x0 = torch.tensor([0.5, -0.2, 0.1, -0.4, 0.3, 0.6, -0.7, -0.1, -0.9, 0.2])
    x = torch.stack([x0, torch.zeros(10)], dim=1)
    labels = torch.zeros(10, dtype=torch.long)
    order = torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])

    def model_fn(inputs: Tensor) -> Tensor:
        return torch.stack([inputs[:, 0], -inputs[:, 0]], dim=1)

    kept = craft_successful(model_fn, x, labels, order, 3, "fgsm", {"eps": 0.0})
    assert kept.index.tolist() == [8, 7, 6] and kept.n_attempted == 4
    torch.testing.assert_close(kept.x_adv, x[[8, 7, 6]])
    every = craft_successful(model_fn, x, labels, order, 100, "fgsm", {"eps": 0.0})
    assert every.index.tolist() == [8, 7, 6, 3, 1] and every.n_attempted == 10
    assert every.summary()["success_rate"] == 0.5
    none = craft_successful(model_fn, x, (x0 < 0).long(), order, 3, "fgsm", {"eps": 0.0})
    assert len(none.y) == 0 and none.n_attempted == 10
    assert none.summary() == {"examples": 0, "attempted": 10, "success_rate": 0.0, "mean_eps": None}


def test_dropout_predictive_averages_the_passes():
    torch.manual_seed(0)
    net, x = mlp([4, 8, 3]), torch.randn(5, 4)
    torch.testing.assert_close(dropout_predictive_fn(net, 7)(x), torch.log_softmax(net(x), -1))
    dropping = mlp([4, 8, 3], dropout=0.5).train()
    torch.manual_seed(1)
    averaged = dropout_predictive_fn(dropping, 4)(x)
    torch.manual_seed(1)
    passes = torch.softmax(dropping(x.repeat(4, 1)).view(4, 5, 3), -1)
    torch.testing.assert_close(averaged.exp(), passes.mean(0))


def test_chunked_scores_equal_the_whole_batch(monkeypatch):
    monkeypatch.setattr(adv, "SCORING_CHUNK", 7)
    probs = torch.softmax(torch.randn(6, 30, 4, generator=torch.Generator().manual_seed(0)), -1)
    x = torch.arange(30)
    scored = ensemble_scores(lambda rows: probs[:, rows], x)
    whole = uncertainty_scores(probs)
    for score in DETECTION_SCORES:
        torch.testing.assert_close(scored[score], whole[score])
    assert torch.equal(scored["prediction"], probs.mean(0).argmax(-1))


def test_adversarial_set_summary_counts():
    kept = AdversarialSet(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), torch.tensor([0.1, 0.2, 0.3]),
                          torch.arange(3), n_attempted=4)
    summary = kept.summary()
    assert summary["examples"] == 3 and summary["success_rate"] == 0.75
    assert summary["mean_eps"] == pytest.approx(0.2)


@pytest.mark.parametrize(("evaluate", "message"), [
    ({"fgsm_eps_grid": []}, "fgsm_eps_grid"),
    ({"fgsm_eps_grid": [0.1, 0.0]}, "fgsm_eps_grid"),
    ({"adv_sources": ["sgld", "bogus"]}, "unknown method 'bogus'"),
])
def test_bad_adversarial_config_is_one_clear_error(evaluate, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"evaluate": evaluate})
