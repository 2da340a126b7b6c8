"""``apd experiment frontier``: APD's storage-versus-quality curve against the kept samples' curve.

For each budget S of ``budgets`` (SGLD samples' worth, bytes / (4·D)):

- **APD**: one WGAN-GP per chain of the store (the pipeline's ``[distill]`` GAN, as ``[distill] per_chain``
  trains it; :func:`~apd.experiments.precision.train_chain_generators`), or with ``mode_embedding`` E > 0 one
  WGAN-GP told the chain by E learned numbers (as ``[distill] mode_embedding`` trains it;
  :func:`~apd.experiments.precision.train_conditioned_generator`), over every sample's coordinates in
  one shared principal subspace, at the largest rank r whose codec and generators fit S when stored at
  ``precision`` (:func:`~apd.experiments.precision.chain_generators_storage`), trained on float32
  coordinates and then stored at the precision (the generator networks at ``generators_at`` and the codec's
  mean at ``mean_at`` where given, the rest of the codec at ``precision``:
  :func:`~apd.experiments.precision.apd_bytes`); trained ``seeds`` times, from
  generator seeds 0 … seeds − 1 (:func:`~apd.pipeline.seeds.replicated`), seed 0 as a study of one seed trains it;
- **kept samples**: S SGLD samples stored at float32, centred in equal parts of each chain, the last of
  each chain, and ``subsets`` random subsets stratified by chain (:func:`~apd.evaluation.yardstick.kept_samples`):
  the kept-samples yardstick, ⌈S⌉ samples as they are;
- **kept samples at APD's precision** (``kept_at_precision``, on by default, none when APD is stored at
  float32): ⌈S / s⌉ SGLD samples, each stored at ``precision`` as APD is (s: one sample's storage at it;
  :func:`~apd.evaluation.kept_storage.kept_for`, as ``apd evaluate`` sets a method at a lower precision
  against them), the comparison at equal rounding; like the float32 samples they take at least S, so at
  least APD's storage;
- **kept samples around their chain's mean** (``kept_around_means``, on by default, none when APD is stored at
  float32): the fewest SGLD samples that, each stored at ``precision`` as its deviation from its chain's mean
  and the means of the chains they come from at APD's mean precision, take at least S
  (:class:`~apd.evaluation.kept_storage.AroundChainMeans`): samples stored as compactly as APD is, whose
  codec rounds about a mean it keeps at that precision;
- **APD's ceiling** (``ceiling``, on by default): every SGLD sample's own coordinates in APD's rank-r subspace,
  θ_i ↦ μ + U·diag(σ)·c_i (:func:`~apd.experiments.precision.sgld_coordinates`, float32), the best any
  generator in that subspace can do. It stores all n samples' coordinates, so its storage (reported) is
  not the budget's, and it is an analysis rather than a distiller: it tells a generator that falls short
  of its subspace from a subspace that falls short of SGLD. Where APD is stored below float32, also **as
  stored** (``ceiling_codec_at_precision``): the same coordinates decoded by the codec read back from
  ``precision``, its mean from ``mean_at`` where given
  (:meth:`~apd.experiments.precision.StoredCoordinates.codec_at`), as the stored generators' codes are, the
  best a generator whose codec is stored so can do.

Both are scored by the kept-samples yardstick (:mod:`apd.evaluation.yardstick`): worst per-set absolute BALD
and max-prob AUROC gap to SGLD, NLL gap, KL(SGLD's predictive ‖ the method's) on the judged images (and the
function-space gaps on the tuning pool); and APD's wins over the kept samples
(:func:`~apd.evaluation.yardstick.wins_over_kept`: a gap below the evenly spaced and the last samples' and a
percentile rank of at least 95 among the random subsets, stratified by chain). APD's curve crosses the kept
samples' at the budgets where every one of its trainings wins on all four summaries (:func:`below_kept`), and
the curves of the samples kept at APD's precision, whole or around their chains' means, likewise. APD's
storage is at most S, so every set of kept samples has at least APD's bytes, unless the store holds fewer
than it takes; a crossing counts only where they do (:func:`crossings`).

Judged, as the precision study is, on validation images and the OOD tuning pool only; writes
``artifacts/NAME/experiments/frontier.{json,md,png}``, or ``frontier-PRECISION.*`` for APD stored at a
precision other than int8 (with ``-generators-PRECISION`` and ``-mean-PRECISION`` for parts stored
otherwise), and ``frontier-PRECISION-conditioned-E.*`` for the generator told the chain by E numbers
(:func:`study_stem`), so that one study does not overwrite the other; ``tag`` appends ``-TAG`` to the stem,
for a variant those names do not tell apart (other steps or budgets).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from apd.config import YARDSTICK_SUBSETS, bounded
from apd.distillation.precision import PartPrecisions, Precision
from apd.errors import ConfigError
from apd.evaluation.kept_storage import AroundChainMeans, KeptStorage, kept_for, storage_key
from apd.evaluation.protocol import EvaluationInputs
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import (
    FIXED,
    GAPS_PER_DRAW,
    RANK_RULE,
    Reference,
    kept_samples,
    per_draw,
    ranked,
    standing,
)
from apd.experiments.options import plan_from_options
from apd.experiments.outputs import provenance, study_parts, write_study
from apd.experiments.precision import (
    GAPS,
    apd_bytes,
    chain_generators_storage,
    gap_axis_label,
    judged_margins,
    largest_rank,
    require_subspace,
    scored,
    sgld_coordinates,
    stored_apd,
    train_chain_generators,
    train_conditioned_generator,
)
from apd.experiments.storage import sgld_reference
from apd.metrics import mean_of, std_of
from apd.nets import ParamSpec
from apd.pipeline.figures import figure_legend, new_figure, save_figure
from apd.pipeline.finished_parts import FinishedParts, taken_or_made
from apd.pipeline.recipes import TrainingSamples, evaluation_inputs, training_samples
from apd.pipeline.runtime import RunContext
from apd.pipeline.seeds import replicated
from apd.pipeline.stage import require_input
from apd.pipeline.table_format import (
    MISSING,
    format_gap,
    format_number,
    format_sample_count,
    markdown_table,
    mean_std,
    spoken_list,
)
from apd.posteriors import Posterior
from apd.samplers.store import SampleStore, chain_partition

log = logging.getLogger(__name__)

KEPT = {"evenly_spaced": "kept, evenly spaced", "last": "kept, last of each chain", "random": "kept, random subsets"}
APD, TOLD, CEILING = "APD per chain", "APD told the chain", "SGLD coordinates (APD's ceiling)"
CEILING_AS_STORED = "SGLD coordinates, codec at {} (APD's ceiling as stored)"
SUMMARIES = {"bald_gap": "BALD", "max_prob_gap": "max-prob", "nll_gap": "NLL", "kl": "KL"}
TAG_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # a study's tag: part of a plain file name


@dataclass
class FrontierPlan:
    """The budgets and APD's storage precision (``--option KEY=VALUE``, e.g. ``--option budgets=[2,4,8]``)."""

    budgets: list[int] = bounded([2, 4, 8, 16])  # SGLD samples' worth; S kept samples at each
    precision: Precision = "int8"  # APD's stored tensors (S kept samples stay float32)
    subsets: int = bounded(YARDSTICK_SUBSETS, ge=YARDSTICK_SUBSETS)  # random kept subsets per budget
    steps: int = bounded(0, ge=0)  # each generator's steps; 0: the pipeline's distill.steps
    ceiling: bool = True  # also score every sample's coordinates in APD's subspace (float32)
    kept_at_precision: bool = True  # also keep the samples S buys at APD's precision (none at float32)
    kept_around_means: bool = True  # and those it buys at it around their chains' means (none at float32)
    generators_at: Literal["", "float32", "float16", "int8", "int4"] = ""  # the generator networks' own; "": APD's
    mean_at: Literal["", "float32", "float16", "int8", "int4"] = ""  # the codec's mean's own; "": APD's
    seeds: int = bounded(1, ge=1)  # APD's trainings per budget, from generator seeds 0 … seeds − 1
    mode_embedding: int = bounded(0, ge=0)  # E > 0: one generator told the chain by E numbers; 0: one per chain
    tag: str = ""  # appended to the file stem as -TAG (TAG_PATTERN): a variant's own files

    def __post_init__(self) -> None:
        if self.tag and not TAG_PATTERN.fullmatch(self.tag):
            raise ConfigError(f"--option tag={self.tag!r}: expected lower-case letters, digits and '-', "
                              "starting with a letter or digit, at most 40")

    def stored_as(self) -> PartPrecisions:
        """What each part of APD is stored at: ``precision``, the generator networks at ``generators_at`` and
        the codec's mean at ``mean_at`` where given."""
        return PartPrecisions(self.precision, self.generators_at, self.mean_at)

    def label(self) -> str:
        """APD's row: ``APD per chain``, or ``APD told the chain`` for one generator told the chain."""
        return TOLD if self.mode_embedding else APD

    def kind(self) -> str:
        """APD's generators in words, for the table's note and the figure's title."""
        return (f"one generator told the chain by {self.mode_embedding} learned numbers" if self.mode_embedding
                else "one generator per chain")


