"""``apd experiment modes``: do SGLD's chains sit in separate modes, and do APD's networks fall between them?

A distiller built around the mean of all stored samples (the subspace codec) assumes the samples share
one mode. Measured here on validation images only, one network at a time (accuracy and NLL of p(y|x, θ)):

- θ = the mean of all stored samples, and each chain's own mean μ_m, also over the chain's samples aligned
  as ``apd distill`` aligns them when the pipeline does (``[distill] align``; a chain that visits permuted
  copies of its mode has a poor plain mean and a good aligned one);
- the straight path θ(t) = (1 − t)·μ_a + t·μ_b between the first two chains' means, t ∈ {0, ¼, ½, ¾, 1},
  as stored and with μ_b's hidden units permuted to μ_a's order by weight matching
  (:func:`apd.distillation.alignment.match`) or by activation matching on training images
  (:func:`apd.distillation.alignment.match_activations`): a drop in the middle that no permutation
  removes is a barrier between modes, not a relabelling of one mode;
- the accuracy of single networks: ``networks`` SGLD samples evenly spaced over the store, and as many
  of APD's generated networks (when the pipeline is distilled).

Outputs: ``artifacts/NAME/experiments/modes.{json,md,png}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from apd.config import bounded
from apd.distillation.alignment import match, match_activations, permute
from apd.distillation.generator import load_generator
from apd.distillation.training import evenly_spaced
from apd.experiments.outputs import run_study
from apd.io import read_json
from apd.metrics import accuracy, nll
from apd.nets import ParamSpec, predict_probs
from apd.pipeline.figures import new_figure, save_figure
from apd.pipeline.layout import manifest_of
from apd.pipeline.recipes import aligned_chain_means, training_images
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import require_input
from apd.pipeline.tables import format_number, markdown_table
from apd.posteriors.modes import chain_means
from apd.samplers.store import SampleStore

PATH_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)
MATCH_INPUTS = 5000  # training images the activation matching compares units on
PATH_KINDS = (("as_stored", "as stored"), ("aligned", "after weight matching"),
              ("activations", "after activation matching"))


@dataclass
class ModesPlan:
    """``--option KEY=VALUE``: how many single networks of SGLD and of APD are scored."""

    networks: int = bounded(100, ge=1)
    seed: int = bounded(0, ge=0)  # APD's draws


def single_networks(spec: ParamSpec, weights: Tensor, x: Tensor, y: Tensor) -> dict[str, list[float]]:
    """Per network of ``weights`` [K, D]: :func:`~apd.metrics.accuracy` and :func:`~apd.metrics.nll` (nats)
    of its own p(y|x, θ) on (x, y)."""
    probs = predict_probs(spec, weights, x)
    return {"accuracy": [accuracy(p, y) for p in probs], "nll": [nll(p, y) for p in probs]}


def _summary(values: list[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {"mean": float(array.mean()), "min": float(array.min()), "p05": float(np.quantile(array, 0.05)),
            "max": float(array.max())}


def mode_path(spec: ParamSpec, start: Tensor, end: Tensor, x: Tensor, y: Tensor, x_match: Tensor) -> dict:
    """Single networks on θ(t) = (1 − t)·start + t·end for t in :data:`PATH_POINTS` on (x, y): ``end`` as
    given (``as_stored``), with its hidden units matched to ``start``'s by weight matching (``aligned``) and by
    activation matching on the inputs ``x_match`` (``activations``); the distance ‖end − start‖ each way."""
    ends = {"as_stored": end,
            "aligned": permute(end.cpu(), spec, match(end[None].cpu(), start.cpu(), spec)[0]),
            "activations": permute(end.cpu(), spec, match_activations(end.cpu(), start.cpu(), spec, x_match.cpu()))}
    ends = {kind: theta.to(start.device) for kind, theta in ends.items()}

    def path(to: Tensor) -> dict[str, list[float]]:
        return single_networks(spec, torch.stack([(1 - t) * start + t * to for t in PATH_POINTS]), x, y)

    return {"t": list(PATH_POINTS), **{kind: path(theta) for kind, theta in ends.items()},
            "distance": {kind: float((theta - start).norm()) for kind, theta in ends.items()}}


def measure(ctx: RunContext, plan: ModesPlan) -> dict:
    """The measurements of the module docstring, as JSON-able data."""
    started = time.perf_counter()
    spec = ParamSpec.from_module(ctx.network())
    x, y = ctx.data.x_val.to(ctx.device), ctx.data.y_val.to(ctx.device)
    require_input(ctx, ctx.layout.samples, "sample")
    with SampleStore.open(ctx.layout.samples, expect_spec=spec) as store:
        means, shares = chain_means(store)
        aligned = aligned_chain_means(ctx, store)
        chains = [int(c) for c in np.unique(store.chains)]
        overall = (shares[:, None] * means).sum(0)  # the mean of all rows
        sgld = single_networks(spec, store.read(evenly_spaced(len(store), plan.networks)).to(ctx.device), x, y)
    means = means.to(ctx.device)
    results = {"pipeline": ctx.cfg.name, "dataset": ctx.data.name, "validation_images": len(y), "chains": chains,
               "store_mean": single_networks(spec, overall[None].to(ctx.device), x, y),
               "chain_means": single_networks(spec, means, x, y), "path": None, "align": ctx.cfg.distill.align,
               "aligned_chain_means": None if aligned is None else single_networks(spec, aligned.to(ctx.device), x, y),
               "sgld": {**_summary(sgld["accuracy"]), "values": sgld["accuracy"]}, "apd": None}
    if len(chains) >= 2:
        x_match = training_images(ctx, MATCH_INPUTS, "experiment", "modes", "match")
        results["path"] = mode_path(spec, means[0], means[1], x, y, x_match)
    if manifest_of(ctx.layout.generator).is_file():
        require_input(ctx, ctx.layout.generator, "distill")
        model, _ = load_generator(ctx.layout.generator, read_json(manifest_of(ctx.layout.generator)),
                                  spec, ctx.device)
        weights = model.sample_weights(plan.networks, torch.Generator(ctx.device).manual_seed(plan.seed))
        apd = single_networks(spec, weights, x, y)
        results["apd"] = {**_summary(apd["accuracy"]), "values": apd["accuracy"]}
    results["seconds"] = round(time.perf_counter() - started, 2)
    return results


def render_table(results: dict) -> str:
    """The Markdown of ``modes.md``: single networks' validation accuracy and NLL."""
    rows = [["mean of all stored samples", format_number(results["store_mean"]["accuracy"][0], 4),
             format_number(results["store_mean"]["nll"][0], 3)]]
    rows += [[f"mean of chain {c}", format_number(acc, 4), format_number(loss, 3)] for c, acc, loss in
             zip(results["chains"], results["chain_means"]["accuracy"], results["chain_means"]["nll"], strict=True)]
    aligned = results.get("aligned_chain_means")
    if aligned:
        rows += [[f"mean of chain {c}, samples aligned ({results['align']})", format_number(acc, 4),
                  format_number(loss, 3)]
                 for c, acc, loss in zip(results["chains"], aligned["accuracy"], aligned["nll"], strict=True)]
    path = results["path"]
    if path:
        a, b = results["chains"][:2]
        for kind, label in PATH_KINDS:
            for t, acc, loss in zip(path["t"], path[kind]["accuracy"], path[kind]["nll"], strict=True):
                if 0 < t < 1:
                    rows.append([f"(1 − t)·μ_{a} + t·μ_{b}, t = {t:g}, {label}",
                                 format_number(acc, 4), format_number(loss, 3)])
    for name, label in (("sgld", "SGLD samples"), ("apd", "APD's networks")):
        s = results[name]
        if s:
            rows.append([f"{label} ({len(s['values'])}): mean (min, 5th percentile)",
                         f"{format_number(s['mean'], 4)} ({format_number(s['min'], 4)}, {format_number(s['p05'], 4)})",
                         ""])
    note = (f"# Modes on {results['pipeline']}\n\nOne network at a time on {results['validation_images']:,} "
            f"validation images (accuracy; NLL in nats).")
    if path:
        note += (" Distance between the first two chains' means: " + ", ".join(
            f"{path['distance'][kind]:.1f} {label}" for kind, label in PATH_KINDS) + ".")
    return note + "\n\n" + markdown_table(["network", "accuracy", "NLL"], rows) + "\n"


