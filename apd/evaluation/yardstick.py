"""The kept-samples yardstick (docs/design.md, "Honest protocol"): what a method that stores S SGLD
samples' worth of numbers must beat is ⌈S⌉ SGLD samples simply kept.

Quality of an ensemble, against SGLD (the reference), on the evaluation's inputs:

- ``bald_gap``: the worst per-set gap to SGLD's BALD AUROC, max_o (AUROC_SGLD,o − AUROC_o), in percent
  points over the OOD sets o (positive = below SGLD on some set; None for one network, which has no BALD);
- ``max_prob_gap``: the same for the max-probability score (1 − max p̄, the paper's "variation ratio");
- ``nll_gap``: NLL − NLL_SGLD on the test set (nats);
- ``kl``: the function-space distance (1/N) Σ_n KL(p̄_SGLD(· | x_n) ‖ p̄(· | x_n)) on the N test inputs,
  p̄_SGLD the predictive of (up to a cap) every stored sample (:func:`apd.distillation.selection.function_space_gap`'s
  KL term, shared code).

AUROC and NLL references are SGLD's own evaluated numbers (its ensemble size, mean over runs); the KL
reference is the whole store's predictive. :func:`kept_samples` measures k kept samples (evenly spaced
over the store, across chains, and ``subsets`` random subsets for the spread); :func:`kept_curve` does so
for several k. :func:`margins_over_kept` says, per score and OOD set and for the NLL, by how much a method
beats its ⌈S⌉ kept samples, and whether by more than the random subsets' spread. Nothing is chosen
here: these are the final report's numbers on the test split and the reported OOD sets. No paths, no
run context: callers pass the store, inputs and generators.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from apd.distillation.precision import in_samples, round_trip, stored_bytes
from apd.distillation.selection import PROBABILITY_FLOOR
from apd.evaluation.protocol import EvaluationInputs, Judgement, judge_probs
from apd.nets import predict_probs
from apd.posteriors.kept import evenly_spaced_rows, random_rows
from apd.samplers.store import SampleStore

SCORES = ["bald", "max_prob"]  # the scores whose AUROC gaps define quality
SUMMARY_KEYS = ("acc", "nll", "mean_bald_auroc", "bald_gap", "max_prob_gap", "nll_gap", "kl")


@dataclass(frozen=True)
class Reference:
    """SGLD's side: per-set AUROC (percent) of BALD and max_prob, test NLL, and the predictive p̄ [N, C]
    of ``samples`` stored samples on the test inputs."""

    bald_auroc: dict[str, float]
    max_prob_auroc: dict[str, float]
    nll: float
    mean_probs: Tensor
    samples: int


def reference_predictive(store: SampleStore, x_test: Tensor, limit: int, device: torch.device | str = "cpu",
                         chunk: int = 200) -> tuple[Tensor, int]:
    """p̄_SGLD [N, C] (float64, CPU) over min(limit, len(store)) samples evenly spaced over the store (all of
    them when the store is no larger), read ``chunk`` at a time; and that number of samples."""
    rows = evenly_spaced_rows(len(store), min(limit, len(store)))
    total = None
    x = x_test.to(device)
    for start in range(0, len(rows), chunk):
        probs = predict_probs(store.spec, store.read(rows[start:start + chunk]).to(device), x)
        part = probs.double().sum(0).cpu()
        total = part if total is None else total + part
    return total / len(rows), len(rows)


def kl_to_reference(test_probs: Tensor, reference: Reference) -> float:
    """(1/N) Σ_n KL(p̄_SGLD ‖ p̄) in nats for a predictive ``test_probs`` [N, C]."""
    ref = reference.mean_probs.clamp_min(PROBABILITY_FLOOR)
    probs = test_probs.detach().double().cpu().clamp_min(PROBABILITY_FLOOR)
    return float((ref * (ref.log() - probs.log())).sum(-1).mean())


def worst_gap(reference: dict[str, float], values: dict[str, float | None]) -> float | None:
    """max over sets of reference − value (percent points); None when any value is undefined."""
    if not reference or any(values.get(name) is None for name in reference):
        return None
    return max(reference[name] - values[name] for name in reference)


def quality(bald_auroc: dict[str, float | None], max_prob_auroc: dict[str, float | None], nll: float,
            kl: float, reference: Reference) -> dict[str, float | None]:
    """``bald_gap``, ``max_prob_gap``, ``nll_gap`` and ``kl`` (module docstring) of AUROCs in percent."""
    return {"bald_gap": worst_gap(reference.bald_auroc, bald_auroc),
            "max_prob_gap": worst_gap(reference.max_prob_auroc, max_prob_auroc),
            "nll_gap": nll - reference.nll, "kl": kl}


def summarise(judgement: Judgement, reference: Reference) -> dict[str, float | None]:
    """Accuracy, NLL, mean BALD AUROC (percent, over the OOD sets) and :func:`quality` of one judgement."""
    aurocs = {score: {name: None if found[score] is None else 100.0 * found[score]["auroc"]
                      for name, found in judgement.detection.items()} for score in SCORES}
    bald = [v for v in aurocs["bald"].values() if v is not None]
    return {"acc": judgement.accuracy["acc"], "nll": judgement.accuracy["nll"],
            "mean_bald_auroc": float(np.mean(bald)) if len(bald) == len(aurocs["bald"]) and bald else None,
            **quality(aurocs["bald"], aurocs["max_prob"], judgement.accuracy["nll"],
                      kl_to_reference(judgement.test_probs, reference), reference),
            "auroc": aurocs}


def _mean_std(values: list[float | None]) -> dict[str, float] | None:
    return None if any(v is None for v in values) else {"mean": float(np.mean(values)), "std": float(np.std(values))}


def mean_of(value: dict | float | None) -> float | None:
    """A yardstick value's mean: that of a summary over runs or subsets (:func:`spread`'s ``mean``), or
    the value itself where it has no spread (one evenly spaced set)."""
    return value["mean"] if isinstance(value, dict) else value


def std_of(value: dict | float | None) -> float:
    """A yardstick value's std over runs or subsets, 0 where it has no spread."""
    return value["std"] if isinstance(value, dict) else 0.0