def study_stem(plan: FrontierPlan) -> str:
    """The study's file stem: ``frontier`` for APD at the default precision (int8), ``frontier-PRECISION``
    otherwise, ``-generators-PRECISION`` and ``-mean-PRECISION`` after it for generator networks and a codec
    mean stored at another precision than the codec, ``-conditioned-E`` for one generator told the chain by E
    numbers, and ``-TAG`` last."""
    own = "".join(f"-{part}" for part in plan.stored_as().stored_otherwise("generators-{}", "mean-{}"))
    own += f"-conditioned-{plan.mode_embedding}" if plan.mode_embedding else ""
    stem = "frontier" if plan.precision == FrontierPlan.precision and not own else f"frontier-{plan.precision}{own}"
    return f"{stem}-{plan.tag}" if plan.tag else stem


@dataclass
class FrontierRun:
    """What every budget of one frontier study shares: the store, its predictions on the judged inputs, SGLD's
    reference and judged summary (``sgld``), the samples the generators are fit to (``data``), and the parts an
    interrupted run of the study finished (``finished``)."""

    ctx: RunContext
    plan: FrontierPlan
    store: SampleStore
    predictions: StoredPredictions
    inputs: EvaluationInputs
    reference: Reference
    sgld: dict
    data: TrainingSamples
    around: AroundChainMeans | None  # the storage of samples kept around their chains' means, where kept so
    finished: FinishedParts | None

    def part(self, name: str, make: Callable[[], Any]) -> Any:
        """The part ``name`` an interrupted run finished, else ``make()``, kept as finished."""
        return taken_or_made(self.finished, name, make)

    def kept_sets(self, budgets: list[int]) -> dict[int, dict[str, dict | None]]:
        """Each budget's kept samples, by what :meth:`point` names them: ``kept`` (as many float32 samples as
        the budget), ``kept at precision`` and ``kept around means`` (None where the plan has none). They are
        judged one storage after another, every budget's at one before the next storage's
        (:meth:`StoredPredictions.one_storage_at_a_time`), so that each storage's rows fit where the one before's
        were kept (past the predictions' memory a row is predicted again for every subset that draws it); each
        set draws from a seed of its budget's own, so the order does not change it."""
        plan, store = self.plan, self.store
        storages: dict[str, KeptStorage | None] = {
            "kept": "float32",
            "kept at precision": plan.precision if plan.kept_at_precision and plan.precision != "float32" else None,
            "kept around means": self.around}
        found: dict[int, dict[str, dict | None]] = {budget: dict.fromkeys(storages) for budget in budgets}
        sets = {(which, budget): storage for which, storage in storages.items() if storage is not None
                for budget in budgets}
        for which, budget in self.predictions.one_storage_at_a_time(sets):
            k = kept_for(budget, store.spec.numel, sets[which, budget], len(store))
            found[budget][which] = self.part(f"budget {budget}: {which}",
                                             functools.partial(self.judged, budget, k, sets[which, budget]))
        return found

    def judged(self, budget: int, k: int, storage: KeptStorage) -> dict:
        """k samples kept as ``storage`` stores them, and the plan's random subsets, for ``budget``."""
        log.info("budget %d: judging %d samples kept at %s and %d random subsets", budget, k, storage_key(storage),
                 self.plan.subsets)
        return kept_samples(self.predictions, k, self.inputs, self.reference, self.plan.subsets,
                            torch.Generator().manual_seed(self.ctx.seed("experiment", "frontier", budget)), storage)

    def point(self, budget: int, kept_sets: dict[str, dict | None]) -> dict:
        """APD's trainings and ceilings at ``budget`` against its kept samples ``kept_sets`` (:meth:`kept_sets`;
        :func:`frontier`)."""
        ctx, plan, store, cfg = self.ctx, self.plan, self.store, self.ctx.cfg
        spec, n, stored_as = store.spec, len(store), plan.stored_as()
        chains = len(chain_partition(store.chains)[0])
        seed = ctx.seed("experiment", "frontier", budget)
        kept, stored_kept, around_kept = (kept_sets[which] for which in ("kept", "kept at precision",
                                                                         "kept around means"))
        limit = min(n, cfg.distill.fit_samples, spec.numel)
        rank = largest_rank(lambda r: chain_generators_storage(cfg.distill, r, spec, chains, stored_as,
                                                               plan.mode_embedding), budget, limit)
        trainings, ceiling, stored_ceiling = [], None, None
        if rank:
            coordinates = functools.cache(lambda: sgld_coordinates(ctx, store, self.data, rank))
            steps = plan.steps or cfg.distill.steps

            def trained(k: int) -> dict:
                log.info("budget %d: APD rank %d, training %d of %d", budget, rank, k + 1, plan.seeds)
                t0 = time.perf_counter()
                exact = (train_conditioned_generator(ctx, store, coordinates(), steps, plan.mode_embedding, k)
                         if plan.mode_embedding else train_chain_generators(ctx, store, coordinates(), steps, k))
                stored = stored_apd(exact, stored_as)
                draws = ctx.seed(*replicated(k, "experiment", "frontier", budget))
                return {"rank": rank, "chains": chains, "seed": k, "steps": steps,
                        **self.scored(stored, apd_bytes(stored.model, stored_as), kept, draws),
                        "seconds": round(time.perf_counter() - t0, 2)}

            def as_stored() -> dict:
                decoded = coordinates().codec_at(stored_as)
                return {"rank": rank, "codec_at": plan.precision, "mean_at": stored_as.mean,
                        **self.scored(decoded, decoded.stored_bytes(), kept, seed)}

            trainings = [self.part(f"budget {budget}: training {k}", functools.partial(trained, k))
                         for k in range(plan.seeds)]
            if plan.ceiling:
                ceiling = self.part(f"budget {budget}: ceiling", lambda: {
                    "rank": rank, **self.scored(coordinates(), coordinates().stored_bytes(), kept, seed)})
                if stored_as.codec_only().rounds():
                    stored_ceiling = self.part(f"budget {budget}: ceiling as stored", as_stored)
            for summary in filter(None, (*trainings, ceiling, stored_ceiling)):
                for margins, rows in (("margins_at_precision", stored_kept), ("margins_around_means", around_kept)):
                    summary[margins] = None if rows is None else judged_margins(summary, rows, self.sgld)
        apd = trainings[0] if trainings else None
        log.info("budget %d: %s", budget, "no generator fits" if apd is None else
                 f"APD rank {rank}, wins " + ", ".join(str(t["margins"]["wins"]) for t in trainings)
                 + f" of {apd['margins']['compared']}")
        return {"budget": budget, "kept": kept, "kept_at_precision": stored_kept, "kept_around_means": around_kept,
                "apd": apd, "retrained": trainings[1:], "ceiling": ceiling,
                "ceiling_codec_at_precision": stored_ceiling}

    def scored(self, stored: Posterior, nbytes: int, kept: dict, seed: int) -> dict:
        """:func:`~apd.experiments.precision.scored` on this study's inputs and reference."""
        return scored(self.ctx, stored, nbytes, self.inputs, self.reference, kept, seed, self.sgld)


