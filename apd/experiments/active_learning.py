"""``apd experiment active-learning``: pool-based active learning with SGLD, APD, MC dropout and a
deterministic net (the protocol of Gal, Islam & Ghahramani, ICML 2017, as Wang et al., ICML 2018 used it).

Per seed, ``initial_per_class`` labelled examples of each class are drawn from the training split; the
rest of it (or a seeded subset of ``pool_size`` points) is the unlabelled pool. Each round every model
is retrained from scratch on its labelled set, its test (and validation) accuracy is recorded, and it
scores the pool and acquires the ``acquire`` best points (:mod:`apd.acquisition`: BALD, predictive
entropy, the variation ratio 1 − max p̄, or random). The models and their training are those of
:mod:`apd.experiments.active_models` (SGLD, online APD, MC dropout, a deterministic net); the outputs are
written by :mod:`apd.experiments.active_report`; this module runs the rounds, keeps the state and sums up.

The members of one model and seed (every acquisition, every chain) train side by side as one batched
network, each from its own seeded initialisation: a member's result depends on the seed, the round and
the acquisitions run beside it, not on the other models or seeds. Random acquisition draws the same
points for every model of a seed.

After every round the state (labelled sets and accuracies) goes to
``artifacts/NAME/experiments/active_learning/state.json``; a killed run resumes at the last finished
round and ends with exactly the results of an uninterrupted one. Outputs, under
``artifacts/NAME/experiments/``: ``active_learning.json`` (every curve, per seed and mean ± std over seeds
with ddof 0, labels needed to reach ``target_accuracy``, timings, APD's storage), ``active_learning.csv``,
``active_learning.md`` and ``active_learning.png``. Every random choice draws from a named stream
``ctx.seed("experiment", "active-learning", …)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from apd.acquisition import acquire, acquisition_scores, balanced_subset, labels_to_reach
from apd.config import PipelineConfig
from apd.distillation.codec import storage_in_samples
from apd.errors import ArtifactError, ConfigError
from apd.experiments.active_models import (
    ActivePlan,
    BatchTimes,
    fit_models,
    plan_from_options,
    settings_read,
    trajectories,
)
from apd.experiments.active_report import draw_figure, render_markdown, write_csv
from apd.io import read_json, write_json_atomic, write_text_atomic, written_together
from apd.metrics import accuracy
from apd.nets import ParamSpec
from apd.pipeline.runtime import RunContext, machine

log = logging.getLogger(__name__)

STATE_VERSION = 1
MODEL_COST = {"apd": 0, "sgld": 1, "mcdropout": 2, "deterministic": 3}  # heaviest first, to balance workers


def stream(ctx: RunContext, *names: str | int) -> int:
    """The seed of this experiment's named random stream ``names`` (:mod:`apd.pipeline.seeds`)."""
    return ctx.seed("experiment", "active-learning", *names)


# ------------------------------------------------------------------------------------------ the protocol


@dataclass
class SeedSetup:
    """A seed's initial labelled set and pool candidates (training-split indices)."""

    initial: list[int]
    candidates: list[int]


def seed_setup(ctx: RunContext, plan: ActivePlan, seed: int) -> SeedSetup:
    """``initial_per_class`` examples per class (seeded), and the rest of the training split, or a seeded
    subset of ``pool_size`` of it, as the pool."""
    y = ctx.data.y_train
    rng = torch.Generator().manual_seed(stream(ctx, "initial", seed))
    try:
        initial = balanced_subset(y, plan.initial_per_class, rng)
    except ValueError as exc:
        raise ConfigError(f"--option initial_per_class: {exc}") from None
    taken = set(initial)
    rest = [i for i in range(len(y)) if i not in taken]
    if plan.pool_size and plan.pool_size < len(rest):
        rng = torch.Generator().manual_seed(stream(ctx, "pool", seed))
        rest = sorted(rest[i] for i in torch.randperm(len(rest), generator=rng)[:plan.pool_size].tolist())
    if plan.rounds * plan.acquire > len(rest):
        raise ConfigError(f"--option rounds/acquire: {plan.rounds} rounds of {plan.acquire} need "
                          f"{plan.rounds * plan.acquire} pool points; the pool has {len(rest)}")
    return SeedSetup(initial, rest)


def test_rows(ctx: RunContext, plan: ActivePlan) -> Tensor:
    """The test images scored: all, or a fixed seeded subset of ``test_size`` (sorted)."""
    n = len(ctx.data.y_test)
    if not plan.test_size or plan.test_size >= n:
        return torch.arange(n)
    rng = torch.Generator().manual_seed(stream(ctx, "test"))
    return torch.randperm(n, generator=rng)[:plan.test_size].sort().values


