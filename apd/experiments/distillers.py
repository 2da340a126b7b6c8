"""``apd experiment distillers``: how small and fast can a distilled posterior be and still match SGLD?

On one pipeline's SGLD samples every distiller is built (and timed), then judged on the protocol of
``apd evaluate`` (R runs of fresh draws): SGLD itself; SGLD projected on the top-r principal subspace,
θ ↦ μ + UUᵀ(θ − μ) (the ceiling of any rank-r distiller), and that projection joined to an independent
draw's residual (the ceiling of a subspace model plus any independent residual); dense APD, the paper's
WGAN-GP on raw weight vectors (Wang et al., 2018); subspace APD (the same GAN on whitened coordinates,
without a residual, with the per-weight or the Kronecker-factored Laplace residual, matched to SGLD's
in-distribution disagreement or at its fitted spread: :mod:`apd.distillation.residual`,
:mod:`apd.distillation.kronecker`); its Gaussian null model θ = μ + U·diag(σ)·z; a diagonal Gaussian; and
diagonal mixtures of k Gaussians. Every weight-space model (the codecs, the GANs, the projected samples,
the mixtures) sees the samples with their hidden units aligned as ``apd distill`` aligns them (``[distill]
align``, :mod:`apd.distillation.alignment`), as ``apd evaluate``'s MoG does.

Reported per distiller: storage in SGLD samples' worth, build time, accuracy and mean AUROC of BALD and
max_prob (the paper's "variation ratio" column, 1 − max p̄) as shares of SGLD's, the AUROC on every OOD
set, the nearest-SGLD-sample distance ratio (:func:`apd.evaluation.fidelity.fidelity`), the targets it
misses (``DistillerPlan``), and for a matched residual the factor α it was scaled by. It is a tuning
study, so it is judged on validation images and the OOD *tuning* pool (:func:`apd.data.ood_set` with
``role="tuning"``), never on the test split or evaluate's OOD sets. Outputs:
``artifacts/NAME/experiments/distillers.{json,md,png}``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from apd.config import DistillConfig, ResidualConfig, bounded
from apd.distillation.codec import WeightCodec, fit_codec, storage_in_samples
from apd.distillation.generator import DistilledGenerator
from apd.distillation.training import evenly_spaced, make_trainer
from apd.errors import ConfigError
from apd.evaluation.fidelity import fidelity
from apd.evaluation.protocol import EvaluationInputs
from apd.evaluation.protocol import judge as judge_draw
from apd.experiments.outputs import run_study
from apd.io import read_json
from apd.metrics import mean_of, mean_std
from apd.nets import ParamSpec
from apd.pipeline.figures import new_figure, save_figure
from apd.pipeline.finished_parts import FinishedParts, taken_or_made
from apd.pipeline.layout import manifest_of
from apd.pipeline.methods import fit_mixture
from apd.pipeline.recipes import (
    REFERENCE_SAMPLES,
    TrainingSamples,
    codec_for,
    evaluation_inputs,
    training_samples,
    validation_monitor,
)
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import require_input
from apd.pipeline.tables import format_duration, format_number, format_sample_count, markdown_table
from apd.posteriors import APDGenerator, Posterior, SGLDSamples
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)

SCORES = ("bald", "max_prob")
SCORE_LABELS = {"bald": "BALD", "max_prob": "max-prob"}
FAMILIES = ("sgld", "projected", "decoupled", "dense", "subspace", "gaussian", "diagonal", "mog")
FAMILY_LABELS = {"sgld": "SGLD", "projected": "SGLD in subspace", "decoupled": "+ another sample's residual",
                 "dense": "dense APD", "subspace": "subspace APD",
                 "gaussian": "Gaussian (subspace)", "diagonal": "diagonal Gaussian", "mog": "MoG"}


@dataclass
class DistillerPlan:
    """Which distillers to build, their budgets, and the targets each is checked against.

    Set from the command line with ``--option KEY=VALUE`` (TOML values), e.g. ``--option ranks=[10,20]``.
    """

    # The defaults are the rows of the published comparison: at 30,000 generator steps each subspace
    # GAN takes 6–8 CPU minutes, so a wider sweep (e.g. ranks=[10, 18, 20, 50]) is an option away.
    ranks: list[int] = bounded([17])  # subspace APD and its Gaussian null model, no residual
    residual_ranks: list[int] = bounded([10, 17])  # the same with the matched per-weight residual
    fitted_residual_ranks: list[int] = bounded([])  # subspace APD with the per-weight residual as fitted (α = 1)
    kronecker_ranks: list[int] = bounded([17])  # the Kronecker-factored residual, matched
    mog_components: list[int] = bounded([10])
    projected: bool = True  # SGLD projected onto each subspace of ``ranks``, stored as coordinates
    decoupled: bool = True  # the projection plus an independent SGLD draw's residual, for each of ``ranks``
    gaussian: bool = True  # the Gaussian null model in each subspace of ``ranks``
    diagonal: bool = True
    dense_steps: int = bounded(2000, ge=0)  # 0: leave dense APD out
    subspace_steps: int = bounded(0, ge=0)  # 0: the pipeline's distill.steps
    max_seconds: float = bounded(600.0, gt=0)  # wall clock for building one GAN distiller, training included
    target_accuracy_share: float = bounded(0.99, gt=0)
    target_auroc_gap: float = bounded(1.0, ge=0)  # AUROC points below SGLD's allowed on each (score, OOD set)
    target_storage: float = bounded(20.0, gt=0)  # SGLD samples' worth
    target_seconds: float = bounded(600.0, gt=0)


@dataclass(frozen=True)
class Variant:
    """One distiller of the comparison: its family (:data:`FAMILIES`) and size parameters."""

    name: str
    family: str
    rank: int = 0
    residual: str = ""  # "" (none) or DistillConfig.subspace_residual_scale's "matched" / "fitted"
    residual_model: str = "diagonal"  # DistillConfig.subspace_residual_model
    components: int = 0


class CodecGaussian(Posterior):
    """θ = decode(z), z ~ N(0, I): a Gaussian through a fitted codec, μ + U·diag(σ)·z for the subspace
    codec (the null model of subspace APD) and μ + σ ⊙ z for the standardising one."""

    def __init__(self, codec: WeightCodec, spec: ParamSpec, name: str) -> None:
        self.codec, self.spec, self.name = codec, spec, name
        self.device = codec.mean.device

    def sample_codes(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return torch.randn(k, self.codec.code_dim, generator=self.on_device(generator), device=self.device)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        generator = self.on_device(generator)
        return self.codec.decode(self.sample_codes(k, generator), generator)

    def stored_parameters(self) -> int:
        return self.codec.stored_parameters()


class ProjectedSamples(Posterior):
    """SGLD samples θ projected onto a subspace codec's principal subspace, θ ↦ μ + U·Uᵀ(θ − μ)
    (decode ∘ encode), which keeps exactly what a subspace model can represent. Stored as the codec plus
    the r coordinates of each of the n samples (read from the store here, for brevity)."""

    def __init__(self, samples: SGLDSamples, codec: WeightCodec, name: str) -> None:
        self.samples, self.codec, self.name = samples, codec, name
        self.spec, self.device = samples.spec, samples.device

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return self.codec.decode(self.codec.encode(self.samples.sample_weights(k, generator)))

    def stored_parameters(self) -> int:
        return self.codec.stored_parameters() + len(self.samples.store) * self.codec.code_dim


class DecoupledResidual(ProjectedSamples):
    """μ + UUᵀ(θ_i − μ) + (I − UUᵀ)(θ_j − μ) for independent SGLD draws θ_i, θ_j: SGLD's distribution inside
    the subspace and outside it, without the dependence between the two. An analysis, not a distiller: it
    keeps the whole store."""

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        other = self.samples.sample_weights(k, generator)
        return super().sample_weights(k, generator) + other - self.codec.decode(self.codec.encode(other))

    def stored_parameters(self) -> int:
        return len(self.samples.store) * self.spec.numel


def variants(plan: DistillerPlan) -> list[Variant]:
    """The distillers of ``plan`` in table order, SGLD first."""
    out = [Variant("SGLD", "sgld")]
    out += [Variant(f"SGLD in subspace r={r}", "projected", rank=r) for r in plan.ranks] if plan.projected else []
    out += [Variant(f"SGLD in subspace r={r} + another sample's residual", "decoupled", rank=r)
            for r in plan.ranks] if plan.decoupled else []
    out += [Variant("dense APD", "dense")] if plan.dense_steps else []
    out += [Variant(f"subspace APD r={r}", "subspace", rank=r) for r in plan.ranks]
    out += [Variant(f"subspace APD r={r} + matched residual", "subspace", rank=r, residual="matched")
            for r in plan.residual_ranks]
    out += [Variant(f"subspace APD r={r} + fitted residual", "subspace", rank=r, residual="fitted")
            for r in plan.fitted_residual_ranks]
    out += [Variant(f"subspace APD r={r} + Kronecker residual", "subspace", rank=r, residual="matched",
                    residual_model="kronecker") for r in plan.kronecker_ranks]
    if plan.gaussian:
        out += [Variant(f"Gaussian r={r}", "gaussian", rank=r) for r in plan.ranks]
        out += [Variant(f"Gaussian r={r} + matched residual", "gaussian", rank=r, residual="matched")
                for r in plan.residual_ranks]
        out += [Variant(f"Gaussian r={r} + Kronecker residual", "gaussian", rank=r, residual="matched",
                        residual_model="kronecker") for r in plan.kronecker_ranks]
    out += [Variant("diagonal Gaussian", "diagonal")] if plan.diagonal else []
    out += [Variant(f"MoG-{k}", "mog", components=k) for k in plan.mog_components]
    return out


def gan_config(variant: Variant, pipeline: DistillConfig, plan: DistillerPlan) -> DistillConfig:
    """Dense APD: the paper's settings (DistillConfig's defaults) for ``dense_steps``; subspace APD: the
    pipeline's distill section at the variant's rank and residual, for ``subspace_steps``."""
    if variant.family == "dense":
        return DistillConfig(steps=plan.dense_steps)
    residual = ResidualConfig(model=variant.residual_model if variant.residual else "none",
                              scale=variant.residual or pipeline.residual.scale,
                              kronecker_rank=pipeline.residual.kronecker_rank)
    return dataclasses.replace(pipeline, generator="subspace", subspace_rank=variant.rank, residual=residual,
                               steps=plan.subspace_steps or pipeline.steps)


def train_generator(d: DistillConfig, codec: WeightCodec, store: SampleStore, ctx: RunContext,
                    deadline: float, data: TrainingSamples) -> tuple[DistilledGenerator, int]:
    """WGAN-GP (Gulrajani et al., 2017) on the codes of the stored samples with the seeds of ``apd distill``
    (each row permuted as ``data`` says), for ``d.steps`` generator steps or until ``time.perf_counter()``
    passes ``deadline``; returns the last generator (no selection) and its steps."""
    trainer = make_trainer(d, codec.code_dim, ctx.seed("distill", "gan"), ctx.device)
    real = data.batches(ctx, store, codec, d)
    while trainer.generator_steps < d.steps and time.perf_counter() < deadline:
        trainer.step(real, d.n_critic)
    return DistilledGenerator(trainer.generator, codec).eval(), trainer.generator_steps


@dataclass
class Built:
    """A distiller of the comparison, fit: its posterior, the generator steps it took (GANs) and the
    factor α its residual was scaled by (``matched`` residuals, :mod:`apd.distillation.residual`)."""

    method: Posterior
    steps: int | None = None
    residual_scale: float | None = None


def build(variant: Variant, ctx: RunContext, store: SampleStore, plan: DistillerPlan, deadline: float,
          data: TrainingSamples) -> Built:
    """The posterior of ``variant`` fit to ``store``; every weight-space model (codecs, GANs, the projected
    samples) sees the samples as ``data`` prepares them (aligned as ``apd distill`` aligns them)."""
    cfg, device, spec = ctx.cfg, ctx.device, store.spec
    if variant.family == "sgld":
        return Built(SGLDSamples(store, device))
    if variant.family == "mog":
        return Built(fit_mixture(store, variant.components, cfg.evaluate.mog_fit_samples,
                                 ctx.seed("evaluate", "mog", variant.components), device, data.perms))
    if variant.family == "dense":
        codec = WeightCodec("identity", spec.numel)
    else:
        codec = (fit_codec("standardize", data.fit).to(device) if variant.family == "diagonal"
                 else codec_for(ctx, data.fit, gan_config(variant, cfg.distill, plan)))
    if variant.family in ("gaussian", "diagonal"):
        method, steps = CodecGaussian(codec, spec, variant.name), None
        sample_codes = method.sample_codes
    elif variant.family in ("projected", "decoupled"):
        kind = ProjectedSamples if variant.family == "projected" else DecoupledResidual
        return Built(kind(SGLDSamples(store, device, perms=data.perms), codec, variant.name))
    else:
        model, steps = train_generator(gan_config(variant, cfg.distill, plan), codec, store, ctx, deadline, data)
        method = APDGenerator(model, spec, variant.name)
        sample_codes = lambda k, rng: model.generator.sample(k, generator=rng)  # noqa: E731
    if variant.residual != "matched":
        return Built(method, steps)
    monitor = validation_monitor(ctx, spec, store.read(evenly_spaced(len(store), REFERENCE_SAMPLES)))
    return Built(method, steps, monitor.scale_residual(codec, sample_codes))


def judge(method: Posterior, inputs: EvaluationInputs, runs: int, networks: int, generator: torch.Generator) -> dict:
    """Accuracy of the ensemble predictive on the labelled inputs and the AUROC (percent, OOD positive)
    of each of :data:`SCORES` on every OOD set, mean ± std (ddof 0) over ``runs`` draws of ``networks``
    members, by the protocol of ``apd evaluate`` (:func:`apd.evaluation.protocol.judge`)."""
    draws = [judge_draw(method, inputs, networks, generator, list(SCORES)) for _ in range(runs)]
    return {"accuracy": mean_std([d.accuracy["acc"] for d in draws]),
            "auroc": {s: {o: mean_std([100.0 * d.detection[o][s]["auroc"] for d in draws]) for o in inputs.ood}
                      for s in SCORES}}


def missed_targets(row: dict, sgld: dict, plan: DistillerPlan) -> list[str]:
    """Which targets ``row`` misses: ``accuracy`` (below target_accuracy_share × SGLD's), ``OOD`` (some
    score's AUROC on some set more than target_auroc_gap points below SGLD's), ``storage``, ``time``."""
    misses = []
    if mean_of(row["accuracy"]) < plan.target_accuracy_share * mean_of(sgld["accuracy"]):
        misses.append("accuracy")
    if any(mean_of(stat) < mean_of(sgld["auroc"][score][name]) - plan.target_auroc_gap
           for score, by_set in row["auroc"].items() for name, stat in by_set.items()):
        misses.append("OOD")
    if row["in_sgld_samples"] > plan.target_storage:
        misses.append("storage")
    if row["seconds"] > plan.target_seconds:
        misses.append("time")
    return misses


def _with_shares(row: dict, sgld: dict, plan: DistillerPlan) -> dict:
    mean_auroc = {s: float(np.mean([mean_of(stat) for stat in by_set.values()])) for s, by_set in row["auroc"].items()}
    sgld_mean = {s: float(np.mean([mean_of(stat) for stat in by_set.values()])) for s, by_set in sgld["auroc"].items()}
    worst_gap = {s: max(mean_of(sgld["auroc"][s][o]) - mean_of(stat) for o, stat in by_set.items())
                 for s, by_set in row["auroc"].items()}
    return {**row, "accuracy_share": mean_of(row["accuracy"]) / mean_of(sgld["accuracy"]), "mean_auroc": mean_auroc,
            "mean_auroc_share": {s: mean_auroc[s] / sgld_mean[s] for s in mean_auroc}, "worst_auroc_gap": worst_gap,
            "missed_targets": None if row["family"] == "sgld" else missed_targets(row, sgld, plan)}


def compare_distillers(ctx: RunContext, plan: DistillerPlan, finished: FinishedParts | None = None) -> dict:
    """Build and judge every variant of ``plan`` on the pipeline's samples; the results as JSON-able data. Each
    variant's row is kept in ``finished`` once made, with where it left the draws' stream, and one found there
    (an interrupted run of the same study made it) is taken, the stream set where it left it."""
    cfg, e = ctx.cfg, ctx.cfg.evaluate
    source = ctx.layout.samples
    require_input(ctx, source, "sample")
    started = time.perf_counter()
    inputs = evaluation_inputs(ctx, role="tuning")
    generator = torch.Generator().manual_seed(ctx.seed("experiment", "distillers", "draws"))
    with SampleStore.open(source, expect_spec=ParamSpec.from_module(ctx.network())) as store:
        sgld = SGLDSamples(store, ctx.device)
        limit = min(len(store), cfg.distill.fit_samples, store.spec.numel)
        if any(r > limit for r in (*plan.ranks, *plan.residual_ranks, *plan.fitted_residual_ranks,
                                   *plan.kronecker_ranks)):
            raise ConfigError(f"--option ranks: a subspace rank can be at most {limit} here (fit samples, weights)")
        data = training_samples(ctx, store, cfg.distill)

        def row_of(variant: Variant) -> dict:
            t0 = time.perf_counter()
            built = build(variant, ctx, store, plan, t0 + plan.max_seconds, data)
            method, steps = built.method, built.steps
            seconds = time.perf_counter() - t0
            if variant.family == "sgld":
                seconds = read_json(manifest_of(source)).get("seconds", float("nan"))
            row = {**dataclasses.asdict(variant), "steps": steps, "residual_scale": built.residual_scale,
                   "seconds": round(seconds, 2),
                   "parameters": method.stored_parameters(),
                   "in_sgld_samples": storage_in_samples(method.stored_parameters(), store.spec.numel),
                   **judge(method, inputs, e.runs, e.networks, generator),
                   "fidelity": None if variant.family == "sgld" else fidelity(
                       method, sgld, ctx.data.x_val.to(ctx.device), e.networks, generator)}
            log.info("%s: %.1f s%s; accuracy %.4f, mean BALD AUROC %.1f", variant.name, seconds,
                     "" if steps is None else f" ({steps} steps)", mean_of(row["accuracy"]),
                     np.mean([mean_of(stat) for stat in row["auroc"]["bald"].values()]))
            return row

        rows = [taken_or_made(finished, f"distiller {variant.name}", functools.partial(row_of, variant), generator)
                for variant in variants(plan)]
        dim, store_size = store.spec.numel, len(store)
    rows = [_with_shares(row, rows[0], plan) for row in rows]
    return {"pipeline": cfg.name, "dataset": ctx.data.name, "dim": dim, "sgld_samples": store_size, "runs": e.runs,
            "networks": e.networks, "ood_sets": list(inputs.ood), "scores": list(SCORES),
            "judged_on": "validation images and the OOD tuning pool (never the test split or evaluate's OOD sets)",
            "plan": dataclasses.asdict(plan), "rows": rows, "seconds": round(time.perf_counter() - started, 2)}


def render_table(results: dict) -> str:
    """The Markdown of ``distillers.md``: a note on the protocol and one row per distiller."""
    plan, sets = results["plan"], results["ood_sets"]
    note = (f"# Distillers on {results['pipeline']}\n\n{results['runs']} runs × {results['networks']} networks per "
            f"draw; D = {results['dim']:,} weights; storage in SGLD samples' worth (SGLD: its whole store of "
            f"{results['sgld_samples']:,}); time = building the distiller (SGLD: sampling); shares are of SGLD's "
            f"values; judged on validation images and the OOD tuning pool; AUROC in percent per tuning set "
            f"({' / '.join(sets)}); max-prob is 1 − max p̄, the paper's \"variation ratio\"; NN ratio = distance "
            "to the nearest SGLD sample over that of held-out SGLD samples; 'SGLD in subspace r' (the samples' "
            "r coordinates) is the ceiling of rank-r distillers, '+ another sample's residual' that of a rank-r "
            "model plus any independent residual. "
            f"Targets: accuracy ≥ {100 * plan['target_accuracy_share']:g} % of SGLD's, every AUROC at most "
            f"{plan['target_auroc_gap']:g} point below SGLD's, storage ≤ {plan['target_storage']:g} samples, "
            f"time ≤ {plan['target_seconds']:g} s.\n\n")
    header = ["distiller", "storage", "time", "steps", "accuracy", "acc % SGLD",
              *(f"{SCORE_LABELS[s]} % SGLD" for s in SCORES), *(f"{SCORE_LABELS[s]} worst gap" for s in SCORES),
              *(f"{SCORE_LABELS[s]} AUROC per set" for s in SCORES), "NN ratio", "misses"]
    body = []
    for row in results["rows"]:
        misses = row["missed_targets"]
        alpha = row.get("residual_scale")
        name = row["name"] if alpha is None else f"{row['name']} (α = {alpha:.2f})"
        body.append([name, format_sample_count(row["in_sgld_samples"]), format_duration(row["seconds"]),
                     "—" if row["steps"] is None else f"{row['steps']:,}", format_number(mean_of(row["accuracy"]), 4),
                     format_number(100 * row["accuracy_share"], 1),
                     *(format_number(100 * row["mean_auroc_share"][s], 1) for s in SCORES),
                     *(format_number(row["worst_auroc_gap"][s], 1) if "worst_auroc_gap" in row else "—"
                       for s in SCORES),
                     *(" / ".join(format_number(mean_of(row["auroc"][s][o]), 1) for o in sets) for s in SCORES),
                     "—" if row["fidelity"] is None else format_number(row["fidelity"]["nn_ratio"], 2),
                     "(reference)" if misses is None else ", ".join(misses) or "none"])
    return note + markdown_table(header, body) + "\n"


def draw_figure(results: dict, path: Path) -> None:
    """Against storage (log scale): accuracy as a share of SGLD's, and the worst per-set AUROC gap to SGLD
    (points below it on the OOD set where the distiller falls furthest behind) for BALD and for max-prob,
    the target gap dotted. A marker per family of distillers; each point is tagged with its rank or
    number of components, and a family's points without a residual are joined in order of storage: the
    frontier of that family."""
    figure, axes = new_figure(1, 3, panel=(5.0, 4.2))
    panels = [("accuracy", None, "accuracy (% of SGLD)")]
    panels += [("gap", score, f"worst per-set {SCORE_LABELS[score]} AUROC gap to SGLD (points)") for score in SCORES]
    rows = [row for row in results["rows"] if row["family"] != "sgld"]
    for ax, (kind, score, label) in zip(axes[0], panels, strict=True):
        for family, marker in zip(FAMILIES, "*PXsos^D", strict=True):
            picked = sorted((row for row in rows if row["family"] == family), key=lambda r: r["in_sgld_samples"])
            if not picked:
                continue
            worth = [row["in_sgld_samples"] for row in picked]
            values = [100 * row["accuracy_share"] if kind == "accuracy" else row["worst_auroc_gap"][score]
                      for row in picked]
            color = f"C{FAMILIES.index(family)}"
            ax.plot(worth, values, marker, color=color, label=FAMILY_LABELS[family], linestyle="none", markersize=6)
            plain = [(x, y) for row, x, y in zip(picked, worth, values, strict=True) if not row["residual"]]
            if len(plain) > 1:
                ax.plot(*zip(*plain, strict=True), color=color, linewidth=0.8)
            for row, x, y in zip(picked, worth, values, strict=True):
                residual = "kronecker" if row.get("residual_model") == "kronecker" else row["residual"]
                tag = (f"r={row['rank']}" + (f"+{residual}" if residual else "") if row["rank"]
                       else f"k={row['components']}" if row["components"] else "")
                ax.annotate(tag, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=6)
        if kind == "accuracy":
            ax.axhline(100, color="grey", linewidth=0.8)
        else:
            ax.axhline(0, color="grey", linewidth=0.8)
            ax.axhline(results["plan"]["target_auroc_gap"], color="grey", linestyle=":", linewidth=0.8)
        ax.axvline(results["plan"]["target_storage"], color="grey", linestyle=":", linewidth=0.8)
        ax.set(xscale="log", xlabel="storage (SGLD samples' worth)", ylabel=label, title=results["pipeline"])
        ax.legend(fontsize=7)
    save_figure(figure, path)


def run_distillers(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment distillers``: compare, write ``experiments/distillers.{json,md,png}``, print the table;
    resumes a run of the same study cut short (:func:`~apd.experiments.outputs.study_parts`)."""
    return run_study(ctx, options, DistillerPlan, compare_distillers, "distillers", render_table, draw_figure)