def frontier(ctx: RunContext, plan: FrontierPlan, finished: FinishedParts | None = None) -> dict:
    """APD and S kept samples at each budget S of ``plan``, judged on validation images and the OOD tuning
    pool; the results as JSON-able data. Every budget's kept sets are judged first, one storage after another
    (:meth:`FrontierRun.kept_sets`), then each budget's trainings and ceilings. Each kept set, training and
    ceiling is kept in ``finished`` once made, and one found there (an interrupted run of the same study made
    it) is taken, not made again: each draws from seeds of its own, so one taken leaves the others as they
    were."""
    cfg, e = ctx.cfg, ctx.cfg.evaluate
    require_subspace(ctx, "frontier")
    if not plan.budgets:
        raise ConfigError("--option budgets: expected at least one budget")
    require_input(ctx, ctx.layout.samples, "sample")
    started = time.perf_counter()
    inputs = evaluation_inputs(ctx, role="tuning")
    with SampleStore.open(ctx.layout.samples, expect_spec=ParamSpec.from_module(ctx.network())) as store:
        spec, n = store.spec, len(store)
        if max(plan.budgets) > n:
            raise ConfigError(f"--option budgets: the store holds {n} samples, fewer than {max(plan.budgets)}")
        predictions = StoredPredictions(store, inputs.stacked(ctx.device), ctx.device, progress=ctx.progress)
        sgld, reference = sgld_reference(ctx, predictions, inputs)
        around = (AroundChainMeans.of(store, plan.precision, plan.stored_as().mean)
                  if plan.kept_around_means and plan.precision != "float32" else None)
        run = FrontierRun(ctx, plan, store, predictions, inputs, reference, sgld,
                          training_samples(ctx, store, cfg.distill), around, finished)
        budgets = sorted(set(plan.budgets))
        kept = run.kept_sets(budgets)
        points = [run.point(budget, kept[budget]) for budget in budgets]
    return {"pipeline": cfg.name, "dataset": ctx.data.name, "dim": spec.numel, "sgld_samples": n, "runs": e.runs,
            "networks": e.networks, "ood_sets": list(inputs.ood),
            "judged_on": "validation images and the OOD tuning pool (never the test split or evaluate's OOD sets)",
            "plan": dataclasses.asdict(plan), "sgld": sgld, "points": points,
            "seconds": round(time.perf_counter() - started, 2)}


