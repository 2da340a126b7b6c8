"""A tiny digits pipeline shared by the stage tests: its config, a context for it, and its TOML."""

from __future__ import annotations

import json
from pathlib import Path

from apd.config_load import from_dict
from apd.pipeline.runtime import RunContext

TINY = {
    "name": "tiny",
    "data": {"dataset": "digits", "train_size": 1000, "val_size": 300, "ood": ["gaussian", "uniform"]},
    "net": {"hidden": [32]},
    "sgld": {"lr": 0.1, "prior_var": 0.1, "iterations": 2500, "burn_in": 500, "thin": 10, "eval_every": 500,
             "checkpoint_every": 1000},
    "baselines": {"epochs": 15, "lr": 0.1, "mc_passes": 20},
    "peers": {"ensemble_members": 2, "swag_lrs": [0.1, 0.5], "swag_epochs": 6, "swag_rank": 5, "swag_val_samples": 5},
    "distill": {"steps": 120, "eval_every": 40, "checkpoint_every": 40, "gen_hidden": [32], "critic_hidden": [32],
                "eval_networks": 20, "generator": "subspace", "subspace_rank": 8, "residual": {"model": "none"},
                "lr": 1e-3},
    "evaluate": {"runs": 2, "networks": 20, "sgld_samples": 20, "mc_passes": 20, "ood_size": 100,
                 "mog_components": [1, 3], "mog_fit_samples": 100, "mog_growth": True,
                 "stein_candidates": 50, "yardstick_sizes": [1, 2, 5], "yardstick_subsets": 200,
                 "yardstick_reference": 100, "threads": 1,
                 "scores": ["variation_ratio", "bald", "entropy", "max_prob"]},
}


def tiny_context(root: Path, **overrides: dict) -> RunContext:
    """A context for :data:`TINY` with some sections' fields replaced."""
    raw = json.loads(json.dumps(TINY))
    for section, values in overrides.items():
        raw[section] = {**raw.get(section, {}), **values}
    return RunContext(cfg=from_dict(raw), artifacts_root=root, quiet=True)


def toml(data: dict) -> str:
    """``data`` (two levels of tables at most) as TOML text."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, values in data.items():
        if isinstance(values, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items() if not isinstance(v, dict)]
            for sub, table in values.items():
                if isinstance(table, dict):
                    lines.append(f"[{section}.{sub}]")
                    lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def copy_samples(root: Path, target: Path) -> None:
    """The tiny pipeline's sample store (the joined store, the shards it reads and its manifest), copied under
    ``target`` for a stage to run on."""
    (target / "tiny").mkdir(parents=True, exist_ok=True)
    manifest = root / "tiny" / "samples.json"
    for name in (*json.loads(manifest.read_text())["files"], manifest.name):
        (target / "tiny" / name).write_bytes((root / "tiny" / name).read_bytes())


def copy_samples_as_two_chains(root: Path, target: Path) -> None:
    """:func:`copy_samples`, with the first half of the samples relabelled chain 0 and the rest chain 1 (the
    manifest's digest updated), for stages that treat chains apart."""
    import h5py
    import numpy as np

    from apd.pipeline.manifests import file_digest

    copy_samples(root, target)
    store, manifest = target / "tiny" / "samples.h5", target / "tiny" / "samples.json"
    with h5py.File(store, "r+") as h5:
        chain = h5["chain"]
        chain[...] = (np.arange(len(chain)) >= len(chain) // 2).astype(chain.dtype)
    record = json.loads(manifest.read_text())  # the shards the joined store writes through changed too
    record["files"] = {name: file_digest(target / "tiny" / name) for name in record["files"]}
    manifest.write_text(json.dumps(record))


def run_experiment_on_copy(tiny_pipeline: tuple[Path, Path], target: Path, name: str, *options: str,
                           overrides: tuple[str, ...] = ()) -> Path:
    """``apd experiment NAME --option … --set …`` on a copy of the tiny pipeline's samples under ``target``
    (so that nothing else the pipeline built is there); checks that it exits 0 and returns its experiments
    folder."""
    from apd.cli import main

    root, config = tiny_pipeline
    copy_samples(root, target)
    args = ["experiment", name, "--config", str(config), "--artifacts", str(target), "--quiet"]
    assert main([*args, *(arg for option in options for arg in ("--option", option)),
                 *(arg for value in overrides for arg in ("--set", value))]) == 0
    return target / "tiny" / "experiments"


def without_timings(value):
    """Results with every timing (``timing``, keys naming seconds) and the study's ``provenance`` left out: they
    differ between any two runs of the same work."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items()
                if k not in ("timing", "provenance") and "seconds" not in k}
    return [without_timings(v) for v in value] if isinstance(value, list) else value


def counted_predictions(monkeypatch, room: int | None = None) -> list[int]:
    """The number of networks each prediction of the stored samples' predictions covers
    (:class:`~apd.evaluation.stored.StoredPredictions`), from now on; with ``room``, the predictions set up
    from now on keep at most ``room`` bytes."""
    from apd.evaluation import stored as stored_module
    from apd.nets import predict_probs

    predicted: list[int] = []

    def counted(spec, weights, x):
        predicted.append(len(weights))
        return predict_probs(spec, weights, x)

    monkeypatch.setattr(stored_module, "predict_probs", counted)
    if room is not None:
        monkeypatch.setattr(stored_module, "available_bytes", lambda device: room / stored_module.KEPT_SHARE)
    return predicted


def one_storage(root: Path, role: str = "evaluate") -> int:
    """The bytes of the tiny store's samples' predictions (float32) on the inputs of ``role`` (``"tuning"``:
    the studies')."""
    from apd.pipeline.recipes import evaluation_inputs
    from apd.samplers.store import SampleStore

    inputs = evaluation_inputs(tiny_context(root), role=role).stacked("cpu")
    with SampleStore.open(root / "tiny" / "samples.h5") as store:
        return len(store) * 4 * len(inputs) * store.spec.layer_sizes[-1]
