"""``apd experiment precision``: does storing numbers at lower precision let APD beat the kept samples?

A storage budget of S SGLD samples' worth (``budget``, bytes / (4·D)) buys, at each precision of
:mod:`apd.distillation.precision` (float32, float16, int8):

- **APD**: the pipeline's own distiller (its ``[distill]`` section: codec, residual, generator widths,
  steps) at the largest subspace rank r whose stored tensors (generator weights, codec mean, basis,
  scales and residual factors) fit the budget at that precision, trained on float32 samples as
  ``apd distill`` trains it and then stored at the precision;
- **kept samples**: the most SGLD samples that fit the budget at that precision, k = ⌊S / (bytes of one
  sample / 4D)⌋, evenly spaced over the store (across chains) and ``subsets`` random subsets for the
  spread, each sample stored at the precision.

So lower precision buys APD a larger rank and the kept samples more members, and the comparison stays at
equal storage. Both are scored by the kept-samples yardstick (:mod:`apd.evaluation.yardstick`): worst
per-set BALD and max-prob AUROC gap to SGLD, NLL gap and KL to SGLD's predictive, and APD's margins over
its kept samples (:func:`~apd.evaluation.yardstick.margins_over_kept`: a win is a margin larger than the
random subsets' spread over both the evenly spaced and the random subsets). The *storage shift* is the
mean total variation ½ Σ_y |p̄₃₂(y | x) − p̄(y | x)| on validation images between an ensemble stored at
float32 and the same ensemble (the same codes and residual draws; the same rows) stored at the precision:
what the rounding alone changes.

It is a tuning study: everything is judged on validation images and the OOD *tuning* pool
(:func:`apd.pipeline.evaluate.evaluation_inputs` with ``role="tuning"``), never on the test split or the
OOD sets ``apd evaluate`` reports. Outputs: ``artifacts/NAME/experiments/precision.{json,md,png}``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from apd.config import DistillConfig, bounded
from apd.distillation.generator import architecture, build_generator
from apd.distillation.precision import (
    PRECISIONS,
    Precision,
    in_samples,
    module_bytes,
    round_trip,
    round_trip_module_,
    stored_bytes,
)
from apd.errors import ConfigError
from apd.evaluation.yardstick import kept_samples, margins_over_kept
from apd.experiments.distillers import DistillerPlan, Variant, build
from apd.experiments.outputs import run_study
from apd.experiments.storage import judge_runs, sgld_reference
from apd.nets import ParamSpec, mlp
from apd.pipeline.distill import training_samples
from apd.pipeline.evaluate import evaluation_inputs
from apd.pipeline.figures import new_figure, save_figure
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import require_input
from apd.pipeline.table_format import MISSING, format_gap, format_number, format_sample_count, markdown_table, mean_std
from apd.posteriors import APDGenerator, Posterior
from apd.posteriors.kept import FixedEnsemble, evenly_spaced_rows
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)

GAPS = {"bald_gap": "worst BALD gap", "max_prob_gap": "worst max-prob gap", "nll_gap": "NLL gap"}


@dataclass
class PrecisionPlan:
    """The budget and precisions compared (``--option KEY=VALUE``, e.g. ``--option budget=4``)."""

    budget: float = bounded(4.0, gt=0)  # SGLD samples' worth (issue 20's fcNN2 target: S ≤ 4)
    precisions: list[Precision] = bounded(list(PRECISIONS))
    subsets: int = bounded(5, ge=1)  # random kept subsets per precision: the spread a win must exceed
    steps: int = bounded(0, ge=0)  # generator steps; 0: the pipeline's distill.steps
    max_seconds: float = bounded(1200.0, gt=0)  # wall clock for training one generator


def generator_storage(d: DistillConfig, rank: int, spec: ParamSpec, precision: str) -> float:
    """SGLD samples' worth of the generator ``d`` describes at subspace rank ``rank``, stored at ``precision``
    (counted on modules of the right shapes, before any training)."""
    arch = architecture(dataclasses.replace(d, subspace_rank=rank), spec.numel, spec.layer_sizes)
    return in_samples(module_bytes(build_generator(arch), precision), spec.numel)


def largest_rank(d: DistillConfig, spec: ParamSpec, budget: float, precision: str, limit: int) -> int:
    """The largest rank r ≤ ``limit`` whose :func:`generator_storage` fits ``budget``; 0 when none does."""
    best = 0
    for rank in range(1, limit + 1):
        if generator_storage(d, rank, spec, precision) > budget:
            break
        best = rank
    return best


def most_kept(dim: int, budget: float, precision: str, available: int) -> int:
    """The most samples of ``dim`` numbers stored at ``precision`` that fit ``budget`` (at most ``available``)."""
    return min(available, int(budget // in_samples(stored_bytes(dim, precision), dim)))


@torch.no_grad()
def storage_shift(exact: Posterior, stored: Posterior, x: Tensor, networks: int, seed: int) -> float:
    """Mean over inputs of ½ Σ_y |p̄_exact(y | x) − p̄_stored(y | x)|, both ensembles of ``networks`` members
    drawn with one seed (the same codes and noise, or the same rows)."""
    means = [method.predict_probs(x.to(method.device), networks, torch.Generator().manual_seed(seed)).double().mean(0)
             for method in (exact, stored)]
    return float(0.5 * (means[0] - means[1]).abs().sum(-1).mean())


def stored_apd(method: APDGenerator, precision: str) -> APDGenerator:
    """A copy of ``method`` with every stored tensor read back from ``precision``."""
    return APDGenerator(round_trip_module_(copy.deepcopy(method.model), precision), method.spec,
                        f"{method.name}, {precision}")


def shipped_variant(d: DistillConfig, rank: int) -> Variant:
    """The pipeline's distiller (its residual model and scaling) at subspace rank ``rank``."""
    residual = "" if d.residual.model == "none" else d.residual.scale
    return Variant(f"APD r={rank}", "subspace", rank=rank, residual=residual,
                   residual_model=d.residual.model if residual else "diagonal")