def below_kept(point: dict, method: str = "apd", kept: str = "kept") -> list[str]:
    """The yardstick summaries of :data:`SUMMARIES` on which ``method`` (``"apd"`` or ``"ceiling"``) at one
    budget is below the ``kept`` samples (``"kept"``: at float32; ``"kept_at_precision"``: at APD's
    precision; ``"kept_around_means"``: at it around their chains' means): its mean worst BALD or max-prob
    AUROC gap, NLL gap or KL wins against them (:func:`~apd.evaluation.yardstick.standing`: smaller than the
    evenly spaced and the last samples' value and a percentile rank of at least 95 among the random subsets).
    Studies written before percentile ranks (:func:`~apd.evaluation.yardstick.ranked`) are read by their rule:
    smaller than the evenly spaced samples' value and the random subsets' mean. The NLL gap is two-sided (in
    studies written before gaps per draw, signed: an NLL below SGLD's is below any NLL above it). A summary a
    kept row lacks (one kept sample has no BALD) is not below, and a point without those kept samples has
    none. APD's curve crosses the kept samples' at the budgets where it is below on all four."""
    return summary_below(point.get(method), point.get(kept))


def summary_below(summary: dict | None, rows: dict | None) -> list[str]:
    """The summaries of :data:`SUMMARIES` on which one method's yardstick ``summary`` is below the kept
    samples' ``rows`` (:func:`below_kept`)."""
    if summary is None or rows is None:
        return []
    below = []
    for key, label in SUMMARIES.items():
        ours = mean_of(summary[key])
        if ranked(rows):
            drawn = rows["random"][key]
            found = standing(ours, [rows[name][key] for name in FIXED], None if drawn is None else drawn["values"])
            if found is not None and found["beats"]:
                below.append(label)
            continue
        theirs = [mean_of(rows[kind][key]) for kind in ("evenly_spaced", "random")]
        if ours is not None and None not in theirs and all(ours < value for value in theirs):
            below.append(label)
    return below


