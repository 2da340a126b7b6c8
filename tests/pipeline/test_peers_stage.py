"""The peers in the pipeline: `apd sample` trains SWAG and the deep ensemble, `apd evaluate` loads every
registered method, reports the kept-samples yardstick and the new tables and figure (tiny pipeline)."""

from __future__ import annotations

import csv
import json
import math
from contextlib import ExitStack

import pytest
import torch

from apd.evaluation.yardstick import percentile_rank
from apd.io import load_torch
from apd.methods import ALL_METHODS
from apd.nets import ParamSpec, mlp
from apd.pipeline.methods import load_methods
from apd.samplers.store import SampleStore
from tests.tiny_pipeline import TINY, tiny_context


@pytest.fixture(scope="module")
def results(tiny_pipeline):
    root, _ = tiny_pipeline
    return json.loads((root / "tiny" / "eval" / "results.json").read_text())


@pytest.fixture(scope="module")
def loaded(tiny_pipeline):
    root, _ = tiny_pipeline
    ctx = tiny_context(root)
    with ExitStack() as stack:
        methods, _ = load_methods(ctx, stack)
        yield ctx, methods


def test_sample_stores_the_ensemble_and_swag_with_manifests(tiny_pipeline):
    root, _ = tiny_pipeline
    layout = tiny_context(root).layout
    spec = ParamSpec.from_module(mlp([64, 32, 10]))
    members = load_torch(layout.baseline("ensemble"))["members"]
    assert members.shape == (TINY["peers"]["ensemble_members"], spec.numel)
    net = mlp([64, 32, 10])
    net.load_state_dict(load_torch(layout.baseline("sgd")))
    sgd = spec.flatten(net)
    assert not torch.equal(members[0], members[1]) and not any(torch.equal(m, sgd) for m in members)
    swag = load_torch(layout.baseline("swag"))
    assert swag["mean"].shape == swag["variance"].shape == (spec.numel,)
    assert swag["deviations"].shape == (TINY["peers"]["swag_rank"], spec.numel)
    record = json.loads(layout.baseline("swag").with_suffix(".json").read_text())
    assert record["stage"] == "peers" and record["lr"] in TINY["peers"]["swag_lrs"]
    assert set(record["val_nll"]) == {f"{lr:g}" for lr in TINY["peers"]["swag_lrs"]}
    finite = {lr: v for lr, v in record["val_nll"].items() if v is not None}
    assert record["lr"] == float(min(finite, key=finite.get))  # the lowest validation NLL


def test_baselines_and_peers_on_two_workers_are_those_trained_here(tiny_pipeline, tmp_path, monkeypatch):
    """The baselines and peers dealt to two worker processes (SGD then SWAG, and MC dropout, on one; the
    ensemble on the other) are, bit for bit, those the tiny pipeline trained in turn in this process; once they
    are complete, no worker is started again."""
    from apd.pipeline import parallel
    from apd.pipeline.sample import train_all_baselines

    root, _ = tiny_pipeline
    ctx = tiny_context(tmp_path)
    ctx.cfg.threads = torch.get_num_threads()  # the workers compute on the threads this process does
    train_all_baselines(ctx, workers=2)
    for name in ("sgd", "mcdropout", "ensemble", "swag"):
        ours, theirs = (load_torch(tiny_context(r).layout.baseline(name)) for r in (tmp_path, root))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), name
    monkeypatch.setattr(parallel, "spawn", lambda *args, **kwargs: pytest.fail("workers for complete baselines"))
    train_all_baselines(ctx, workers=2)


def test_every_method_draws_members_of_the_right_shape(loaded):
    ctx, methods = loaded
    assert list(methods) == list(ALL_METHODS)
    x = ctx.data.x_test[:7]
    for name, method in methods.items():
        k = method.ensemble_size(3)
        probs = method.members(3, torch.Generator().manual_seed(0))(x)
        assert probs.shape == (k, 7, 10), name
        torch.testing.assert_close(probs.sum(-1), torch.ones(k, 7), msg=name)
        if method.has_weights:
            assert method.sample_weights(3, torch.Generator().manual_seed(0)).shape == (k, method.spec.numel), name
    assert not methods["laplace-glm"].has_weights
    worth = methods["apd"].storage_in_samples()
    for name in ("kept", "stein"):
        assert methods[name].max_members() == math.ceil(worth)
        assert methods[name].storage_in_samples() == math.ceil(worth)
    assert methods["ensemble"].max_members() == TINY["peers"]["ensemble_members"]