def _means(auroc: dict) -> dict:
    return {score: {name: None if stat is None else stat["mean"] for name, stat in by_set.items()}
            for score, by_set in auroc.items()}


def compare_precisions(ctx: RunContext, plan: PrecisionPlan) -> dict:
    """For each precision of ``plan``: APD at the largest rank and the most kept samples the budget buys,
    judged on validation images and the OOD tuning pool; the results as JSON-able data."""
    cfg, e = ctx.cfg, ctx.cfg.evaluate
    if cfg.distill.generator != "subspace":
        raise ConfigError(f"{cfg.source}: the precision study needs [distill] generator = \"subspace\" "
                          "(its rank is what the budget buys)")
    source = ctx.layout.samples
    require_input(ctx, source, "sample")
    started = time.perf_counter()
    inputs = evaluation_inputs(ctx, role="tuning")
    rows = []
    with SampleStore.open(source, expect_spec=ParamSpec.from_module(mlp(ctx.net_sizes))) as store:
        spec, dim = store.spec, store.spec.numel
        sgld, reference = sgld_reference(ctx, store, inputs)
        data = training_samples(ctx, store, cfg.distill)
        limit = min(len(store), cfg.distill.fit_samples, dim)
        steps = DistillerPlan(subspace_steps=plan.steps)
        for precision in plan.precisions:
            rank, k = largest_rank(cfg.distill, spec, plan.budget, precision, limit), most_kept(
                dim, plan.budget, precision, len(store))
            seed = ctx.seed("experiment", "precision", precision)
            row: dict = {"precision": precision, "rank": rank, "k": k, "apd": None, "margins": None}
            if k:
                row["kept"] = kept_samples(store, k, inputs, reference, plan.subsets,
                                           torch.Generator().manual_seed(seed), ctx.device, precision)
                exact = store.read(evenly_spaced_rows(len(store), k, store.chains))
                row["kept"]["storage_shift"] = storage_shift(
                    FixedEnsemble(exact, spec, ctx.device),
                    FixedEnsemble(torch.stack([round_trip(v, precision) for v in exact]), spec, ctx.device),
                    ctx.data.x_val, k, seed)
            else:
                row["kept"] = None
            if rank:
                t0 = time.perf_counter()
                built = build(shipped_variant(cfg.distill, rank), ctx, store, steps, t0 + plan.max_seconds, data)
                method = stored_apd(built.method, precision)
                row["apd"] = {"steps": built.steps, "residual_scale": built.residual_scale,
                              "seconds": round(time.perf_counter() - t0, 2),
                              "in_sgld_samples": in_samples(module_bytes(method.model, precision), dim),
                              **judge_runs(method, e.networks, inputs, reference, e.runs, seed),
                              "storage_shift": storage_shift(built.method, method, ctx.data.x_val, e.networks, seed)}
                if row["kept"] is not None:
                    row["margins"] = margins_over_kept(_means(row["apd"]["auroc"]), row["apd"]["nll"]["mean"],
                                                       row["kept"])
            rows.append(row)
            log.info("%s: APD rank %d, %d kept samples%s", precision, rank, k,
                     "" if row["margins"] is None else f"; APD wins {row['margins']['wins']} of "
                     f"{row['margins']['compared']}")
        store_size = len(store)
    return {"pipeline": cfg.name, "dataset": ctx.data.name, "dim": dim, "sgld_samples": store_size, "runs": e.runs,
            "networks": e.networks, "ood_sets": list(inputs.ood), "budget": plan.budget,
            "judged_on": "validation images and the OOD tuning pool (never the test split or evaluate's OOD sets)",
            "plan": dataclasses.asdict(plan), "sgld": sgld, "rows": rows,
            "seconds": round(time.perf_counter() - started, 2)}