def fewer_bytes(point: dict, kept: str) -> bool:
    """Whether the ``kept`` samples at one budget take less storage than APD there: only samples kept at
    APD's precision can, where the store holds fewer than the budget buys."""
    apd, rows = point.get("apd"), point.get(kept)
    return apd is not None and rows is not None and rows["in_sgld_samples"] < apd["in_sgld_samples"]


def trainings(point: dict) -> list[dict]:
    """APD's trainings at one budget, generator seed 0 first (none where no generator fits; studies written
    before ``seeds`` trained one)."""
    return [] if point["apd"] is None else [point["apd"], *point.get("retrained", [])]


def crossings(results: dict, kept: str = "kept", seed: int | None = None) -> list[float]:
    """The budgets at which APD (every training, or the one from generator seed ``seed``) is below both rows of
    the ``kept`` samples on every summary (:func:`below_kept`) and those samples take at least APD's storage
    (:func:`fewer_bytes`)."""
    def crosses(point: dict) -> bool:
        judged = trainings(point) if seed is None else trainings(point)[seed:seed + 1]
        return bool(judged) and not fewer_bytes(point, kept) and all(
            len(summary_below(summary, point.get(kept))) == len(SUMMARIES) for summary in judged)
    return [point["budget"] for point in results["points"] if crosses(point)]


def seeds_of(results: dict) -> int:
    """How many times the study trained APD per budget (studies written before ``seeds``: once)."""
    return results.get("plan", {}).get("seeds", 1)


def steps_of(results: dict) -> int | None:
    """Each generator's training steps: the plan's, else those its trainings record (None for a study of the
    pipeline's steps written before they were recorded)."""
    trainings = [point["apd"] for point in results["points"] if point.get("apd")]
    return results.get("plan", {}).get("steps") or next((t["steps"] for t in trainings if "steps" in t), None)


def _kept_rows(kept: dict, label: str) -> list[tuple[str, str, dict, bool]]:
    """The evenly spaced and the random rows of one set of kept samples, labelled ``label``."""
    return [(f"{label}, {name.removeprefix('kept, ')}", f"k={kept['k']}",
             {**kept[key], "in_sgld_samples": kept["in_sgld_samples"]}, False) for key, name in KEPT.items()
            if key in kept]  # studies written before percentile ranks kept no last samples


def apd_label(seed: int, seeds: int, name: str = APD) -> str:
    """APD's row ``name`` (:meth:`FrontierPlan.label`), or ``NAME, seed k`` in a study of several trainings."""
    return name if seeds == 1 else f"{name}, seed {seed}"


def kept_sets(plan: FrontierPlan) -> list[tuple[str, str, str]]:
    """(key of the point, key of a judged summary's margins, label) of each set of kept samples a study can
    hold: at float32, at APD's precision, and at it around their chains' means at APD's mean precision."""
    return [("kept", "margins", "kept"), ("kept_at_precision", "margins_at_precision", f"kept at {plan.precision}"),
            ("kept_around_means", "margins_around_means",
             f"kept at {plan.precision} around chain means at {plan.stored_as().mean}")]