def state_key(ctx: RunContext, plan: ActivePlan) -> str:
    """What the state depends on: the pipeline's settings the models read (:func:`settings_read`) and the
    plan."""
    settings = {k: v for k, v in dataclasses.asdict(plan).items() if k != "workers"}  # same results either way
    text = json.dumps({"config": settings_read(ctx, plan), "plan": settings, "version": STATE_VERSION},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_path(ctx: RunContext) -> Path:
    return ctx.layout.experiments / "active_learning" / "state.json"


def new_state(ctx: RunContext, plan: ActivePlan, key: str) -> dict:
    runs = {}
    for seed in range(plan.seeds):
        setup = seed_setup(ctx, plan, seed)
        for model, acquisition in trajectories(plan):
            runs[run_name(model, acquisition, seed)] = {
                "model": model, "acquisition": acquisition, "seed": seed, "labelled": list(setup.initial),
                "acquired": [], "labelled_counts": [], "test_accuracy": [], "val_accuracy": []}
    return {"key": key, "rounds_done": 0, "runs": runs, "batches": [], "seconds": 0.0, "apd_stored": None}


def run_name(model: str, acquisition: str, seed: int) -> str:
    return f"{model}/{acquisition}/{seed}"


def load_state(ctx: RunContext, plan: ActivePlan) -> dict:
    """The saved state of this config and plan, or a fresh one (``--force``, none, or another config's)."""
    key, path = state_key(ctx, plan), state_path(ctx)
    if path.is_file() and not ctx.force:
        try:
            state = read_json(path)
        except ArtifactError as exc:
            log.warning("ignoring %s", exc)
        else:
            if state.get("key") == key:
                if state["rounds_done"]:
                    log.info("resuming active learning after round %d of %d", state["rounds_done"] - 1,
                             plan.rounds)
                return state
            log.info("%s is from another config or plan; starting afresh", path)
    return new_state(ctx, plan, key)


def run_batch(ctx: RunContext, plan: ActivePlan, round_index: int, seed: int, model: str,
              runs: list[dict]) -> tuple[list[dict], dict, int | None]:
    """One model's trajectories of one seed in one round: train on each distinct labelled set (at round 0
    the acquisitions share theirs), record test and validation accuracy and, before the last round,
    acquire. Returns the updated runs, the batch's timings and APD's stored numbers (else None)."""
    wall, cpu = time.perf_counter(), time.process_time()
    data, device = ctx.data, ctx.device
    rows = test_rows(ctx, plan)
    x_test, y_test = data.x_test[rows].to(device), data.y_test[rows].to(device)
    x_val, y_val = data.x_val.to(device), data.y_val.to(device)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    n_test, n_val = len(y_test), len(y_val)
    acquiring = round_index < plan.rounds
    candidates = seed_setup(ctx, plan, seed).candidates
    keys = [tuple(run["labelled"]) for run in runs]
    unique = list(dict.fromkeys(keys))
    labelled = torch.tensor(unique, device=device)
    times = BatchTimes()
    batch_seed = stream(ctx, model, seed, round_index)
    fitted = fit_models(ctx, plan, model, x_train[labelled], y_train[labelled], batch_seed, times)
    scoring = time.perf_counter()
    eval_rng = torch.Generator(device=device).manual_seed(stream(ctx, model, seed, round_index, "eval"))
    stored = None
    for key, fit in zip(unique, fitted, strict=True):
        group = [run for run, run_key in zip(runs, keys, strict=True) if run_key == key]
        scored = acquiring and any(run["acquisition"] != "random" for run in group)
        taken = set(key)
        pool = [i for i in candidates if i not in taken]
        probs = fit.probs(torch.cat([x_test, x_val] + ([x_train[pool]] if scored else [])), eval_rng)
        test_accuracy = accuracy(probs[:, :n_test].mean(0), y_test)
        val_accuracy = accuracy(probs[:, n_test:n_test + n_val].mean(0), y_val)
        stored = fit.stored or stored
        for run in group:
            run["labelled_counts"].append(len(run["labelled"]))
            run["test_accuracy"].append(test_accuracy)
            run["val_accuracy"].append(val_accuracy)
            if not acquiring:
                continue
            if run["acquisition"] == "random":  # the same draw for every model of the seed
                rng = torch.Generator().manual_seed(stream(ctx, "random", seed, round_index))
                picked, _ = acquire(pool, plan.acquire, generator=rng)
            else:
                scores = acquisition_scores(run["acquisition"], probs[:, n_test + n_val:])
                picked, _ = acquire(pool, plan.acquire, scores)
            run["acquired"].append(picked)
            run["labelled"] = run["labelled"] + picked
    batch = {"round": round_index, "seed": seed, "model": model, "trajectories": len(runs),
             "trained": len(unique), "labelled": len(keys[0]), "seconds": round(time.perf_counter() - wall, 3),
             "cpu_seconds": round(time.process_time() - cpu, 3), "sgld_seconds": round(times.sgld, 3),
             "gan_seconds": round(times.gan, 3), "train_seconds": round(times.train, 3),
             "score_seconds": round(time.perf_counter() - scoring, 3)}
    return runs, batch, stored


_WORKER: dict = {}


def _start_worker(cfg: PipelineConfig, data_dir: str | None, device_name: str | None) -> None:
    torch.set_num_threads(cfg.threads or 1)
    _WORKER["ctx"] = RunContext(cfg=cfg, data_dir=data_dir, device_name=device_name, quiet=True)


def _run_in_worker(plan: ActivePlan, round_index: int, seed: int, model: str,
                   runs: list[dict]) -> tuple[list[dict], dict, int | None]:
    return run_batch(_WORKER["ctx"], plan, round_index, seed, model, runs)



def run_round(ctx: RunContext, plan: ActivePlan, state: dict, round_index: int,
              pool: ProcessPoolExecutor | None = None, after_batch: Callable[[str], None] | None = None) -> None:
    """Every model's batch of every seed for one round, in this process or on ``pool``'s workers (the
    results are the same); the state is updated in place."""
    tasks = sorted(((seed, model) for seed in range(plan.seeds) for model in plan.models),
                   key=lambda task: (MODEL_COST[task[1]], task[0]))

    def runs_of(seed: int, model: str) -> list[dict]:
        return [state["runs"][run_name(m, a, seed)] for m, a in trajectories(plan) if m == model]

    def merge(seed: int, model: str, result: tuple[list[dict], dict, int | None]) -> None:
        runs, batch, stored = result
        for run in runs:
            state["runs"][run_name(run["model"], run["acquisition"], seed)] = run
        state["batches"].append(batch)
        if stored is not None:
            state["apd_stored"] = stored
        if after_batch is not None:
            after_batch(model)

    if pool is None:
        for seed, model in tasks:
            merge(seed, model, run_batch(ctx, plan, round_index, seed, model, runs_of(seed, model)))
        return
    futures = {pool.submit(_run_in_worker, plan, round_index, seed, model, runs_of(seed, model)): (seed, model)
               for seed, model in tasks}
    results = {}
    for future in as_completed(futures):
        results[futures[future]] = future.result()
        if after_batch is not None:
            after_batch(futures[future][1])
    for seed, model in tasks:  # merged in a fixed order, so the state's batch list does not depend on timing
        merge(seed, model, results[(seed, model)])


def run_active_learning(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment active-learning``: run (or resume) the protocol, then write the outputs."""
    plan = plan_from_options(options)
    if not plan.workers:
        plan = dataclasses.replace(plan, workers=min(os.cpu_count() or 1, plan.seeds * len(plan.models)))
    state = load_state(ctx, plan)
    path = state_path(ctx)
    per_round = plan.seeds * len(plan.models)
    bar = ctx.progress(total=(plan.rounds + 1) * per_round, initial=state["rounds_done"] * per_round,
                       desc="active learning", unit="model")
    pool = None
    if plan.workers > 1 and state["rounds_done"] <= plan.rounds:
        ctx.data  # noqa: B018 (load, and fail on missing data, before starting workers)
        pool = ProcessPoolExecutor(plan.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker, initargs=(ctx.cfg, ctx.data_dir, ctx.device_name))
    try:
        with bar:
            for round_index in range(state["rounds_done"], plan.rounds + 1):
                started = time.perf_counter()

                def advance(model: str, r: int = round_index) -> None:
                    bar.update()
                    bar.set_description(f"active learning, round {r}/{plan.rounds} ({model})")

                run_round(ctx, plan, state, round_index, pool, advance)
                record_machine(state, machine(ctx.device), round_index)
                state["rounds_done"] = round_index + 1
                state["seconds"] = round(state["seconds"] + time.perf_counter() - started, 3)
                write_json_atomic(path, state)
                round_done(state, plan)
                last = {name: run["test_accuracy"][-1] for name, run in state["runs"].items()}
                ctx.show(bar, f"active learning round {round_index}/{plan.rounds}",
                         labels=next(iter(state["runs"].values()))["labelled_counts"][-1],
                         **{m: f"{np.mean([v for k, v in last.items() if k.startswith(m + '/')]):.3f}"
                            for m in plan.models})
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    results = summarise(ctx, plan, state)
    write_outputs(ctx, results)
    return results


def round_done(state: dict, plan: ActivePlan) -> None:
    """Called after each round's state is saved (a hook for tests that stop a run there)."""


# ------------------------------------------------------------------------------------------- results


def default_target(ctx: RunContext, plan: ActivePlan) -> float:
    return plan.target_accuracy or (0.9 if ctx.cfg.data.dataset == "digits" else 0.8)


def record_machine(state: dict, here: dict, round_index: int) -> None:
    """Note in ``state`` the machine that ran round ``round_index`` where it is not the one that ran the round
    before (a run resumed elsewhere): the study's provenance, ``[{"machine": …, "from_round": k}, …]``."""
    machines = state.setdefault("machines", [])
    if not machines or machines[-1]["machine"] != here:
        machines.append({"machine": here, "from_round": round_index})


def summarise(ctx: RunContext, plan: ActivePlan, state: dict) -> dict:
    """Curves per model × acquisition (per seed, mean and std over seeds with ddof 0), labels needed to
    reach the target accuracy, timings per round and APD's storage."""
    target = default_target(ctx, plan)
    dim = ParamSpec.from_module(ctx.network()).numel
    curves = []
    for model, acquisition in trajectories(plan):
        runs = [state["runs"][run_name(model, acquisition, seed)] for seed in range(plan.seeds)]
        test = np.array([run["test_accuracy"] for run in runs])
        val = np.array([run["val_accuracy"] for run in runs])
        reach = [labels_to_reach(run["labelled_counts"], run["test_accuracy"], target) for run in runs]
        reached = [r for r in reach if r is not None]
        curves.append({
            "model": model, "acquisition": acquisition, "labelled": runs[0]["labelled_counts"],
            "test_accuracy": {"mean": test.mean(0).tolist(), "std": test.std(0, ddof=0).tolist(),
                              "per_seed": test.tolist()},
            "val_accuracy": {"mean": val.mean(0).tolist(), "std": val.std(0, ddof=0).tolist(),
                             "per_seed": val.tolist()},
            "labels_to_target": {"per_seed": reach, "reached": len(reached),
                                 "mean": float(np.mean(reached)) if reached else None,
                                 "std": float(np.std(reached, ddof=0)) if reached else None}})
    timing = {}
    for model in plan.models:
        batches = [b for b in state["batches"] if b["model"] == model]
        if not batches:
            continue
        per_run = {key: float(np.mean([b[key] / b["trajectories"] for b in batches]))
                   for key in ("seconds", "sgld_seconds", "gan_seconds", "train_seconds", "score_seconds")}
        timing[model] = {key: round(value, 4) for key, value in per_run.items()}
    stored = state.get("apd_stored")
    storage = None if stored is None else {
        "parameters": stored, "in_sgld_samples": round(storage_in_samples(stored, dim), 3),
        "codec_parameters": dim * (plan.apd_rank + 1) + plan.apd_rank,
        "generator_parameters": stored - (dim * (plan.apd_rank + 1) + plan.apd_rank),
        "sgld_ensemble_samples": plan.ensemble_size}
    return {"pipeline": ctx.cfg.name, "dataset": ctx.data.name, "dim": dim, "plan": dataclasses.asdict(plan),
            "target_accuracy": target, "std_ddof": 0, "rounds_done": state["rounds_done"],
            "pool_size": len(seed_setup(ctx, plan, 0).candidates), "test_size": len(test_rows(ctx, plan)),
            "sgld": {"lr": plan.sgld_lr or ctx.cfg.sgld.lr, "prior_var": plan.prior_var or ctx.cfg.sgld.prior_var},
            "curves": curves, "seconds_per_round": timing, "apd_storage": storage,
            "seconds": state["seconds"],
            "cpu_seconds": round(sum(b["cpu_seconds"] for b in state["batches"]), 3),
            "provenance": {"machines": state.get("machines", [])}}


def write_outputs(ctx: RunContext, results: dict) -> None:
    """``experiments/active_learning.{json,csv,md,png}`` (:mod:`apd.experiments.active_report`), the four
    replaced together once all are written; prints the Markdown (not with ``--quiet``)."""
    out = ctx.layout.experiments
    files = [out / f"active_learning.{suffix}" for suffix in ("json", "csv", "md", "png")]
    out.mkdir(parents=True, exist_ok=True)
    with written_together(files) as built:
        write_json_atomic(built[files[0]], results)
        write_csv(built[files[1]], results)
        markdown = render_markdown(results)
        write_text_atomic(built[files[2]], markdown)
        draw_figure(results, built[files[3]])
    if not ctx.quiet:
        print(markdown)