def render_table(results: dict) -> str:
    """The Markdown of ``precision.md``: a note on the protocol and, per precision, APD against its kept
    samples on each yardstick quantity."""
    note = (f"# Storage precision on {results['pipeline']}\n\nA budget of {results['budget']:g} SGLD samples' "
            f"worth (D = {results['dim']:,} weights) at each precision: APD (the pipeline's distiller at the "
            "largest rank that fits, stored at the precision) against the most SGLD samples that fit at the "
            f"same precision, evenly spaced and the mean ± std of {results['plan']['subsets']} random subsets. "
            f"{results['runs']} runs × {results['networks']} networks per APD draw; judged on validation images "
            f"and the OOD tuning pool ({' / '.join(results['ood_sets'])}). Gaps to SGLD: worst per-set AUROC "
            "gap in points (positive: below SGLD), NLL gap in nats. Wins: margins over both the evenly spaced "
            "and the random kept samples larger than the random subsets' std, of the per-set BALD and max-prob "
            "AUROCs and the NLL. Storage shift: mean total variation between the predictive stored at float32 "
            "and at the precision (the same members), on validation images.\n\n")
    header = ["precision", "APD rank", "APD storage", "kept k", "kept storage"]
    for label in GAPS.values():
        header += [f"{label}: APD", "kept", "random"]
    header += ["KL: APD", "kept", "random", "APD wins", "storage shift: APD", "kept"]
    body = []
    for row in results["rows"]:
        apd, kept = row["apd"], row["kept"]
        cells = [row["precision"], str(row["rank"]) if row["rank"] else "none fits",
                 "—" if apd is None else format_sample_count(apd["in_sgld_samples"]), str(row["k"]),
                 "—" if kept is None else format_sample_count(kept["in_sgld_samples"])]
        for key in GAPS:
            digits = 3 if key == "nll_gap" else 1
            cells += [MISSING if apd is None else format_gap(apd[key], digits),
                      MISSING if kept is None else format_gap(kept["evenly_spaced"][key], digits),
                      MISSING if kept is None else format_gap(kept["random"][key], digits)]
        cells += [MISSING if apd is None else mean_std(apd["kl"], 4),
                  MISSING if kept is None else format_number(kept["evenly_spaced"]["kl"], 4),
                  MISSING if kept is None else mean_std(kept["random"]["kl"], 4)]
        margins = row["margins"]
        cells += ["—" if margins is None else f"{margins['wins']} of {margins['compared']}",
                  "—" if apd is None else format_number(apd["storage_shift"], 4),
                  "—" if kept is None else format_number(kept["storage_shift"], 4)]
        body.append(cells)
    return note + markdown_table(header, body) + "\n"


def draw_figure(results: dict, path: Path) -> None:
    """One panel per yardstick gap (worst BALD and max-prob AUROC gap, NLL gap): per precision, APD (mean over
    runs), the evenly spaced kept samples and the random subsets (mean over subsets) side by side, each std
    as an error bar."""
    figure, axes = new_figure(1, 3, panel=(4.6, 3.8))
    rows = results["rows"]
    x = np.arange(len(rows))
    for ax, (key, label) in zip(axes[0], GAPS.items(), strict=True):
        apd = [None if row["apd"] is None else row["apd"][key] for row in rows]
        even = [None if row["kept"] is None else row["kept"]["evenly_spaced"][key] for row in rows]
        drawn = [None if row["kept"] is None else row["kept"]["random"][key] for row in rows]
        bars = [("APD", [None if a is None else a["mean"] for a in apd], [0.0 if a is None else a["std"] for a in apd]),
                ("kept, evenly spaced", even, None),
                ("kept, random subsets", [None if d is None else d["mean"] for d in drawn],
                 [0.0 if d is None else d["std"] for d in drawn])]
        for i, (name, values, errors) in enumerate(bars):
            heights = [np.nan if v is None else v for v in values]
            ax.bar(x + (i - 1) * 0.27, heights, width=0.27, yerr=errors, label=name, color=f"C{i}", capsize=3)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(x, [f"{row['precision']}\nr={row['rank']}, k={row['k']}" for row in rows])
        unit = "nats" if key == "nll_gap" else "AUROC points"
        ax.set(ylabel=f"{label} to SGLD ({unit})", title=f"{results['pipeline']}, {results['budget']:g} samples' worth")
        ax.legend(fontsize=7)
    save_figure(figure, path)


def run_precision(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment precision``: compare, write ``experiments/precision.{json,md,png}``, print the table."""
    return run_study(ctx, options, PrecisionPlan, compare_precisions, "precision", render_table, draw_figure)
