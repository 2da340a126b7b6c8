"""``apd experiment storage``: storage against quality, and how many SGLD samples each method replaces.

On one pipeline's SGLD samples: diagonal mixtures of k Gaussians (fit as ``apd evaluate`` fits its MoG, to
``mog_fit_samples`` samples evenly spaced over the store), subspace APD generators of several ranks and
generator widths (WGAN-GP on the whitened principal coordinates, ``steps`` generator steps, the last one
kept) and the peers ``apd sample`` trains (SGD, MC dropout, SWAG, the deep ensemble) or that fit in
seconds (the Laplace approximations), each judged over ``runs`` fresh draws; and the kept-samples
yardstick, k SGLD samples kept evenly spaced over the store (:mod:`apd.evaluation.yardstick`).

Storage is in SGLD samples' worth (stored numbers / D). Accuracy, NLL and mean BALD AUROC over the OOD
sets are reported as shares of SGLD's. The **break-even** number of each method (:func:`break_even`) is the
smallest k of evenly spaced kept samples whose value of a metric is at least as good as the method's:
"<k₁" when even the fewest kept samples are better, ">K" when the most are worse. It is a study that
compares settings, so everything is judged on validation images and the OOD *tuning* pool
(:func:`apd.pipeline.recipes.evaluation_inputs` with ``role="tuning"``), never on the test split or the
OOD sets ``apd evaluate`` reports. Outputs: ``artifacts/NAME/experiments/storage.{json,md,png}``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from apd.config import bounded
from apd.distillation.codec import WeightCodec
from apd.evaluation.protocol import EvaluationInputs, judge
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import (
    SCORES,
    Reference,
    kept_curve,
    reference_predictive,
    reference_sums,
    spread,
    summarise,
)
from apd.experiments.distillers import train_generator
from apd.experiments.outputs import run_study
from apd.methods import label
from apd.metrics import mean_of
from apd.nets import ParamSpec
from apd.pipeline.figures import figure_legend, new_figure, plot_growth, plot_kept_curve, save_figure, storage_axes
from apd.pipeline.finished_parts import FinishedParts, taken_or_made
from apd.pipeline.methods import METHODS, Sources, fit_mixture
from apd.pipeline.recipes import codec_for, evaluation_inputs, store_alignment, training_samples
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import require_input
from apd.pipeline.table_format import format_duration, format_number, format_sample_count, markdown_table
from apd.posteriors import APDGenerator, Posterior, SGLDSamples
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)

# The methods trained apart from SGLD (by `apd sample`'s baselines or `apd peers`), the study's peers.
PEERS = tuple(name.value for name, loader in METHODS.items() if loader.stage in ("baselines", "peers"))
Peer = Literal[PEERS]
# The metrics compared, headline first: whether higher is better, and their labels.
METRICS = {"mean_bald_auroc": True, "acc": True, "nll": False}
METRIC_LABELS = {"mean_bald_auroc": "mean BALD AUROC", "acc": "accuracy", "nll": "NLL"}


@dataclass
class StoragePlan:
    """What the study builds (``--option KEY=VALUE``, e.g. ``--option ranks=[5,10]``): mixtures of each of
    ``mog_components``; an APD generator for every rank of ``ranks`` and hidden sizes of ``widths``, trained
    for ``steps`` generator steps (or ``max_seconds``); the ``peers``; and ``kept_sizes`` kept samples."""

    mog_components: list[int] = bounded([1, 2, 5, 10, 20, 40, 60])
    ranks: list[int] = bounded([5, 10, 20])
    widths: list[list[int]] = bounded([[32, 32], [128, 128]])
    steps: int = bounded(1000, ge=1)
    max_seconds: float = bounded(600.0, gt=0)  # wall clock for training one generator
    peers: list[Peer] = bounded(list(PEERS))
    kept_sizes: list[int] = bounded([1, 2, 3, 5, 10, 20, 50, 100, 200])


def break_even(value: float | None, curve: list[tuple[int, float | None]], higher_is_better: bool) -> str | None:
    """The smallest k of ``curve`` (pairs (k, value of k kept samples)) whose value is at least as good as
    ``value``, as text: ``"k"``; ``"<k₁"`` when the fewest kept samples k₁ with a value are strictly better;
    ``">K"`` when none is as good, K the most. None when ``value`` or every value of the curve is undefined
    (BALD of one network)."""
    points = sorted((k, v) for k, v in curve if v is not None)
    if value is None or not points:
        return None
    sign = 1.0 if higher_is_better else -1.0
    for k, kept in points:
        if sign * kept >= sign * value:
            return f"<{k}" if k == points[0][0] and sign * kept > sign * value else str(k)
    return f">{points[-1][0]}"


def judge_runs(method: Posterior, members: int, inputs: EvaluationInputs, reference: Reference, runs: int,
               seed: int) -> dict:
    """Mean and std (ddof 0) over ``runs`` fresh draws of ``members`` members of accuracy, NLL, mean BALD
    AUROC and the yardstick's gaps to SGLD (:func:`apd.evaluation.yardstick.summarise`)."""
    generator = torch.Generator().manual_seed(seed)
    return spread([summarise(judge(method, inputs, members, generator, SCORES), reference) for _ in range(runs)])