def _rows(point: dict, plan: FrontierPlan, seeds: int) -> list[tuple[str, str, dict | None, bool]]:
    """(method, rank or k, its yardstick summary, whether it is judged against the kept samples) at one
    budget: APD's trainings, its ceiling where it was scored, then each set of kept samples the study holds
    (:func:`kept_sets`)."""
    apd = [(apd_label(summary.get("seed", 0), seeds, plan.label()), f"r={summary['rank']}", summary, True)
           for summary in trainings(point)] or [(plan.label(), "none fits", None, True)]
    ceilings = [(name, point.get(key)) for name, key in ceiling_rows(plan)]
    return [*apd, *((name, f"r={summary['rank']}", summary, True) for name, summary in ceilings if summary),
            *(row for key, _, label in kept_sets(plan) if point.get(key) for row in _kept_rows(point[key], label))]


def ceiling_rows(plan: FrontierPlan) -> list[tuple[str, str]]:
    """(row label, key of the point) of APD's ceilings: every sample's coordinates with the codec at float32,
    then with the codec read back from APD's precisions (studies written before it have no such key)."""
    return [(CEILING, "ceiling"),
            (CEILING_AS_STORED.format(plan.stored_as().codec_only().describe()), "ceiling_codec_at_precision")]


def _listed(budgets: list[float]) -> str:
    """``2, 4 and 8 samples' worth``, or ``no budget``."""
    at = spoken_list([f"{budget:g}" for budget in budgets])
    return f"{at} samples' worth" if at else "no budget"


MARGINS_NOTE = ("Gaps to SGLD: worst per-set AUROC gap in points (positive: below SGLD), NLL gap in nats; KL to SGLD's "
                "predictive. Wins: APD's margins over both the evenly spaced and the random kept samples larger than "
                "the random subsets' std, of the per-set BALD and max-prob AUROCs and the NLL. Below both kept: the "
                "summaries on which APD's mean is smaller than both the evenly spaced samples' value and the random "
                "subsets' mean (signed: an NLL below SGLD's counts as below); APD's curve crosses the kept samples' "
                "where it is below on all four.")  # the rule of studies written before percentile ranks
RANKED_NOTE = ("Gaps to SGLD: worst per-set absolute AUROC gap in points (above or below SGLD alike), NLL gap in nats "
               "({gaps}); KL to SGLD's predictive. Kept samples: centred in equal parts of each chain (evenly spaced), "
               "the last of each chain, and random subsets stratified by chain. Wins: the comparisons APD wins, of "
               "the per-set absolute BALD and max-prob AUROC gaps and the NLL gap. " + RANK_RULE + " Below both "
               "kept: the summaries on which APD's mean wins so; APD's curve crosses the kept samples' where it "
               "wins on all four.")


