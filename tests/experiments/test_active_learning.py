"""Active learning: the acquisition step, seeded random acquisition, and ``apd experiment active-learning``
on a tiny digits run (outputs, and a run stopped after round 1 then resumed equals an uninterrupted one)."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import pytest
import torch

import apd.experiments.active_learning as active
from apd.acquisition import acquire, acquisition_scores, balanced_subset, labels_to_reach
from apd.cli import main
from apd.config_load import load_config
from apd.errors import ConfigError
from apd.experiments.active_models import plan_from_options, trajectories
from apd.experiments.active_report import render_summary, render_table

CONFIG = """name = "tiny-active"
seed = 0
threads = 1
[data]
dataset = "digits"
train_size = 1000
val_size = 300
[net]
hidden = [16]
[distill]
lr = 1e-3
"""
OPTIONS = ["seeds=1", "rounds=2", "acquire=3", "pool_size=60", "test_size=60", "sgld_iterations=20",
           "sgld_burn_in=10", "sgld_thin=5", "apd_rank=2", "apd_steps=3", "apd_hidden=[8]", "apd_batch=8",
           "train_steps=10", "mc_passes=3", "workers=1"]


def run(root, stop_after_round: int | None = None, monkeypatch=None, workers: int = 1) -> int:
    config = root / "tiny.toml"
    config.write_text(CONFIG)
    if stop_after_round is not None:
        def stop(state, plan):
            if state["rounds_done"] == stop_after_round + 1:
                raise KeyboardInterrupt
        monkeypatch.setattr(active, "round_done", stop)
    args = ["experiment", "active-learning", "--config", str(config), "--artifacts", str(root), "--quiet"]
    options = [option if not option.startswith("workers=") else f"workers={workers}" for option in OPTIONS]
    return main(args + [arg for option in options for arg in ("--option", option)])


def outcome(root) -> tuple[list, dict]:
    """A finished study's curves and each run's labelled examples, in order."""
    results = json.loads((root / "tiny-active" / "experiments" / "active_learning.json").read_text())
    state = json.loads((root / "tiny-active" / "experiments" / "active_learning" / "state.json").read_text())
    return results["curves"], {name: run["labelled"] for name, run in state["runs"].items()}


def test_acquire_takes_the_best_scores_out_of_the_pool():
    pool = [10, 11, 12, 13, 14]
    picked, rest = acquire(pool, 2, torch.tensor([0.1, 0.9, 0.5, 0.9, 0.0]))
    assert picked == [11, 13]  # best first; of two equal scores the earlier pool point
    assert rest == [10, 12, 14]
    picked, rest = acquire(pool, 9, torch.tensor([0.1, 0.9, 0.5, 0.9, 0.0]))
    assert picked == [11, 13, 12, 10, 14] and rest == []
    with pytest.raises(ValueError):
        acquire(pool, 2, torch.zeros(4))


def test_random_acquisition_is_seeded():
    pool = list(range(100, 200))

    def draw(seed):
        return acquire(pool, 10, generator=torch.Generator().manual_seed(seed))

    picked, rest = draw(1)
    assert picked == draw(1)[0] and picked != draw(2)[0]
    assert len(set(picked)) == 10 and set(picked) | set(rest) == set(pool) and not set(picked) & set(rest)


def test_scores_are_the_papers():
    probs = torch.tensor([[[0.7, 0.2, 0.1], [0.2, 0.2, 0.6]],
                          [[0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]], dtype=torch.float64)  # 2 members, 2 inputs, 3 classes
    mean = probs.mean(0)
    assert torch.allclose(acquisition_scores("variation_ratio", probs), 1 - mean.amax(-1))
    entropy = -(mean * mean.log()).sum(-1)
    assert torch.allclose(acquisition_scores("entropy", probs), entropy)
    bald = acquisition_scores("bald", probs)
    assert bald[0] > 0 and bald[1] == pytest.approx(0.0, abs=1e-6)  # members agree on input 1
    with pytest.raises(ValueError):
        acquisition_scores("random", probs)


def test_initial_set_and_labels_to_reach():
    labels = torch.arange(10).repeat(5)
    first = balanced_subset(labels, 2, torch.Generator().manual_seed(0))
    assert torch.bincount(labels[first]).tolist() == [2] * 10
    assert first == balanced_subset(labels, 2, torch.Generator().manual_seed(0))
    assert labels_to_reach([20, 30, 40], [0.5, 0.91, 0.85], 0.9) == 30
    assert labels_to_reach([20, 30], [0.5, 0.6], 0.9) is None


def test_options_are_checked():
    plan = plan_from_options([])
    assert len(trajectories(plan)) == 4 + 4 + 4 + 2  # the deterministic net: entropy and random only
    for bad in (["models=['sgld', 'gp']"], ["models=['deterministic']", "acquisitions=['bald']"],
                ["sgld_iterations=10", "sgld_burn_in=10"], ["apd_rank=100"], ["rounds"]):
        with pytest.raises(ConfigError):
            plan_from_options(bad)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("active")
    assert run(root) == 0
    return root


def test_two_rounds_write_json_csv_and_figure(uninterrupted):
    out = uninterrupted / "tiny-active" / "experiments"
    results = json.loads((out / "active_learning.json").read_text())
    assert len(results["curves"]) == 14 and results["rounds_done"] == 3 and results["std_ddof"] == 0
    for curve in results["curves"]:
        assert curve["labelled"] == [20, 23, 26]
        assert all(0 <= a <= 1 for a in curve["test_accuracy"]["mean"])
    state = json.loads((out / "active_learning" / "state.json").read_text())
    random_picks = {name.split("/")[0]: run["acquired"] for name, run in state["runs"].items() if "/random/" in name}
    assert len({json.dumps(picks) for picks in random_picks.values()}) == 1  # one draw for every model
    for run_state in state["runs"].values():
        picked = [i for picks in run_state["acquired"] for i in picks]
        assert len(set(picked)) == len(picked) == 6 and not set(picked) & set(run_state["labelled"][:20])
    assert results["apd_storage"]["in_sgld_samples"] > 0
    # where it was made: one machine ran every round (it reads no sample store, so names none)
    [made_on] = results["provenance"]["machines"]
    assert made_on["from_round"] == 0 and made_on["machine"]["cores"] >= 1
    rows = list(csv.DictReader((out / "active_learning.csv").open()))
    assert len(rows) == 14 * 3 and {"model", "acquisition", "labelled", "test_accuracy_mean"} <= set(rows[0])
    assert (out / "active_learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Labels needed to reach 90 % test accuracy" in (out / "active_learning.md").read_text()
    table = render_table(results)  # the labels-to-target table of the report `apd docs` renders for "active-learning"
    assert table.count("\n| ") == 4 and "| deterministic |" in table
    assert table in (out / "active_learning.md").read_text()
    summary = render_summary(results)  # the whole report below its title, for a document's own section
    assert summary.startswith("1 seeds; 2 labelled") and "**Labels needed to reach 90 % test accuracy**" in summary
    assert table.strip() in summary and "**Test accuracy at 26 labels**" in summary and "\n## " not in summary


def test_resumed_run_equals_an_uninterrupted_one(uninterrupted, tmp_path, monkeypatch):
    assert run(tmp_path, stop_after_round=1, monkeypatch=monkeypatch) == 130
    state_file = tmp_path / "tiny-active" / "experiments" / "active_learning" / "state.json"
    assert json.loads(state_file.read_text())["rounds_done"] == 2
    assert not (tmp_path / "tiny-active" / "experiments" / "active_learning.json").exists()
    monkeypatch.undo()
    assert run(tmp_path) == 0
    assert outcome(tmp_path) == outcome(uninterrupted)


def test_models_trained_on_worker_processes_equal_those_trained_in_turn(uninterrupted, tmp_path):
    """Two worker processes (spawned, each model of a round on one of them, merged in a fixed order) give
    the curves and acquisitions of one process training the models in turn."""
    assert run(tmp_path, workers=2) == 0
    assert outcome(tmp_path) == outcome(uninterrupted)


def test_the_saved_state_is_kept_across_settings_no_model_reads(tmp_path):
    """Switching the offline distiller (its kind, rank, precision, steps, lr: the plan has its own) or SGLD's
    chains leaves a saved study resumable; a setting the models read (the GAN's z, SGLD's step, the data, the
    net) starts it afresh."""
    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG)
    plan = plan_from_options(OPTIONS)

    def key(*overrides: str) -> str:
        return active.state_key(SimpleNamespace(cfg=load_config(config, list(overrides))), plan)

    kept = key()
    assert key("distill.per_chain=true", "distill.subspace_rank=7", "distill.precision=int8",
               "distill.mean_at=float16", "distill.steps=9", "distill.lr=0.01", "distill.seeds=3", "sgld.chains=8",
               "sgld.iterations=5000") == kept
    for read in ("distill.z_dim=8", "distill.beta1=0.3", "distill.n_critic=2", "sgld.lr=0.5", "sgld.prior_var=0.5",
                 "data.val_size=200", "net.hidden=[8]", "seed=1"):
        assert key(read) != kept, read


def test_a_run_resumed_on_another_machine_names_both():
    first, second = {"cpu": "A", "cores": 2}, {"cpu": "B", "cores": 16}
    state: dict = {}
    for round_index, here in enumerate((first, first, second, second)):
        active.record_machine(state, here, round_index)
    assert state["machines"] == [{"machine": first, "from_round": 0}, {"machine": second, "from_round": 2}]