def sgld_reference(ctx: RunContext, predictions: StoredPredictions, inputs: EvaluationInputs) -> tuple[dict, Reference]:
    """SGLD judged like every method (``sgld_samples`` members, ``runs`` draws), and the yardstick's
    reference from it: its per-set BALD and max_prob AUROC and NLL (means over the draws), and the predictive
    of up to ``yardstick_reference`` stored samples on the validation images and the OOD tuning pool; the
    stored samples' predictions from ``predictions`` (on ``inputs.stacked()``)."""
    e = ctx.cfg.evaluate
    generator = torch.Generator().manual_seed(ctx.seed("experiment", "storage", "SGLD"))
    sgld = SGLDSamples(predictions.store, ctx.device)
    draws = [judge(sgld, inputs, e.sgld_samples, generator, SCORES, predictions) for _ in range(e.runs)]
    auroc = {score: {name: float(np.mean([100.0 * d.detection[name][score]["auroc"] for d in draws]))
                     for name in inputs.ood} for score in SCORES}
    predictive, information, samples = reference_predictive(reference_sums(predictions, inputs, e.yardstick_reference))
    reference = Reference(auroc["bald"], auroc["max_prob"], float(np.mean([d.accuracy["nll"] for d in draws])),
                          predictive, information, samples)
    return spread([summarise(d, reference) for d in draws]), reference


# A method of the study: its name, its row's fields, and what builds it: the posterior, its members per draw
# and the fields known once it is built.
MethodToBuild = tuple[str, dict, Callable[[], tuple[Posterior, int, dict]]]


def apd_generators(ctx: RunContext, store: SampleStore, plan: StoragePlan) -> list[MethodToBuild]:
    """A subspace APD generator for each rank and width of ``plan``: the pipeline's distill section (its
    alignment included) at that rank and generator width, without a residual, trained for ``plan.steps``
    generator steps or ``plan.max_seconds`` (its row's ``steps``: those it took); the training samples are
    prepared, and each rank's codec fit, once for the generators built."""
    prepared = functools.cache(lambda: training_samples(ctx, store, ctx.cfg.distill))
    codecs: dict[int, WeightCodec] = {}

    def built(rank: int, width: list[int], name: str) -> tuple[Posterior, int, dict]:
        data, started = prepared(), time.perf_counter()
        d = dataclasses.replace(ctx.cfg.distill, generator="subspace", subspace_rank=rank, gen_hidden=width,
                                residual=dataclasses.replace(ctx.cfg.distill.residual, model="none"),
                                steps=plan.steps)
        if rank not in codecs:
            codecs[rank] = codec_for(ctx, data.fit, d)
        model, steps = train_generator(d, codecs[rank], store, ctx, started + plan.max_seconds, data)
        return APDGenerator(model, store.spec, name), ctx.cfg.evaluate.networks, {"steps": steps}

    return [(name, {"family": "apd", "rank": rank, "width": width}, functools.partial(built, rank, width, name))
            for rank in plan.ranks for width in plan.widths
            for name in [f"APD r={rank} width {'-'.join(map(str, width))}"]]


def methods(ctx: RunContext, store: SampleStore, plan: StoragePlan, stack: ExitStack) -> list[MethodToBuild]:
    """Every method of ``plan``, each built when asked: the mixtures, the APD generators, the peers."""
    e = ctx.cfg.evaluate
    sources = Sources(ctx, stack, store.spec)

    def mixture(k: int) -> tuple[Posterior, int, dict]:
        return fit_mixture(store, k, e.mog_fit_samples, ctx.seed("evaluate", "mog", k), ctx.device,
                           store_alignment(ctx, store)), e.networks, {}

    def peer(name: str) -> tuple[Posterior, int, dict]:
        loader = METHODS[name]
        require_input(ctx, loader.artifact(ctx.layout), loader.stage)
        method = loader.load(sources)
        return method, method.ensemble_size(loader.members(e)), {}

    return [*((f"MoG k={k}", {"family": "mog", "components": k}, functools.partial(mixture, k))
              for k in plan.mog_components),
            *apd_generators(ctx, store, plan),
            *((label(name), {"family": "peer", "method": name}, functools.partial(peer, name))
              for name in plan.peers)]