def spread(summaries: list[dict]) -> dict:
    """Mean and population std over ``summaries`` of each :data:`SUMMARY_KEYS` value and of each per-set
    AUROC (``auroc``: score → set → mean and std), None where undefined."""
    out: dict = {key: _mean_std([s[key] for s in summaries]) for key in SUMMARY_KEYS}
    first = summaries[0]["auroc"]
    out["auroc"] = {score: {name: _mean_std([s["auroc"][score][name] for s in summaries]) for name in first[score]}
                    for score in first}
    return out


def _margin(own: float | None, kept: float | None, drawn: dict[str, float] | None, sign: float) -> dict | None:
    if own is None or kept is None or drawn is None:
        return None
    over_kept, over_random = sign * (own - kept), sign * (own - drawn["mean"])
    return {"over_kept": over_kept, "over_random": over_random, "random_std": drawn["std"],
            "beats": min(over_kept, over_random) > drawn["std"]}


def margins_over_kept(own_auroc: dict[str, dict[str, float | None]], own_nll: float, kept: dict) -> dict:
    """A method against its ⌈S⌉ kept samples (a :func:`kept_samples` row): for each score of ``own_auroc``
    (score → set → AUROC, percent) and set, and for the NLL, the margin over the evenly spaced samples and
    over the random subsets' mean (positive: the method is better; AUROC higher, NLL lower), the subsets'
    std, and ``beats``: both margins larger than that std. ``wins`` counts the comparisons beaten among the
    ``compared`` ones that are defined (a score one network cannot have is left out)."""
    even, drawn = kept["evenly_spaced"], kept["random"]
    auroc = {score: {name: _margin(value, even["auroc"][score].get(name), drawn["auroc"][score].get(name), 1.0)
                     for name, value in by_set.items()} for score, by_set in own_auroc.items()}
    nll = _margin(own_nll, even["nll"], drawn["nll"], -1.0)
    found = [m for by_set in auroc.values() for m in by_set.values() if m is not None] + ([nll] if nll else [])
    return {"auroc": auroc, "nll": nll, "wins": sum(m["beats"] for m in found), "compared": len(found)}


@torch.no_grad()
def judge_rows(store: SampleStore, rows: np.ndarray, inputs: EvaluationInputs, device: torch.device | str,
               reference: Reference, precision: str = "float32") -> dict[str, float | None]:
    """:func:`summarise` of the ensemble of the store's ``rows``, each row stored at ``precision``
    (:func:`apd.distillation.precision.round_trip`)."""
    weights = torch.stack([round_trip(row, precision) for row in store.read(rows)]).to(device)
    probs = predict_probs(store.spec, weights, inputs.stacked(device))
    return summarise(judge_probs(probs, inputs, SCORES), reference)


def kept_samples(store: SampleStore, k: int, inputs: EvaluationInputs, reference: Reference, subsets: int,
                 generator: torch.Generator, device: torch.device | str = "cpu", precision: str = "float32") -> dict:
    """k kept samples, each stored at ``precision``: ``evenly_spaced`` (over the store, the same number from
    each chain) and the mean and std over ``subsets`` uniformly random subsets (``random``); their storage
    in SGLD samples' worth."""
    n, dim = len(store), store.spec.numel
    even = judge_rows(store, evenly_spaced_rows(n, k, store.chains), inputs, device, reference, precision)
    drawn = [judge_rows(store, random_rows(n, k, generator), inputs, device, reference, precision)
             for _ in range(subsets)]
    return {"k": k, "in_sgld_samples": k * in_samples(stored_bytes(dim, precision), dim), "evenly_spaced": even,
            "random": spread(drawn), "subsets": subsets, "precision": precision}


def kept_for(worth: float, dim: int, precision: str, available: int) -> int:
    """How many SGLD samples, each stored at ``precision``, a method of storage ``worth`` (SGLD samples' worth)
    is set against: ⌈S / s_p⌉, s_p = one sample's storage at ``precision`` (1 at float32: ⌈S⌉), so that
    they take at least the method's bytes; at most ``available``."""
    return min(available, math.ceil(worth / in_samples(stored_bytes(dim, precision), dim) - 1e-9))


def kept_curve(store: SampleStore, sizes: Iterable[int], inputs: EvaluationInputs, reference: Reference,
               subsets: int, generator: torch.Generator, device: torch.device | str = "cpu") -> list[dict]:
    """:func:`kept_samples` for each distinct k of ``sizes`` the store can give, in increasing order."""
    ks = sorted({int(k) for k in sizes if 1 <= k <= len(store)})
    return [kept_samples(store, k, inputs, reference, subsets, generator, device) for k in ks]
