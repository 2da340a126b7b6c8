"""``apd experiment gan-variants``: WGAN-GP, WGAN with weight clipping and the original (non-saturating)
GAN, trained on the same store, with the same codec, budget and seeds (Wang et al., 2018, compare the
three by the networks they generate).

Every ``every`` generator steps each run's generator is judged, on what settings may be chosen on: the
generated ensemble's validation accuracy and the selection criterion of ``apd distill``
(:mod:`apd.distillation.selection`: mean KL to SGLD's predictive plus the mean per-input BALD gap on
validation images), the mean BALD AUROC on the OOD *tuning* pool (validation images against it), and the
spread ratio: the median over the codec's coordinates of std_generated / std_SGLD, the GAN's output against
the codes of the samples it learns (so the subspace codec's truncation to r directions does not count as
a collapse). A formulation *collapses* when that ratio stays below :data:`COLLAPSE_RATIO` at the end. Outputs:
``artifacts/NAME/experiments/gan_variants.{json,md,png}``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from apd.config import bounded
from apd.distillation.generator import DistilledGenerator
from apd.distillation.training import evenly_spaced, make_trainer
from apd.errors import DivergenceError
from apd.evaluation.protocol import judge
from apd.experiments.outputs import run_study
from apd.nets import ParamSpec
from apd.pipeline.figures import new_figure, save_figure
from apd.pipeline.recipes import REFERENCE_SAMPLES, codec_for, evaluation_inputs, training_samples, validation_monitor
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import require_input
from apd.pipeline.table_format import format_number, markdown_table
from apd.posteriors import APDGenerator
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)

LOSSES = ("wgan-gp", "wgan", "gan")
LABELS = {"wgan-gp": "WGAN-GP", "wgan": "WGAN (clipping)", "gan": "GAN (non-saturating)"}
COLLAPSE_RATIO = 0.5  # final median spread ratio (codes) below which a formulation counts as collapsed


@dataclass
class VariantsPlan:
    """Budget of the comparison (``--option KEY=VALUE``): generator ``steps`` per formulation, judged every
    ``every`` steps on ``networks`` generated networks; ``lr`` 0 takes each loss's own default (WGAN-GP
    1e-4 in the paper, WGAN 5e-5, GAN 2e-4); the pipeline's learning rate otherwise applies to all."""

    steps: int = bounded(3000, ge=1)
    every: int = bounded(250, ge=1)
    networks: int = bounded(100, ge=2)
    lr: float = bounded(-1.0)  # < 0: the pipeline's distill.lr for every loss; 0: each loss's default


def spread_ratio(generated: torch.Tensor, reference: torch.Tensor) -> float:
    """Median over coordinates of std(generated) / std(reference). The studies compare the GAN's output codes
    with the codes of the samples it learns (for the subspace codec, their whitened principal coordinates;
    for the dense one, the weights): a collapse of the GAN, not the codec's truncation to r directions."""
    return float((generated.std(0) / reference.std(0).clamp_min(1e-12)).median())


def run_variant(ctx: RunContext, loss: str, plan: VariantsPlan, store: SampleStore, spec: ParamSpec) -> dict:
    """Train one formulation on the pipeline's codec and judge it along the way."""
    d = dataclasses.replace(ctx.cfg.distill, loss=loss, steps=plan.steps,
                            lr=ctx.cfg.distill.lr if plan.lr < 0 else plan.lr)
    data = training_samples(ctx, store, d)  # aligned as `apd distill` aligns them
    codec = codec_for(ctx, data.fit, d)
    monitor = validation_monitor(ctx, spec, store.read(evenly_spaced(len(store), REFERENCE_SAMPLES)))
    tuning = evaluation_inputs(ctx, role="tuning")
    real = data.batches(ctx, store, codec, d)
    real_codes = codec.encode(data.fit.to(ctx.device)).cpu()  # what the GAN learns: its spread is the reference
    trainer = make_trainer(d, codec.code_dim, ctx.seed("distill", "gan"), ctx.device)
    model = DistilledGenerator(trainer.generator, codec)
    draws = torch.Generator().manual_seed(ctx.seed("experiment", "gan-variants", "draws"))
    history, started, diverged = [], time.perf_counter(), None
    bar = ctx.progress(total=plan.steps, desc=LABELS[loss], unit="step")
    with bar:
        while trainer.generator_steps < plan.steps:
            try:
                trainer.step(real, d.n_critic)
            except DivergenceError as exc:
                diverged = str(exc)
                break
            bar.update()
            step = trainer.generator_steps
            if step % plan.every and step != plan.steps:
                continue
            model.eval()
            judged = monitor.judge(model)
            generated = APDGenerator(model, spec, loss)
            tuned = judge(generated, tuning, plan.networks, draws, ["bald"])
            with torch.no_grad():
                codes = model.generator.sample(plan.networks, generator=draws).cpu()
            history.append({"step": step, "val_accuracy": judged["accuracy"], "criterion": judged["criterion"],
                            "tuning_bald_auroc": tuned.mean_auroc("bald"),
                            "spread_ratio": spread_ratio(codes, real_codes)})
    final = history[-1] if history else {}
    return {"loss": loss, "label": LABELS[loss], "lr": d.lr, "history": history, "diverged": diverged,
            "seconds": round(time.perf_counter() - started, 1),
            "collapsed": bool(final) and final["spread_ratio"] < COLLAPSE_RATIO}