def test_kept_and_stein_samples_are_rows_of_the_store_and_laplace_sits_at_the_sgd_weights(loaded):
    ctx, methods = loaded
    with SampleStore.open(ctx.layout.samples) as store:
        for name in ("kept", "stein"):
            rows = methods[name].rows
            assert len(set(rows.tolist())) == len(rows) and rows.max() < len(store)
            torch.testing.assert_close(methods[name].vectors, store.read(rows), rtol=0, atol=0)
    sgd = methods["sgd"].weights[0]
    for name in ("laplace-kfac", "laplace-ll"):
        torch.testing.assert_close(methods[name].base, sgd, rtol=0, atol=0)


def _with_trace_burn_in(root, monkeypatch, burn_in: int, **evaluate):
    """A context for the tiny pipeline under ``root`` that drops the first ``burn_in`` samples of each chain as
    the trace's burn-in (``evaluate.burn_in_from_trace``, the trace's reading replaced), with ``evaluate``'s
    other settings."""
    from apd.pipeline import methods as loaders

    monkeypatch.setattr(loaders, "trace_burn_in", lambda log_liks, chains: {"burn_in": burn_in, "rhat": 1.0,
                                                                             "reached": True})
    return tiny_context(root, evaluate={"burn_in_from_trace": True, **evaluate})


def test_stein_thinning_and_the_kept_samples_choose_among_the_samples_after_the_trace_burn_in(tiny_pipeline,
                                                                                             monkeypatch):
    """With ``evaluate.burn_in_from_trace`` Stein's candidates, like the kept samples, are the samples after the
    trace's burn-in (here all of its last quarter, so that whole-store candidates would mostly lie before it);
    Stein's rows are the store's, the kept samples' those of the samples after the burn-in."""
    from apd.posteriors.stein import stein_rows
    from apd.samplers.burn_in import retained_rows
    from apd.samplers.store import StoreRows

    root, _ = tiny_pipeline
    with SampleStore.open(tiny_context(root).layout.samples) as store:
        chains = store.chains
    burn_in = 3 * len(chains) // 4  # the tiny store holds one chain
    pool_size = len(chains) - burn_in
    ctx = _with_trace_burn_in(root, monkeypatch, burn_in, stein_candidates=pool_size,
                              methods=["sgld", "apd", "kept", "stein"])
    details = {}
    with ExitStack() as stack:
        methods, _ = load_methods(ctx, stack, details)
        kept = methods["kept"]  # rows of the pool it was read from
        assert isinstance(kept.source, StoreRows) and kept.source.rows[kept.rows].min() >= burn_in
        assert methods["stein"].source is not kept.source and methods["stein"].rows.min() >= burn_in
        assert details["stein"]["rows"] == methods["stein"].rows.tolist()
        assert details["stein"]["candidates"] == pool_size
        store = stack.enter_context(SampleStore.open(ctx.layout.samples))
        pool = StoreRows(store, retained_rows(store.chains, burn_in))
        picks = stein_rows(pool, len(methods["stein"].rows), ctx.data.x_train, ctx.data.y_train,
                           ctx.cfg.sgld.prior_var, candidates=pool_size, temperature=ctx.cfg.sgld.temperature)
        assert (methods["stein"].rows == burn_in + picks).all()


def test_a_trace_burn_in_of_zero_leaves_stein_thinning_as_it_is_on_the_whole_store(tiny_pipeline, monkeypatch):
    """Where the trace drops nothing, Stein's candidates and picks are those of the whole store: the published
    pipelines whose trace burn-in is 0 keep their Stein numbers."""
    from apd.posteriors.stein import stein_rows

    root, _ = tiny_pipeline
    ctx = _with_trace_burn_in(root, monkeypatch, 0, methods=["sgld", "apd", "stein"])
    with ExitStack() as stack:
        stein = load_methods(ctx, stack)[0]["stein"]
        store = stack.enter_context(SampleStore.open(ctx.layout.samples))
        whole = stein_rows(store, len(stein.rows), ctx.data.x_train, ctx.data.y_train, ctx.cfg.sgld.prior_var,
                           candidates=ctx.cfg.evaluate.stein_candidates, temperature=ctx.cfg.sgld.temperature)
        assert stein.rows.tolist() == whole.tolist()
        torch.testing.assert_close(stein.vectors, store.read(whole), rtol=0, atol=0)


