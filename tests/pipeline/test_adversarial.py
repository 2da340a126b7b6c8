"""Adversarial part of `apd evaluate` on the tiny digits pipeline, and its pieces on hand-made cases."""

from __future__ import annotations

import json
from contextlib import ExitStack

import h5py
import pytest
import torch
from torch import Tensor

from apd.cli import main
from apd.config_load import from_dict
from apd.errors import ConfigError
from apd.pipeline import adversarial as adv
from apd.pipeline.adversarial import (
    ATTACK_NAMES,
    DETECTION_SCORES,
    GRAY_BOX,
    WHITE_BOX,
    AdversarialSet,
    adversarial_set,
    attacked_model,
    craft_successful,
    ensemble_scores,
    evaluate_adversarial,
    load_set,
)
from apd.pipeline.methods import load_methods
from apd.uncertainty import scores as uncertainty_scores
from tests.tiny_pipeline import TINY, tiny_context, toml

SOURCES = ("mcdropout", "sgld", "apd")
TARGETS = ("sgd", "mcdropout", "sgld", "apd", "mog", "kept", "laplace-glm")  # the GLM predictive: a target only
ADVERSARIAL = {"enabled": True, "examples": 60, "samples": 20, "whitebox_examples": 30}


def adversarial_context(root, **adversarial):
    return tiny_context(root, evaluate={"methods": list(TARGETS), "adversarial": {**ADVERSARIAL, **adversarial}})


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The tiny pipeline run through the CLI with the adversarial part on: (root, results)."""
    root = tmp_path_factory.mktemp("artifacts")
    config = root / "tiny.toml"
    config.write_text(toml({**TINY, "evaluate": {**TINY["evaluate"], "methods": list(TARGETS),
                                                 "adversarial": ADVERSARIAL, "yardstick_sizes": [2],
                                                 "figures": False}}))
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
        assert all(cell[score] is None or 0.0 <= cell[score]["auroc"] <= 100.0 for score in DETECTION_SCORES)
        assert 0.0 <= cell["accuracy"] <= 1.0
    # a single network has no spread over members: BALD and model variance are n/a for it, not 50
    assert gray["sgld"]["pgd"]["sgd"]["bald"] is None and gray["sgld"]["pgd"]["sgd"]["entropy"] is not None
    meta = results["adversarial_meta"]
    kept = results["peers"]["kept"]["k"]
    assert meta["members"] == {"sgd": 1, "mcdropout": 20, "sgld": 20, "apd": 20, "mog": 20, "kept": kept,
                               "laplace-glm": 20}
    for s in SOURCES:
        for a in ATTACK_NAMES:
            summary = meta[GRAY_BOX][s][a]
            assert summary["examples"] == 60
            assert 0.5 < summary["clean_accuracy"] <= 1.0 and 0.0 < summary["success_rate"] <= 1.0
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
    grid = torch.tensor(ctx.cfg.evaluate.adversarial.fgsm_eps_grid)
    for setting in (GRAY_BOX, WHITE_BOX):
        for source in SOURCES:
            for attack in ATTACK_NAMES:
                path = ctx.layout.adversarial_set(setting == WHITE_BOX, source, attack)
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
                if setting == GRAY_BOX:
                    model_fn = attacked_model(ctx, loaded[source], setting, source)
                    with torch.no_grad():
                        adversarial_right = (model_fn(stored.x_adv).argmax(-1) == stored.y).float().mean().item()
                        clean_right = (model_fn(data.x_val[stored.index]).argmax(-1) == stored.y).all()
                    # one fixed member (MC dropout: one fixed mask): it classified every attacked input
                    # correctly before, and its own examples all fool it
                    assert adversarial_right == 0.0 and bool(clean_right)


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
    ctx = adversarial_context(tmp_path, examples=10)
    path = ctx.layout.adversarial_set(False, "sgld", "pgd")
    first = adversarial_set(ctx, loaded["sgld"], GRAY_BOX, "sgld", "pgd")
    mtime = path.stat().st_mtime_ns
    assert torch.equal(adversarial_set(ctx, loaded["sgld"], GRAY_BOX, "sgld", "pgd").x_adv, first.x_adv)
    assert path.stat().st_mtime_ns == mtime
    smaller = adversarial_context(tmp_path, examples=10, pgd_eps=0.1)
    recrafted = adversarial_set(smaller, loaded["sgld"], GRAY_BOX, "sgld", "pgd")
    assert float((recrafted.x_adv - smaller.data.x_val[recrafted.index]).abs().max()) <= 0.1 + 1e-6
    path.write_bytes(b"not an HDF5 file")
    assert len(adversarial_set(ctx, loaded["sgld"], GRAY_BOX, "sgld", "pgd").y) == 10
    assert not path.with_name(path.name + ".tmp").exists()


def test_attacked_mc_dropout_is_one_fixed_seeded_network(methods):
    """The gray-box attacker of MC dropout differentiates one network with one dropout mask, the same
    on every call and in every run."""
    ctx, loaded = methods
    x = ctx.data.x_val[:50]
    first = attacked_model(ctx, loaded["mcdropout"], GRAY_BOX, "mcdropout")
    again = attacked_model(ctx, loaded["mcdropout"], GRAY_BOX, "mcdropout")
    with torch.no_grad():
        torch.testing.assert_close(first(x), first(x), rtol=0, atol=0)
        torch.testing.assert_close(first(x), again(x), rtol=0, atol=0)


def test_craft_successful_counts_only_inputs_classified_correctly_before(monkeypatch):
    """A linear model that predicts class 0 exactly when x₀ > 0, every label 0: the inputs with x₀ > 0
    are classified correctly; FGSM with ε = 0.25 moves x₀ down by 0.25, so it succeeds on exactly the
    correct ones with x₀ < 0.25 (rows 2 and 9); the wrong ones (x₀ < 0) never count as successes."""
    monkeypatch.setattr(adv, "ATTEMPT_BATCH", 4)
    x0 = torch.tensor([0.5, -0.2, 0.1, -0.4, 0.3, 0.6, -0.7, -0.1, -0.9, 0.2])
    x = torch.stack([x0, torch.zeros(10)], dim=1)
    labels = torch.zeros(10, dtype=torch.long)
    order = torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])

    def model_fn(inputs: Tensor) -> Tensor:
        return torch.stack([inputs[:, 0], -inputs[:, 0]], dim=1)

    every = craft_successful(model_fn, x, labels, order, 100, "fgsm", {"eps": 0.25})
    assert every.index.tolist() == [9, 2] and every.n_attempted == 10 and every.n_clean_correct == 5
    torch.testing.assert_close(every.x_adv[:, 0], x0[[9, 2]] - 0.25)
    assert every.summary()["clean_accuracy"] == 0.5 and every.summary()["success_rate"] == 0.4
    first = craft_successful(model_fn, x, labels, order, 1, "fgsm", {"eps": 0.25})
    assert first.index.tolist() == [9] and first.n_attempted == 1 and first.n_clean_correct == 1
    none = craft_successful(model_fn, x, labels, order, 3, "fgsm", {"eps": 0.0})
    assert len(none.y) == 0 and none.n_attempted == 10
    assert none.summary() == {"examples": 0, "attempted": 10, "clean_accuracy": 0.5, "success_rate": 0.0,
                              "mean_eps": None}


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
                          torch.arange(3), n_attempted=5, n_clean_correct=4)
    summary = kept.summary()
    assert summary["examples"] == 3 and summary["success_rate"] == 0.75 and summary["clean_accuracy"] == 0.8
    assert summary["mean_eps"] == pytest.approx(0.2)


@pytest.mark.parametrize(("adversarial", "message"), [
    ({"fgsm_eps_grid": []}, "fgsm_eps_grid"),
    ({"fgsm_eps_grid": [0.1, 0.0]}, "fgsm_eps_grid"),
    ({"sources": ["sgld", "bogus"]}, "unknown method 'bogus'"),
])
def test_bad_adversarial_config_is_one_clear_error(adversarial, message):
    with pytest.raises(ConfigError, match=message):
        from_dict({"evaluate": {"adversarial": adversarial}})
