"""APD's generator seeds judged alike (``[distill] seeds`` = K > 1): what one trained generator cannot say
is whether another training run of the same distiller would stand where it stands.

Each seed k's generator (:meth:`~apd.pipeline.layout.Layout.generator_of`) is drawn over the evaluation's
R runs (its own draw stream, :func:`apd.pipeline.seeds.replicated`; seed 0's runs are those of the main
tables) and summarised as the main tables summarise a method: accuracy, NLL and mean BALD AUROC (means over
runs), its gaps to SGLD (each the mean over runs of a run's gap: :func:`apd.evaluation.yardstick.drawn_quality`),
and against the same kept samples as seed 0 (⌈S⌉ float32 samples, and those a lower storage precision buys)
each gap's standing
(:func:`~apd.evaluation.yardstick.summary_standings`: percentile rank among the random subsets, win) and the
set-by-set comparisons (:func:`~apd.evaluation.yardstick.ranks_over_kept`).

Across the K seeds every value has its mean and sample standard deviation

    s = sqrt(Σ_k (v_k − v̄)² / (K − 1))   (ddof 1: the seeds are a sample of the distiller's training runs),

and a win is counted for the distiller only where every seed wins; otherwise the reports say "k of K".
"""

from __future__ import annotations

import numpy as np
import torch

from apd.evaluation.protocol import EvaluationInputs, Judgement, judge
from apd.evaluation.yardstick import (
    GAP_KEYS,
    SCORES,
    Reference,
    drawn_quality,
    ranks_over_kept,
    summarise,
    summary_standings,
)
from apd.methods import MethodName
from apd.nets import ParamSpec
from apd.pipeline.methods import apd_generator
from apd.pipeline.results import kept_keys
from apd.pipeline.runtime import RunContext
from apd.pipeline.seeds import replicated

STD_RULE = "sample standard deviation over the generator seeds (ddof 1)"
VALUE_KEYS = ("acc", "nll", "mean_bald_auroc", *GAP_KEYS)  # a seed's own values, each with mean ± std across seeds


def seed_summary(runs: list[Judgement], reference: Reference, kept: dict[str, dict]) -> dict:
    """One seed's summary over its ``runs``: :data:`VALUE_KEYS`, per-set AUROCs (score → set → mean over runs,
    percent), and against each kept-samples row of ``kept`` (size key → a
    :func:`~apd.evaluation.yardstick.kept_samples` row) its ``standings`` on every gap and its ``set_by_set``
    comparisons."""
    summaries = [summarise(j, reference) for j in runs]
    aurocs = {score: {name: None if value is None else float(np.mean([r["auroc"][score][name] for r in summaries]))
                      for name, value in summaries[0]["auroc"][score].items()} for score in SCORES}
    own = drawn_quality(summaries)
    bald = list(aurocs["bald"].values())
    sgld = {"bald": reference.bald_auroc, "max_prob": reference.max_prob_auroc}
    return {"acc": float(np.mean([s["acc"] for s in summaries])), "nll": float(np.mean([s["nll"] for s in summaries])),
            "mean_bald_auroc": None if None in bald else float(np.mean(bald)), **own, "auroc": aurocs,
            "against": {size: {"standings": summary_standings(own, row),
                               "set_by_set": ranks_over_kept(own["set_gaps"], own["nll_gap"], row, sgld)}
                        for size, row in kept.items()}}


def across(values: list[float | None]) -> dict | None:
    """Mean, sample std (ddof 1) and every value of one summary over the seeds; None where a seed lacks it."""
    if any(v is None for v in values):
        return None
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)), "values": list(values)}


def across_seeds(seeds: list[dict]) -> dict:
    """What the seeds' summaries (:func:`seed_summary`) give together: each value's :func:`across`; against
    each kept row, each gap's percentile rank :func:`across` and ``beats`` (how many seeds win it), each
    set-by-set comparison's ``beats``, every seed's ``wins`` and ``wins_every_seed`` (the comparisons all
    seeds win), of ``compared``."""
    out: dict = {"values": {key: across([s[key] for s in seeds]) for key in VALUE_KEYS}, "against": {}}
    for size in seeds[0]["against"]:
        standings = [s["against"][size]["standings"] for s in seeds]
        by_set = [s["against"][size]["set_by_set"] for s in seeds]

        def beats(found: list[dict | None]) -> int | None:
            return None if any(f is None for f in found) else sum(f["beats"] for f in found)

        first = by_set[0]
        comparisons = {"auroc": {score: {name: beats([b["auroc"][score][name] for b in by_set])
                                         for name in sets} for score, sets in first["auroc"].items()},
                       "nll": beats([b["nll"] for b in by_set])}
        counts = [c for sets in comparisons["auroc"].values() for c in sets.values() if c is not None]
        counts.append(comparisons["nll"])
        out["against"][size] = {
            "percentile": {key: None if beats([s[key] for s in standings]) is None else
                           across([s[key]["percentile"] for s in standings]) for key in GAP_KEYS},
            "beats": {key: beats([s[key] for s in standings]) for key in GAP_KEYS},
            "set_by_set": comparisons, "wins": [b["wins"] for b in by_set],
            "wins_every_seed": sum(c == len(seeds) for c in counts), "compared": first["compared"]}
    return out


def replicate_apd(ctx: RunContext, spec: ParamSpec, inputs: EvaluationInputs, members: int,
                  first: list[Judgement], reference: Reference, yardstick: dict) -> dict:
    """Every generator seed of ``[distill] seeds`` (module docstring): seed 0 from its runs ``first`` (the main
    tables'), seed k ≥ 1 drawn ``runs`` times with ``members`` networks; each against the kept-samples rows
    the yardstick set APD against (``yardstick``: its results); and across the seeds."""
    e, count = ctx.cfg.evaluate, ctx.cfg.distill.seeds
    entry = yardstick["equal_storage"].get(MethodName.APD)  # none where APD stores the whole store or more
    sizes = [] if entry is None else kept_keys(entry)
    kept = {size: yardstick["kept"][size] for size in sizes}
    seeds = []
    for k in ctx.progress(range(count), desc="APD seeds", unit="seed"):
        runs = first
        if k:
            method = apd_generator(ctx, spec, k)
            generator = torch.Generator().manual_seed(ctx.seed(*replicated(k, "evaluate", "draws", MethodName.APD)))
            runs = [judge(method, inputs, members, generator, SCORES) for _ in range(e.runs)]
        seeds.append({"seed": k, "generator": ctx.layout.generator_of(k).name, **seed_summary(runs, reference, kept)})
    return {"seeds": count, "std": STD_RULE, "per_seed": seeds, **across_seeds(seeds)}