def render_table(results: dict) -> str:
    """The Markdown of ``frontier.md``: a note on the protocol and, per budget, APD and the kept samples on
    each yardstick quantity, with APD's wins over the kept samples (and over those kept at its precision,
    where the study kept them)."""
    plan, points = FrontierPlan(**results["plan"]), results["points"]
    precision, stored_as = plan.precision, plan.stored_as()
    own = stored_as.stored_otherwise("the generator networks at {}", "the codec's mean at {}")
    stored_at = f"{precision} ({', '.join(own)})" if own else precision
    rounded_as = ("APD's basis and scales are" if stored_as.mean != precision else
                  "APD's codec is" if stored_as.generators != precision else "APD is")
    codec_at = precision + (f" (its mean at {stored_as.mean})" if stored_as.mean != precision else "")
    at_precision = any(point.get("kept_at_precision") for point in points)
    held = [kept for kept in kept_sets(plan) if any(point.get(kept[0]) for point in points)]
    trained_for = f" for {steps:,} generator steps," if (steps := steps_of(results)) else ""
    note = (f"# Storage frontier on {results['pipeline']}\n\nAt each budget S (SGLD samples' worth; D = "
            f"{results['dim']:,} weights, {results['sgld_samples']:,} stored samples): APD with {plan.kind()} "
            f"in the largest shared principal subspace whose codec and generators fit S at "
            f"{stored_at}, and S SGLD samples kept at float32, evenly spaced and the mean ± std of "
            f"{plan.subsets} random subsets"
            + (f"; and ⌈S / s⌉ SGLD samples (s: one sample's storage at {precision}; at least S where the store "
               f"holds that many), each stored at {precision} as {rounded_as}" if at_precision else "")
            + (f"; and the fewest SGLD samples that take at least S stored at {precision} each as its deviation "
               f"from its chain's mean, the means of the chains they come from at {stored_as.mean} (k samples of "
               "j chains: k deviations and j means), as APD's codec rounds about a mean it keeps"
               if any(point.get("kept_around_means") for point in points) else "")
            + (f". APD trained{trained_for} once per budget (one seed: its spread is the draws', not the training's); "
               if seeds_of(results) == 1 else
               f". APD trained{trained_for} {seeds_of(results)} times per budget, from generator seeds 0 to "
               f"{seeds_of(results) - 1} (a crossing counts where every training crosses); ")
            + f"{results['runs']} runs × {results['networks']} networks per APD "
            f"draw (mean ± std over runs); judged on validation images and the OOD tuning pool "
            f"({' / '.join(results['ood_sets'])}). "
            + (RANKED_NOTE.format(gaps=GAPS_PER_DRAW[per_draw(point.get("apd") for point in points)])
               if ranked(points[0]["kept"]) else MARGINS_NOTE)
            + (" APD's ceiling: every SGLD sample's own coordinates in APD's subspace at float32, the best a "
               "generator there can do; its storage column counts every sample's coordinates, so it is not held to "
               "the budget."
               if any(point.get("ceiling") for point in points) else "")
            + (f" As stored: the same coordinates decoded by the codec read back from {codec_at}, as APD's "
               f"generators' codes are, the best a generator whose codec is stored at {codec_at} can do."
               if any(point.get("ceiling_codec_at_precision") for point in points) else "") + "\n\n")
    header = ["budget", "method", "rank / k", "storage", *GAPS.values(), "KL",
              *(column for _, _, label in held for column in (f"wins over {label}", f"below both {label}"))]
    body = []
    for point in points:
        for method, size, summary, judged in _rows(point, plan, seeds_of(results)):
            kl = None if summary is None else summary["kl"]
            body.append([f"{point['budget']:g}", method, size,
                         format_sample_count(None if summary is None else summary["in_sgld_samples"]),
                         *(MISSING if summary is None else format_gap(summary[gap], 3 if gap == "nll_gap" else 1)
                           for gap in GAPS),
                         mean_std(kl, 4) if isinstance(kl, dict) else format_number(kl, 4),
                         *(cell for kept, margins, _ in held
                           for cell in _judged_cells(point, summary, judged, margins, kept))])
    every = "" if seeds_of(results) == 1 else f" in every one of its {seeds_of(results)} trainings"
    verdict = f"\nAPD is below both kept rows on all four summaries{every} at {_listed(crossings(results))}"
    verdict += _by_seed(results, "kept")
    for kept, _, label in held[1:]:
        verdict += (f"; below both rows of the samples {label}, with at least its storage,{every} at "
                    f"{_listed(crossings(results, kept))}" + _by_seed(results, kept))
    for kept, _, label in held[1:]:
        short = [point["budget"] for point in points if fewer_bytes(point, kept)]
        if short:
            verdict += (f". At {_listed(short)} the samples {label} take less storage than APD, so no "
                        "crossing is counted there")
    return note + markdown_table(header, body) + "\n" + verdict + ".\n"


def _by_seed(results: dict, kept: str) -> str:
    """`` (seed by seed: 2 and 4; 2; none)`` after a verdict over several trainings: the budgets each crosses."""
    if seeds_of(results) == 1:
        return ""
    each = [_listed_budgets(crossings(results, kept, k)) for k in range(seeds_of(results))]
    return f" (seed by seed: {'; '.join(each)})"


def _judged_cells(point: dict, summary: dict | None, judged: bool, margins: str, kept: str) -> list[str]:
    """The wins and below-both cells of one row against one set of kept samples: dashes for a kept row."""
    if not judged:
        return ["—", "—"]
    won = summary.get(margins) if summary else None
    return ["—" if won is None else f"{won['wins']} of {won['compared']}",
            ", ".join(summary_below(summary, point.get(kept))) or "none"]


def render_summary(results_by_pipeline: dict[str, dict]) -> str:
    """One row per pipeline's frontier: its weights, chains (one generator or one embedding each), APD's
    trainings per budget, budgets and APD's ranks, the budgets at which APD (every training) is below both
    float32 kept rows on all four summaries (:func:`crossings`), those at which it is below the samples kept
    at its own precision, whole and around their chains' means ("—" where the study kept none so), and its
    set-by-set wins against the float32 ones at each budget (fewest to most over the trainings)."""
    body = []
    for name, results in results_by_pipeline.items():
        points = results["points"]
        chains = next((str(p["apd"]["chains"]) for p in points if p["apd"] is not None), "–")
        at_precision = [_listed_budgets(crossings(results, kept)) if any(p.get(kept) for p in points) else "—"
                        for kept in ("kept_at_precision", "kept_around_means")]
        body.append([f"`{name}`", f"{results['dim']:,}", chains, str(seeds_of(results)),
                     ", ".join(f"{p['budget']:g}" for p in points),
                     ", ".join("–" if p["apd"] is None else str(p["apd"]["rank"]) for p in points),
                     _listed_budgets(crossings(results)), *at_precision, ", ".join(map(_wins, points))])
    header = ["pipeline", "weights", "chains", "APD trainings", "budgets (samples' worth)", "APD's ranks",
              "below both float32 kept on all four at", "below both kept at APD's precision on all four at",
              "… around chain means at APD's mean precision", "set-by-set wins (float32 kept)"]
    return markdown_table(header, body)


