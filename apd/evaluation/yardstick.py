"""The kept-samples yardstick (docs/design.md, "Honest protocol"): what a method that stores S SGLD
samples' worth of numbers must beat is ⌈S⌉ SGLD samples simply kept.

Quality of an ensemble, against SGLD (the reference); every summary is a gap, smaller is better:

- ``bald_gap``: the worst per-set absolute gap to SGLD's BALD AUROC, max_o |AUROC_SGLD,o − AUROC_o|, in
  percent points over the OOD sets o (two-sided: detecting an OOD set better than SGLD is as far from SGLD as
  detecting it worse; None for one network, which has no BALD);
- ``max_prob_gap``: the same for the max-probability score (1 − max p̄, the paper's "variation ratio");
- ``nll_gap``: |NLL − NLL_SGLD| on the test set (nats; two-sided: a lower NLL than SGLD's is as far from SGLD
  as a higher one);
- ``kl``: (1/N) Σ_n KL(p̄_SGLD(· | x_n) ‖ p̄(· | x_n)) on the N test inputs, and ``kl_ood`` the same on
  each OOD set's inputs, averaged over the sets;
- ``input_bald_gap``: (1/N) Σ_n |I(x_n) − I_SGLD(x_n)| on the test inputs, I the per-input BALD
  H[p̄] − (1/K) Σ_k H[p_k] (nats), and ``input_bald_gap_ood`` the same on each OOD set, averaged over the
  sets (:func:`apd.distillation.selection.function_space_gap`'s two terms, here on the final inputs).

AUROC and NLL references are SGLD's own evaluated numbers (its ensemble size, mean over runs); p̄_SGLD and
I_SGLD are those of (up to a cap) every stored sample. Every gap is one ensemble's: a random subset's is that
of one draw of k kept samples, and a method judged over R runs (R draws of its ensemble) has the mean of its
R draws' gaps (:func:`drawn_quality`), the gap one draw of it has on average — not the gap of its runs'
mean AUROC, which is smaller wherever the draws scatter about SGLD's value. :func:`kept_samples` measures
k kept samples three ways: centred in equal parts of each chain (``evenly_spaced``), the last samples of
each chain (``last``), and ``subsets`` random subsets stratified by chain (``random``: mean, std, 5–95 %
band and every subset's value); :func:`kept_curve` does so for several k.

A method's standing against its ⌈S⌉ kept samples (:func:`standing`) is its **percentile rank** among the
random subsets, :func:`percentile_rank`: the percentage of subsets whose gap is strictly larger than the
method's, ties counted half. It **wins** a comparison where its gap is smaller than both fixed selections'
(evenly spaced and last) and its percentile rank is at least :data:`WIN_PERCENTILE` (better than 95 % of
random subsets: a method judged once that is one more random subset does so 5 % of the time, one judged as
the mean gap of R draws of random subsets far less often, as its mean gap sits near the subsets' mean).
:func:`ranks_over_kept` counts the wins set by set (each score's absolute AUROC gap per OOD set, averaged
over the method's draws) and on the NLL gap. Nothing is
chosen here: these are the final report's numbers on the test split and the reported OOD sets. No paths, no
run context: callers pass the store's predictions (:class:`~apd.evaluation.stored.StoredPredictions`, each
stored sample predicted once for the reference and every kept subset), the inputs and generators.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from apd.distillation.selection import PROBABILITY_FLOOR
from apd.evaluation.kept_storage import KeptStorage, kept_worth, storage_key
from apd.evaluation.protocol import EvaluationInputs, Judgement, judge_probs
from apd.evaluation.stability import IN_SET, ChainSums, chain_sums
from apd.evaluation.stored import NO_BAR, MemberBuffers, StoredPredictions
from apd.metrics import Stat, auroc, mean_of
from apd.posteriors.kept import evenly_spaced_rows, last_rows, random_rows

SCORES = ["bald", "max_prob"]  # the scores whose AUROC gaps define quality
FUNCTION_KEYS = ("kl", "kl_ood", "input_bald_gap", "input_bald_gap_ood")  # the function-space gaps
GAP_KEYS = ("bald_gap", "max_prob_gap", "nll_gap", *FUNCTION_KEYS)  # every summary; smaller is better
SUMMARY_KEYS = ("acc", "nll", "mean_bald_auroc", *GAP_KEYS)
WIN_PERCENTILE = 95.0  # a win: better than this percentage of the random subsets (and both fixed selections)
BAND = (5.0, 95.0)  # the random subsets' band, percentiles
FIXED = ("evenly_spaced", "last")  # the fixed selections of kept samples
RANK_RULE = ("Percentile rank: the percentage of the random subsets whose gap is strictly larger than the method's, "
             "ties counted half; band: the subsets' 5–95 % range. A win: a gap smaller than both the evenly spaced "
             f"and the last samples' and a percentile rank of at least {WIN_PERCENTILE:g}.")


# how a study's note describes its NLL and per-set gaps, by whether its summaries hold gaps per draw (set_gaps)
GAPS_PER_DRAW = {True: "two-sided; a method's NLL and per-set AUROC gaps are the means of its draws' gaps",
                 False: "signed; a method's per-set AUROC gaps are those of its draws' mean AUROCs, as studies "
                        "written before gaps per draw have them"}


def per_draw(summaries: Iterable[dict | None]) -> bool:
    """Whether the judged summaries of a study hold gaps per draw (``set_gaps``: :func:`summarise`)."""
    return any(summary is not None and "set_gaps" in summary for summary in summaries)


@dataclass(frozen=True)
class Reference:
    """SGLD's side: per-set AUROC (percent) of BALD and max_prob, test NLL, and on the test inputs
    (``"test"``) and each OOD set the predictive p̄ [n, C] (``predictive``) and per-input BALD [n]
    (``information``) of ``samples`` stored samples, float64 on the CPU."""

    bald_auroc: dict[str, float]
    max_prob_auroc: dict[str, float]
    nll: float
    predictive: dict[str, Tensor]
    information: dict[str, Tensor]
    samples: int


def reference_sums(stored: StoredPredictions, inputs: EvaluationInputs, limit: int, chunk: int = 200) -> ChainSums:
    """Per-chain sums (:class:`~apd.evaluation.stability.ChainSums`) on every set of ``inputs`` of the
    K = min(limit, len(store)) samples of :func:`~apd.posteriors.kept.evenly_spaced_rows` (all of them when the
    store is no larger), taken ``chunk`` at a time from ``stored`` (the store's predictions on
    ``inputs.stacked()``): SGLD's reference, and the split-half stability of its numbers. Taken in more than one
    chunk, they move a bar of ``stored.progress`` (predicting fcNN1's takes most of a minute on a CPU)."""
    rows = evenly_spaced_rows(len(stored), min(limit, len(stored)))
    counted = stored.progress if len(rows) > chunk else NO_BAR
    with counted(total=len(rows), desc="SGLD's reference", unit="network") as bar:

        def members(part: np.ndarray) -> tuple[Tensor, Tensor]:
            found = stored.members(part)
            bar.update(len(part))
            return found

        return chain_sums(members, rows, stored.store.chains[rows], inputs.parts(), chunk)


def reference_predictive(sums: ChainSums) -> tuple[dict, dict, int]:
    """p̄_SGLD and I_SGLD = H[p̄_SGLD] − (1/K) Σ_k H[p_k] of every chain's samples in ``sums`` pooled, on the
    test inputs (``"test"``) and each OOD set (float64, CPU; the in-distribution side left out); and K."""
    predictive, information = sums.pooled(list(range(len(sums.ids))))
    named = [name for name in predictive if name != IN_SET]
    return ({name: predictive[name] for name in named}, {name: information[name] for name in named},
            int(sums.counts.sum()))


def kl_to_reference(probs: Tensor, reference: Tensor) -> float:
    """(1/N) Σ_n KL(p̄_SGLD(· | x_n) ‖ p̄(· | x_n)) in nats of a predictive ``probs`` [N, C] against
    SGLD's ``reference`` [N, C] on the same inputs."""
    ref = reference.clamp_min(PROBABILITY_FLOOR)
    probs = probs.detach().double().cpu().clamp_min(PROBABILITY_FLOOR)
    return float((ref * (ref.log() - probs.log())).sum(-1).mean())


def function_gaps(predictive: dict[str, Tensor], information: dict[str, Tensor],
                  reference: Reference) -> dict[str, float]:
    """The function-space gaps :data:`FUNCTION_KEYS` (module docstring) of an ensemble's predictive and
    per-input BALD on the test inputs (``"test"``) and the OOD sets, against SGLD's; the ``_ood`` ones are
    None without OOD sets."""
    sets = [name for name in reference.predictive if name != "test"]

    def kl(name: str) -> float:
        return kl_to_reference(predictive[name], reference.predictive[name])

    def bald_gap(name: str) -> float:
        return float((information[name].double().cpu() - reference.information[name]).abs().mean())

    return {"kl": kl("test"), "kl_ood": float(np.mean([kl(s) for s in sets])) if sets else None,
            "input_bald_gap": bald_gap("test"),
            "input_bald_gap_ood": float(np.mean([bald_gap(s) for s in sets])) if sets else None}


def worst_gap(reference: dict[str, float], values: dict[str, float | None]) -> float | None:
    """max over sets of |reference − value| (percent points); None when any value is undefined."""
    if not reference or any(values.get(name) is None for name in reference):
        return None
    return max(abs(reference[name] - values[name]) for name in reference)


def quality(bald_auroc: dict[str, float | None], max_prob_auroc: dict[str, float | None], nll: float,
            function: dict[str, float | None], reference: Reference) -> dict[str, float | None]:
    """:data:`GAP_KEYS` (module docstring) of AUROCs in percent, an NLL and the :func:`function_gaps`
    ``function``."""
    return {"bald_gap": worst_gap(reference.bald_auroc, bald_auroc),
            "max_prob_gap": worst_gap(reference.max_prob_auroc, max_prob_auroc),
            "nll_gap": abs(nll - reference.nll), **{key: function[key] for key in FUNCTION_KEYS}}


def summarise(judgement: Judgement, reference: Reference) -> dict[str, float | None]:
    """Accuracy, NLL, mean BALD AUROC (percent, over the OOD sets), :func:`quality`, the per-set AUROCs
    (``auroc``: score → set) and their gaps |AUROC_SGLD,o − AUROC_o| (``set_gaps``; None where the ensemble or
    SGLD has no such score) of one judgement."""
    aurocs = {score: judgement.set_aurocs(score) for score in SCORES}
    sgld = {"bald": reference.bald_auroc, "max_prob": reference.max_prob_auroc}
    bald = [v for v in aurocs["bald"].values() if v is not None]
    return {"acc": judgement.accuracy["acc"], "nll": judgement.accuracy["nll"],
            "mean_bald_auroc": float(np.mean(bald)) if len(bald) == len(aurocs["bald"]) and bald else None,
            **quality(aurocs["bald"], aurocs["max_prob"], judgement.accuracy["nll"],
                      function_gaps(judgement.predictive, judgement.information, reference), reference),
            "auroc": aurocs,
            "set_gaps": {score: {name: None if value is None or name not in sgld[score] else
                                 abs(sgld[score][name] - value) for name, value in by_set.items()}
                         for score, by_set in aurocs.items()}}


def drawn_quality(summaries: list[dict]) -> dict:
    """A method's gaps over its R draws (each draw's :func:`summarise`): the mean over the draws (of
    :func:`spread`) of each of :data:`GAP_KEYS`, the gap one draw has on average, and of each per-set AUROC gap
    (``set_gaps``, score → set, percent points), what :func:`ranks_over_kept` ranks; None where a draw lacks
    the value."""
    drawn = spread(summaries)
    return {**{key: mean_of(drawn[key]) for key in GAP_KEYS},
            "set_gaps": {score: {name: mean_of(stat) for name, stat in by_set.items()}
                         for score, by_set in drawn["set_gaps"].items()}}


def _mean_std(values: list[float | None]) -> dict[str, float] | None:
    return None if any(v is None for v in values) else {"mean": float(np.mean(values)), "std": float(np.std(values))}


def stored_value(value: float) -> float:
    """A subset's gap as results store it, to 6 significant digits; a method's gap is ranked at the same
    precision, so that a gap equal to the subsets' (one network's BALD, 0 for all) is a tie."""
    return float(f"{value:.6g}")


def _with_band(values: list[float | None]) -> dict | None:
    """:func:`_mean_std` with the :data:`BAND` percentiles (``p5``, ``p95``) and every value
    (:func:`stored_value`)."""
    found = _mean_std(values)
    if found is None:
        return None
    low, high = np.percentile(values, BAND)
    return {**found, "p5": float(low), "p95": float(high), "values": [stored_value(v) for v in values]}


def spread(summaries: list[dict], band: bool = False) -> dict:
    """Mean and population std over ``summaries`` of each :data:`SUMMARY_KEYS` value, of each per-set AUROC
    (``auroc``: score → set → mean and std) and of each per-set AUROC gap (``set_gaps``), None where
    undefined. With ``band`` (random subsets),
    the gaps :data:`GAP_KEYS` and the per-set AUROCs also get their 5–95 % band and every value
    (:func:`percentile_rank` needs them)."""
    ranked = _with_band if band else _mean_std
    out: dict = {key: (ranked if key in GAP_KEYS else _mean_std)([s[key] for s in summaries]) for key in SUMMARY_KEYS}
    first = summaries[0]["auroc"]
    out["auroc"] = {score: {name: ranked([s["auroc"][score][name] for s in summaries]) for name in first[score]}
                    for score in first}
    gaps = summaries[0]["set_gaps"]
    out["set_gaps"] = {score: {name: _mean_std([s["set_gaps"][score][name] for s in summaries]) for name in by_set}
                       for score, by_set in gaps.items()}
    return out


def percentile_rank(gap: float, subsets: Iterable[float]) -> float:
    """The percentile rank of a method's ``gap`` among the random subsets' gaps g_1 … g_J (smaller is
    better): P = 100 · (#{j: g_j > gap} + ½ · #{j: g_j = gap}) / J, the percentage of subsets the method
    beats, ties counted half. P = 100: better than every subset; 50: the median subset's equal."""
    values = np.asarray(list(subsets), dtype=np.float64)
    return float(100.0 * (np.sum(values > gap) + 0.5 * np.sum(values == gap)) / values.size)


def standing(gap: float | None, fixed: list[float | None], subsets: list[float] | None) -> dict | None:
    """A method's ``gap`` against its kept samples: the fixed selections' gaps ``fixed`` (evenly spaced,
    last), the random subsets' gaps ``subsets``; its percentile rank among them (:func:`percentile_rank`, both
    at :func:`stored_value`'s precision), their 5–95 % band and ``beats``: smaller than every fixed gap and a
    percentile rank of at least :data:`WIN_PERCENTILE`. None where a gap is undefined."""
    if gap is None or subsets is None or any(g is None for g in fixed):
        return None
    rank = percentile_rank(stored_value(gap), [stored_value(g) for g in subsets])
    low, high = np.percentile(subsets, BAND)
    return {"gap": gap, "fixed": list(fixed), "percentile": rank, "band": [float(low), float(high)],
            "beats": rank >= WIN_PERCENTILE and all(gap < g for g in fixed)}


def summary_standings(own: dict, kept: dict) -> dict:
    """:func:`standing` of a method's summaries ``own`` (its :func:`quality`, plain values or means over
    runs) on each of :data:`GAP_KEYS` against a :func:`kept_samples` row."""
    drawn = kept["random"]
    return {key: standing(mean_of(own.get(key)), [kept[name][key] for name in FIXED],
                          None if drawn[key] is None else drawn[key]["values"]) for key in GAP_KEYS}


def ranks_over_kept(own_gaps: dict[str, dict[str, float | None]], own_nll_gap: float, kept: dict,
                    reference_auroc: dict[str, dict[str, float]]) -> dict:
    """A method against its ⌈S⌉ kept samples (a :func:`kept_samples` row), set by set: for each score of
    ``own_gaps`` (score → set → the method's AUROC gap to SGLD's, percent points: :func:`drawn_quality`'s
    ``set_gaps``) and set, and for its NLL gap ``own_nll_gap``, a :func:`standing` against the kept samples'
    gaps (|AUROC − SGLD's| from ``reference_auroc``; the NLL gaps as the row holds them). ``wins`` counts the
    comparisons beaten among the ``compared`` ones that are defined (a score one network cannot have is
    left out)."""
    def gap(value: float | None, ref: float) -> float | None:
        return None if value is None else abs(value - ref)

    def against(score: str, name: str, own: float | None) -> dict | None:
        if own is None:  # a score the method cannot have, or one the run did not compute
            return None
        ref, drawn = reference_auroc[score][name], kept["random"]["auroc"][score].get(name)
        return standing(own, [gap(kept[fixed]["auroc"][score].get(name), ref) for fixed in FIXED],
                        None if drawn is None else [abs(v - ref) for v in drawn["values"]])

    auroc = {score: {name: against(score, name, value) for name, value in by_set.items()}
             for score, by_set in own_gaps.items()}
    nll = standing(own_nll_gap, [kept[fixed]["nll_gap"] for fixed in FIXED], kept["random"]["nll_gap"]["values"])
    found = [m for by_set in auroc.values() for m in by_set.values() if m is not None] + [nll]
    return {"auroc": auroc, "nll": nll, "wins": sum(m["beats"] for m in found), "compared": len(found),
            "rule": f"percentile rank ≥ {WIN_PERCENTILE:g} and below both fixed selections"}


def _margin(own: float | None, kept: float | None, drawn: dict[str, float] | None, sign: float) -> dict | None:
    if own is None or kept is None or drawn is None:
        return None
    random = Stat.of(drawn)
    over_kept, over_random = sign * (own - kept), sign * (own - random.mean)
    return {"over_kept": over_kept, "over_random": over_random, "random_std": random.std,
            "beats": min(over_kept, over_random) > random.std}


def margins_over_kept(own_auroc: dict[str, dict[str, float | None]], own_nll: float, kept: dict) -> dict:
    """The comparison of results written before :func:`ranks_over_kept` (their random subsets hold only a
    mean and std), kept so that those results still render: for each score of ``own_auroc`` (score → set →
    AUROC, percent) and set, and for the NLL, the margin over the evenly spaced samples and over the random
    subsets' mean (positive: the method is better; AUROC higher, NLL lower), the subsets' std, and
    ``beats``: both margins larger than that std. ``wins`` counts the comparisons beaten among the
    ``compared`` ones that are defined."""
    even, drawn = kept["evenly_spaced"], kept["random"]
    auroc = {score: {name: _margin(value, even["auroc"][score].get(name), drawn["auroc"][score].get(name), 1.0)
                     for name, value in by_set.items()} for score, by_set in own_auroc.items()}
    nll = _margin(own_nll, even["nll"], drawn["nll"], -1.0)
    found = [m for by_set in auroc.values() for m in by_set.values() if m is not None] + ([nll] if nll else [])
    return {"auroc": auroc, "nll": nll, "wins": sum(m["beats"] for m in found), "compared": len(found)}


def ranked(kept: dict) -> bool:
    """Whether a :func:`kept_samples` row holds every random subset's value (and the last samples): rows
    written before percentile ranks hold only the subsets' mean and std."""
    return "last" in kept


def wins_over_kept(own: dict, own_auroc: dict[str, dict[str, float | None]], own_nll: float, kept: dict,
                   reference_auroc: dict[str, dict[str, float]]) -> dict:
    """A method's comparisons with a :func:`kept_samples` row by the rule its results were reported by: with
    percentile ranks (:func:`ranked`), :func:`ranks_over_kept` of the method's :func:`quality` ``own`` (its
    ``set_gaps`` per draw; results written before them, the gaps of ``own_auroc``, the runs' mean AUROCs,
    and their signed NLL gap); else :func:`margins_over_kept` of ``own_auroc`` and ``own_nll``."""
    if not ranked(kept):
        return margins_over_kept(own_auroc, own_nll, kept)
    gaps = own.get("set_gaps") or {score: {name: None if value is None else abs(value - reference_auroc[score][name])
                                           for name, value in by_set.items()} for score, by_set in own_auroc.items()}
    return ranks_over_kept(gaps, own["nll_gap"], kept, reference_auroc)


@torch.no_grad()
def judge_rows(stored: StoredPredictions, rows: np.ndarray, inputs: EvaluationInputs, reference: Reference,
               storage: KeptStorage = "float32", buffers: MemberBuffers | None = None) -> dict[str, float | None]:
    """:func:`summarise` of the ensemble of the store's ``rows``, each row stored as ``storage`` is
    (:mod:`apd.evaluation.kept_storage`), their predictions and entropies from ``stored`` (on
    ``inputs.stacked()``), stacked into ``buffers`` where given (:meth:`StoredPredictions.member_buffers`)."""
    probs, entropies = stored.members(rows, storage, buffers)
    doubled = None if buffers is None else buffers.doubled.copy_(probs)
    return summarise(judge_probs(probs, inputs, SCORES, auroc, entropies, doubled), reference)


def kept_samples(stored: StoredPredictions, k: int, inputs: EvaluationInputs, reference: Reference, subsets: int,
                 generator: torch.Generator, storage: KeptStorage = "float32") -> dict:
    """k kept samples of ``stored``'s store, each stored as ``storage`` is (a precision, or around its chain's
    mean: :mod:`apd.evaluation.kept_storage`): centred in equal parts of each chain
    (``evenly_spaced``), each chain's last samples (``last``), and over ``subsets`` random subsets stratified by
    chain (``random``: :func:`spread` with the band and every subset's value); their storage in SGLD samples'
    worth (:mod:`apd.posteriors.kept` for the three selections)."""
    store = stored.store
    n, dim, chains = len(store), store.spec.numel, store.chains
    fixed = {"evenly_spaced": evenly_spaced_rows(n, k, chains), "last": last_rows(n, k, chains)}
    draws = [random_rows(n, k, generator, chains) for _ in range(subsets)]
    stored.prefetch(np.concatenate([*fixed.values(), *draws]), storage)  # predicted in blocks, not k at a time
    buffers = stored.member_buffers(k)  # every ensemble here has k members
    judged = {name: judge_rows(stored, rows, inputs, reference, storage, buffers) for name, rows in fixed.items()}
    drawn = [judge_rows(stored, rows, inputs, reference, storage, buffers) for rows in draws]
    return {"k": k, "in_sgld_samples": kept_worth(k, dim, storage), **judged,
            "random": spread(drawn, band=True), "subsets": subsets, "precision": storage_key(storage)}


def curve_sizes(sizes: Iterable[int], available: int) -> list[int]:
    """The distinct k of ``sizes`` a store of ``available`` samples can give, in increasing order."""
    return sorted({int(k) for k in sizes if 1 <= k <= available})


def kept_curve(stored: StoredPredictions, sizes: Iterable[int], inputs: EvaluationInputs, reference: Reference,
               subsets: int, generator: torch.Generator) -> list[dict]:
    """:func:`kept_samples` for each k of :func:`curve_sizes`, in increasing order, all drawn from ``generator``."""
    return [kept_samples(stored, k, inputs, reference, subsets, generator) for k in curve_sizes(sizes, len(stored))]