def compare(ctx: RunContext, plan: VariantsPlan) -> dict:
    require_input(ctx, ctx.layout.samples, "sample")
    spec = ParamSpec.from_module(ctx.network())
    with SampleStore.open(ctx.layout.samples, expect_spec=spec) as store:
        sgld = judge_reference(ctx, store, spec, plan)
        runs = [run_variant(ctx, loss, plan, store, spec) for loss in LOSSES]
    return {"pipeline": ctx.cfg.name, "plan": dataclasses.asdict(plan), "sgld": sgld, "runs": runs,
            "collapse_ratio": COLLAPSE_RATIO,
            "judged_on": "validation images and the OOD tuning pool (never the test split or evaluate's OOD sets)"}


def judge_reference(ctx: RunContext, store: SampleStore, spec: ParamSpec, plan: VariantsPlan) -> dict:
    """SGLD's own values on the same footing: validation accuracy and mean BALD AUROC on the tuning pool."""
    from apd.posteriors import SGLDSamples

    draws = torch.Generator().manual_seed(ctx.seed("experiment", "gan-variants", "sgld"))
    tuned = judge(SGLDSamples(store, ctx.device), evaluation_inputs(ctx, role="tuning"), plan.networks, draws,
                  ["bald"])
    return {"val_accuracy": tuned.accuracy["acc"],
            "tuning_bald_auroc": tuned.mean_auroc("bald")}


def render_table(results: dict) -> str:
    """One row per formulation: its final values, its best criterion and whether it collapsed."""
    sgld = results["sgld"]
    header = ["formulation", "lr", "steps", "val. accuracy", "criterion (final / best)", "tuning BALD AUROC",
              "spread ratio", "collapsed"]
    body = [["SGLD (reference)", "—", "—", format_number(sgld["val_accuracy"], 4), "0", format_number(
        sgld["tuning_bald_auroc"], 1), "1", "—"]]
    for run in results["runs"]:
        history = run["history"]
        if not history:
            body.append([run["label"], f"{run['lr']:g}", "0", "—", "—", "—", "—", "diverged"])
            continue
        last = history[-1]
        best = min(h["criterion"] for h in history)
        body.append([run["label"], f"{run['lr']:g}", f"{last['step']:,}", format_number(last["val_accuracy"], 4),
                     f"{format_number(last['criterion'], 3)} / {format_number(best, 3)}",
                     format_number(last["tuning_bald_auroc"], 1), format_number(last["spread_ratio"], 2),
                     "diverged" if run["diverged"] else ("yes" if run["collapsed"] else "no")])
    note = (f"Same store, codec, seeds and budget for each formulation; judged on validation images and the OOD "
            f"tuning pool; spread ratio = median over the codec's coordinates of the generated codes' std over "
            f"those of SGLD's samples (the GAN's own spread, not the codec's truncation); a "
            f"final ratio below {results['collapse_ratio']:g} counts as collapsed.\n\n")
    return note + markdown_table(header, body) + "\n"


def draw_figure(results: dict, path) -> None:
    """Validation accuracy, criterion (log), tuning BALD AUROC and spread ratio against generator steps."""
    figure, axes = new_figure(1, 4, panel=(3.6, 3.0))
    panels = (("val_accuracy", "validation accuracy", "val_accuracy"), ("criterion", "criterion (nats)", None),
              ("tuning_bald_auroc", "BALD AUROC, tuning pool (%)", "tuning_bald_auroc"),
              ("spread_ratio", "weight spread / SGLD's", None))
    for ax, (key, label, reference) in zip(axes[0], panels, strict=True):
        for index, run in enumerate(results["runs"]):
            history = run["history"]
            ax.plot([h["step"] for h in history], [h[key] for h in history], "o-", markersize=3,
                    color=f"C{index}", label=run["label"])
        if reference:
            ax.axhline(results["sgld"][reference], color="grey", linestyle="--", label="SGLD")
        if key == "criterion":
            ax.set_yscale("log")
        if key == "spread_ratio":
            ax.axhline(1.0, color="grey", linestyle="--")
            ax.axhline(results["collapse_ratio"], color="grey", linestyle=":")
        ax.set(xlabel="generator steps", title=label)
    axes[0, 0].legend(fontsize=7)
    save_figure(figure, path)


def run_gan_variants(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment gan-variants``: compare, write ``experiments/gan_variants.{json,md,png}``, print."""
    results = run_study(ctx, options, VariantsPlan, compare, "gan_variants", render_table, draw_figure)
    collapsed = [run["label"] for run in results["runs"] if run["collapsed"]]
    log.info("collapsed: %s", ", ".join(collapsed) or "none")
    return results
