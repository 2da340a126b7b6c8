"""``apd experiment modes``: outputs on the tiny pipeline, and the path between two means on known cases."""

from __future__ import annotations

import json

import torch

from apd.cli import main
from apd.distillation.alignment import permute
from apd.experiments.modes import PATH_POINTS, mode_path, single_networks
from apd.nets import ParamSpec, mlp, predict_probs
from tests.tiny_pipeline import copy_samples_as_two_chains, run_experiment_on_copy

SIZES = [5, 6, 4, 3]
SPEC = ParamSpec.from_module(mlp(SIZES))


def test_single_networks_score_each_network_on_its_own():
    g = torch.Generator().manual_seed(0)
    # small weights: no probability falls below the NLL's floor, so the plain formula applies
    weights, x = 0.3 * torch.randn(3, SPEC.numel, generator=g), torch.randn(50, 5, generator=g)
    y = torch.randint(0, 3, (50,), generator=g)
    scores = single_networks(SPEC, weights, x, y)
    probs = predict_probs(SPEC, weights, x)
    for k in range(3):
        assert scores["accuracy"][k] == (probs[k].argmax(-1) == y).double().mean().item()
        expected = -probs[k, torch.arange(50), y].double().log().mean().item()
        assert abs(scores["nll"][k] - expected) < 1e-6


def test_a_permuted_copy_is_the_same_mode_once_matched():
    g = torch.Generator().manual_seed(1)
    start, x = torch.randn(SPEC.numel, generator=g), torch.randn(80, 5, generator=g)
    y = torch.randint(0, 3, (80,), generator=g)
    perms = torch.cat([torch.randperm(6, generator=g), torch.randperm(4, generator=g)])
    path = mode_path(SPEC, start, permute(start, SPEC, perms), x, y, torch.randn(200, 5, generator=g))
    assert path["t"] == list(PATH_POINTS)
    assert path["distance"]["as_stored"] > 1
    endpoint = single_networks(SPEC, start[None], x, y)["accuracy"][0]
    for kind in ("aligned", "activations"):  # weight and activation matching both undo the permutation
        assert path["distance"][kind] < 1e-5
        assert all(abs(a - endpoint) < 1e-9 for a in path[kind]["accuracy"])  # every point is the same network
    assert path["as_stored"]["accuracy"][0] == path["as_stored"]["accuracy"][-1] == endpoint


def test_the_experiment_writes_its_table_and_figure(tiny_pipeline, tmp_path):
    out = run_experiment_on_copy(tiny_pipeline, tmp_path, "modes", "networks=10")
    results = json.loads((out / "modes.json").read_text())
    assert results["chains"] == [0] and results["path"] is None  # one chain: no path between modes
    assert results["store_mean"] == results["chain_means"]  # the only chain's mean is the store's
    assert len(results["sgld"]["values"]) == 10 and results["apd"] is None  # not distilled under tmp_path
    assert results["sgld"]["min"] <= results["sgld"]["p05"] <= results["sgld"]["mean"] <= results["sgld"]["max"]
    assert "| mean of chain 0 |" in (out / "modes.md").read_text()
    store = json.loads((out.parent / "samples.json").read_text())["files"]
    assert results["provenance"]["store_files"] == store  # the store it read, by its manifest's digests
    assert (out / "modes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chains_means_over_aligned_samples_are_reported_when_the_pipeline_aligns(tiny_pipeline, tmp_path):
    out = run_experiment_on_copy(tiny_pipeline, tmp_path, "modes", "networks=10",
                                 overrides=('distill.align="permutation"',))
    results = json.loads((out / "modes.json").read_text())
    assert results["align"] == "permutation" and len(results["aligned_chain_means"]["accuracy"]) == 1
    assert "| mean of chain 0, samples aligned (permutation) |" in (out / "modes.md").read_text()


def test_on_two_chains_the_experiment_walks_between_their_means_and_judges_apds_networks(tiny_pipeline, tmp_path):
    """Two chains and a generator distilled from them: the path runs from the first chain's mean to the
    second's (as stored, aligned by weights and by activations), APD's networks are judged one by one beside
    SGLD's, and the figure draws both."""
    root, config = tiny_pipeline
    copy_samples_as_two_chains(root, tmp_path)
    args = ["--config", str(config), "--artifacts", str(tmp_path), "--quiet"]
    assert main(["distill", *args]) == 0
    assert main(["experiment", "modes", *args, "--option", "networks=10"]) == 0
    results = json.loads((tmp_path / "tiny" / "experiments" / "modes.json").read_text())
    path, means = results["path"], results["chain_means"]["accuracy"]
    assert results["chains"] == [0, 1] and path["t"] == list(PATH_POINTS)
    assert [path["as_stored"]["accuracy"][0], path["as_stored"]["accuracy"][-1]] == means
    assert all(len(path[kind]["accuracy"]) == len(PATH_POINTS) for kind in ("aligned", "activations"))
    apd = results["apd"]
    assert len(apd["values"]) == 10 and apd["min"] <= apd["mean"] <= apd["max"] <= 1
    assert (tmp_path / "tiny" / "experiments" / "modes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