def with_shares(row: dict, sgld: dict, kept: list[dict]) -> dict:
    """``row`` with each metric of :data:`METRICS` as a share of SGLD's (``shares``) and its break-even
    number of kept samples (``break_even``) against the evenly spaced ``kept`` curve."""
    quality = row["quality"]
    value = {m: mean_of(quality[m]) for m in METRICS}
    shares = {m: None if value[m] is None or sgld[m] is None else value[m] / mean_of(sgld[m]) for m in METRICS}
    even = {m: [(r["k"], r["evenly_spaced"][m]) for r in kept] for m in METRICS}
    return {**row, "shares": shares, "break_even": {m: break_even(value[m], even[m], METRICS[m]) for m in METRICS}}


def study(ctx: RunContext, plan: StoragePlan, finished: FinishedParts | None = None) -> dict:
    """Build and judge every method of ``plan`` and the kept-samples curve; the results as JSON-able data. The
    curve and each method's row are kept in ``finished`` once made, and one found there (an interrupted run of
    the same study made it) is taken, its method not built: every part draws from seeds of its own."""
    e, started = ctx.cfg.evaluate, time.perf_counter()
    require_input(ctx, ctx.layout.samples, "sample")
    inputs = evaluation_inputs(ctx, role="tuning")
    with ExitStack() as stack:
        store = stack.enter_context(SampleStore.open(ctx.layout.samples,
                                                     expect_spec=ParamSpec.from_module(ctx.network())))
        predictions = StoredPredictions(store, inputs.stacked(ctx.device), ctx.device, progress=ctx.progress)
        sgld, reference = sgld_reference(ctx, predictions, inputs)
        generator = torch.Generator().manual_seed(ctx.seed("experiment", "storage", "kept"))
        kept = taken_or_made(finished, "storage: kept curve", lambda: kept_curve(
            predictions, plan.kept_sizes, inputs, reference, e.yardstick_subsets, generator))
        rows = [{"name": "SGLD", "family": "sgld", "seconds": None, "members": e.sgld_samples,
                 "parameters": len(store) * store.spec.numel, "in_sgld_samples": float(len(store)),
                 "quality": sgld}]

        def row_of(name: str, fields: dict, build: Callable[[], tuple[Posterior, int, dict]]) -> dict:
            t0 = time.perf_counter()
            method, members, built = build()
            seconds = time.perf_counter() - t0
            row = {"name": name, **fields, **built, "seconds": round(seconds, 2), "members": members,
                   "parameters": int(method.stored_parameters()),
                   "in_sgld_samples": round(method.storage_in_samples(), 3),
                   "quality": judge_runs(method, members, inputs, reference, e.runs,
                                         ctx.seed("experiment", "storage", name))}
            log.info("%s: storage %.3g samples, built in %.1f s, mean BALD AUROC %s", name, row["in_sgld_samples"],
                     seconds, row["quality"]["mean_bald_auroc"])
            return row

        rows += [taken_or_made(finished, f"storage: {name}", functools.partial(row_of, name, fields, build))
                 for name, fields, build in methods(ctx, store, plan, stack)]
        dim, size = store.spec.numel, len(store)
    kept = [{**r, "shares": {m: None if r["evenly_spaced"][m] is None else r["evenly_spaced"][m] / mean_of(sgld[m])
                             for m in METRICS}} for r in kept]
    return {"pipeline": ctx.cfg.name, "dataset": ctx.data.name, "dim": dim, "sgld_samples": size, "runs": e.runs,
            "networks": e.networks, "ood_sets": list(inputs.ood), "headline": "mean_bald_auroc",
            "judged_on": "validation images and the OOD tuning pool (never the test split or evaluate's OOD sets)",
            "plan": dataclasses.asdict(plan), "reference": {"bald_auroc": reference.bald_auroc,
                                                           "nll": reference.nll, "kl_samples": reference.samples},
            "kept": kept, "rows": [with_shares(row, sgld, kept) for row in rows],
            "seconds": round(time.perf_counter() - started, 2)}