def test_results_hold_the_yardstick_and_every_method_in_every_table(tiny_pipeline, results):
    root, _ = tiny_pipeline
    y = results["yardstick"]
    assert [row["k"] for row in y["curve"]] == [1, 2, 5]
    assert y["reference"]["kl_samples"] == TINY["evaluate"]["yardstick_reference"]
    assert {"apd", "stein", "swag", "ensemble", "laplace-kfac", "mog"} <= set(y["equal_storage"])
    for entry in y["equal_storage"].values():
        row = y["kept"][str(entry["k"])]
        assert entry["k"] == math.ceil(entry["in_sgld_samples"] - 1e-9)
        assert row["random"]["nll_gap"]["std"] >= 0 and row["evenly_spaced"]["kl"] >= 0
    assert set(results["quality"]) == set(ALL_METHODS)
    # SGLD's reference AUROCs are its runs' means, so its gaps per draw are its runs' mean absolute deviations
    # from them: at most each set's standard deviation over the runs (ddof 0), summed over the sets for the worst
    sgld, ood = results["quality"]["sgld"], results["ood"]
    spread = {name: ood[name]["bald"]["sgld"]["auroc"]["std"] for name in ood}
    assert all(0 <= sgld["set_gaps"]["bald"][name] <= spread[name] + 1e-9 for name in ood)
    assert 0 < sgld["bald_gap"] <= sum(spread.values()) + 1e-9
    at = results["at_networks"]
    assert all(at[name] is None for name in ("sgd", "kept", "stein", "ensemble"))
    assert all(at[name]["members"] == TINY["evaluate"]["networks"] for name in ("mcdropout", "swag", "laplace-glm"))
    assert all("quality" in row for row in results["mog"])
    peers = results["peers"]
    assert peers["laplace-kfac"]["scale"] in peers["laplace-kfac"]["scales"]
    assert peers["stein"]["candidates"] == TINY["evaluate"]["stein_candidates"]
    tables = (root / "tiny" / "eval" / "tables.md").read_text()
    for title in ("## Every method against SGLD", "## The kept-samples yardstick at equal storage",
                  "## Kept SGLD samples: storage against quality", "## How the peers' settings were chosen",
                  "## Against the kept samples, set by set"):
        assert title in tables
    for label in ("SWAG", "deep ensemble", "Laplace KFAC, GLM", "Stein-thinned SGLD", "kept SGLD"):
        assert f"| {label} |" in tables
    assert (root / "tiny" / "eval" / "figures" / "storage_quality.png").is_file()
    assert (root / "tiny" / "eval" / "yardstick.csv").is_file()
    # APD against its kept samples, set by set: its absolute gap to SGLD's AUROC, ranked among the subsets
    kept = y["kept"][str(y["equal_storage"]["apd"]["k"])]
    assert kept["subsets"] == 200 and len(kept["random"]["kl"]["values"]) == 200 and "last" in kept
    with open(root / "tiny" / "eval" / "kept_margins.csv") as f:
        margins = [line for line in csv.DictReader(f) if line["method"] == "apd" and line["score"] == "bald"]
    assert {line["set"] for line in margins} == set(results["ood"])
    for line in margins:
        own = results["ood"][line["set"]]["bald"]["apd"]["auroc"]["mean"]
        assert float(line["gap"]) == pytest.approx(abs(own - y["reference"]["bald_auroc"][line["set"]]))
        gaps = [abs(v - y["reference"]["bald_auroc"][line["set"]])
                for v in kept["random"]["auroc"]["bald"][line["set"]]["values"]]
        assert float(line["percentile"]) == pytest.approx(percentile_rank(float(line["gap"]), gaps))
    assert results["burn_in"]["applied"] is False and results["burn_in"]["burn_in"] >= 0