def _wins(point: dict) -> str:
    """APD's set-by-set wins over the float32 kept samples at one budget: ``4/9``, ``3–5/9`` over several
    trainings, ``–`` where no generator fits."""
    won = sorted(summary["margins"]["wins"] for summary in trainings(point))
    if not won:
        return "–"
    return f"{won[0]}{'' if won[0] == won[-1] else f'–{won[-1]}'}/{point['apd']['margins']['compared']}"


def _listed_budgets(budgets: list[float]) -> str:
    """``2, 4, 8``, or ``none``."""
    return ", ".join(f"{budget:g}" for budget in budgets) or "none"


def draw_figure(results: dict, path: Path) -> None:
    """One panel per yardstick gap against storage (log scale): APD's curve (mean ± std over runs; one curve
    per training, the same colour) and the kept samples' (evenly spaced; the random subsets' mean ± std), at
    float32 and at APD's precision, whole and around their chains' means, where the study kept those, where the
    gap is defined."""
    plan, seeds = FrontierPlan(**results["plan"]), seeds_of(results)
    trained_as = [apd_label(k, seeds, plan.label()) for k in range(seeds)]
    ceilings = [name for name, _ in ceiling_rows(plan)]
    # (colour, line, marker): APD's trainings C0 with a marker each; a colour per set of kept samples, a line
    # per selection; a colour per ceiling
    style = {name: ("C0", "-", "os^Dv<>p"[k % 8]) for k, name in enumerate(trained_as)}
    sets = kept_sets(plan)
    for colour, (_, _, label) in enumerate(sets, start=1):
        style.update({f"{label}, {name.removeprefix('kept, ')}": (f"C{colour}", line, "o")
                      for name, line in zip(KEPT.values(), ("-", ":", "--"), strict=True)})
    style.update({name: (f"C{colour}", "-.", "D") for colour, name in enumerate(ceilings, start=len(sets) + 1)})
    figure, axes = new_figure(1, 3, panel=(5.2, 3.9))
    for ax, key in zip(axes[0], GAPS, strict=True):
        for method, (colour, line, marker) in style.items():
            xs, ys, errors = [], [], []
            for point in results["points"]:
                summary = next((s for name, _, s, _ in _rows(point, plan, seeds) if name == method), None)
                value = None if summary is None else summary[key]
                if value is not None:  # one kept sample has no BALD; older studies have no ceiling
                    # the ceiling at APD's budget, not at its own storage (all the samples' coordinates)
                    xs.append(point["budget"] if method in ceilings else summary["in_sgld_samples"])
                    ys.append(mean_of(value))
                    errors.append(std_of(value))
            if xs:
                ax.errorbar(xs, ys, yerr=errors, marker=marker, capsize=3, color=colour, label=method,
                            linestyle=line)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        budgets = [point["budget"] for point in results["points"]]
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
        ax.minorticks_off()
        ax.set(xlabel="storage (SGLD samples' worth)", ylabel=gap_axis_label(key))
    figure_legend(figure, loc="outside lower center", ncols=4)
    own = plan.stored_as().stored_otherwise()
    generators = f" ({', '.join(own)})" if own else ""
    trained = "" if seeds == 1 else f", {seeds} trainings"
    figure.suptitle(f"{results['pipeline']}: APD, {plan.kind()}, at {plan.precision}{generators}{trained}, "
                    "against as many kept SGLD samples")
    save_figure(figure, path)


def run_frontier(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment frontier``: compare, write ``experiments/STEM.{json,md,png}`` (:func:`study_stem`) with
    the study's provenance, print the table; resumes a run of the same study cut short (:func:`study_parts`)."""
    plan = plan_from_options(options, FrontierPlan)
    finished = study_parts(ctx, study_stem(plan), plan)
    results = {**frontier(ctx, plan, finished), "provenance": provenance(ctx)}
    write_study(ctx.layout.experiments, study_stem(plan), results, render_table, draw_figure, show=not ctx.quiet)
    finished.remove()
    return results