def render_table(results: dict) -> str:
    """The Markdown of ``storage.md``: a note on the protocol, then one row per method and per kept set."""
    note = (f"# Storage against quality on {results['pipeline']}\n\nEach method judged over {results['runs']} "
            f"fresh draws ({results['networks']} networks each; SGLD {results['rows'][0]['members']} of its "
            f"{results['sgld_samples']:,} samples; peers as `apd evaluate` draws them); D = {results['dim']:,} "
            "weights; storage in SGLD samples' worth (stored numbers / D); accuracy, NLL and mean BALD AUROC "
            f"over the OOD tuning sets ({', '.join(results['ood_sets'])}) as % of SGLD's (NLL: lower is "
            "better); judged on validation images and the OOD tuning pool. **Replaces** = the break-even "
            "number of SGLD samples: the smallest k of evenly spaced kept samples at least as good on that "
            "metric (headline: mean BALD AUROC), '<k' worse than the fewest kept samples with a value, '>K' "
            "better than the most.\n\n")
    header = ["method", "storage", "parameters", "build time", *(f"{METRIC_LABELS[m]} % SGLD" for m in METRICS),
              *(f"replaces ({METRIC_LABELS[m]})" for m in METRICS)]

    def cells(row: dict, seconds: float | None, replaces: dict) -> list[str]:
        return [format_sample_count(row["in_sgld_samples"]), f"{row['parameters']:,}",
                "—" if seconds is None else format_duration(seconds),
                *(format_number(None if row["shares"][m] is None else 100 * row["shares"][m], 1) for m in METRICS),
                *(replaces.get(m) or "—" for m in METRICS)]

    dim = results["dim"]
    body = [[row["name"], *cells(row, row["seconds"], row["break_even"])] for row in results["rows"]]
    body += [[f"kept SGLD k={r['k']}", *cells({**r, "parameters": r["k"] * dim}, None, {})] for r in results["kept"]]
    return note + markdown_table(header, body) + "\n"


def draw_figure(results: dict, path: Path) -> None:
    """Accuracy, NLL and mean BALD AUROC as % of SGLD's against storage, on ``apd evaluate``'s storage axes
    (:func:`apd.pipeline.figures.storage_axes`): the kept-samples curve, MoG growth (tagged with k), APD
    points (a marker per width, tagged with the rank) and the peers; NLL on a log scale."""
    figure, axes = new_figure(1, len(METRICS), panel=(4.6, 3.8))
    rows = results["rows"]
    sgld = rows[0]["quality"]
    widths = list(dict.fromkeys(tuple(r["width"]) for r in rows if r["family"] == "apd"))
    for ax, metric in zip(axes[0], METRICS, strict=True):
        if sgld[metric] is None:
            continue
        plot_kept_curve(ax, results["kept"], metric, scale=100 / mean_of(sgld[metric]))
        mog = [r for r in rows if r["family"] == "mog" and r["shares"][metric] is not None]
        if mog:
            plot_growth(ax, [r["in_sgld_samples"] for r in mog], [100 * r["shares"][metric] for r in mog])
            for r in mog:
                ax.annotate(f"k={r['components']}", (r["in_sgld_samples"], 100 * r["shares"][metric]),
                            textcoords="offset points", xytext=(0, 5), ha="center", fontsize=6)
        for i, width in enumerate(widths):
            points = [r for r in rows if r["family"] == "apd" and tuple(r["width"]) == width
                      and r["shares"][metric] is not None]
            ax.plot([r["in_sgld_samples"] for r in points], [100 * r["shares"][metric] for r in points], "*^sD"[i % 4],
                    color=f"C{i}", markersize=9, markeredgecolor="black", linestyle="none",
                    label=f"APD, width {'-'.join(map(str, width))}")
            for r in points:
                ax.annotate(f"r={r['rank']}", (r["in_sgld_samples"], 100 * r["shares"][metric]),
                            textcoords="offset points", xytext=(4, -8), fontsize=6)
        for i, r in enumerate(r for r in rows if r["family"] == "peer"):
            if r["shares"][metric] is None:
                continue
            ax.plot([r["in_sgld_samples"]], [100 * r["shares"][metric]], "ovPXph<>"[i % 8], color=f"C{i + len(widths)}",
                    markersize=7, markeredgecolor="black", label=r["name"])
        storage_axes(ax, f"{METRIC_LABELS[metric]} (% of SGLD)", 100)
        if not METRICS[metric]:  # NLL: a few times SGLD's is common, so shares span decades
            ax.set_yscale("log")
        ax.set_title(METRIC_LABELS[metric] + (" (lower is better)" if not METRICS[metric] else ""), fontsize=9)
    figure_legend(figure)
    figure.suptitle(f"Storage against quality: {results['pipeline']} (validation and OOD tuning inputs)", fontsize=10)
    save_figure(figure, path)


def run_storage(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment storage``: run the study, write ``experiments/storage.{json,md,png}``, print the table."""
    return run_study(ctx, options, StoragePlan, study, "storage", render_table, draw_figure)