def draw_figure(results: dict, path) -> None:
    """Accuracy along the path between two chains' means; single networks' accuracy, SGLD against APD."""
    figure, axes = new_figure(1, 2, panel=(3.8, 3.0))
    left, right = axes[0]
    if results["path"]:
        a, b = results["chains"][:2]
        for kind, label in PATH_KINDS:
            left.plot(results["path"]["t"], results["path"][kind]["accuracy"], "o-", label=label)
        left.axhline(results["sgld"]["mean"], color="grey", linestyle="--", label="SGLD sample, mean")
        left.set(xlabel=f"t: (1 − t)·μ_{a} + t·μ_{b}", ylabel="validation accuracy", title="between two chains' means")
        left.legend(fontsize=7)
    bins = np.linspace(min(results["sgld"]["min"], (results["apd"] or results["sgld"])["min"]), 1.0, 30)
    for name, label in (("sgld", "SGLD samples"), ("apd", "APD's networks")):
        if results[name]:
            right.hist(results[name]["values"], bins=bins, alpha=0.6, label=label)
    right.set(xlabel="validation accuracy of one network", ylabel="networks", title="single networks")
    right.legend(fontsize=7)
    save_figure(figure, path)


def run_modes(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment modes``: measure, write ``experiments/modes.{json,md,png}``, print the table."""
    return run_study(ctx, options, ModesPlan, measure, "modes", render_table, draw_figure)
