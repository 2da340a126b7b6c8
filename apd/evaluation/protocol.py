"""The scoring protocol, written once: what every comparison of posteriors computes from one batched
prediction over the test set, the in-distribution OOD subset and each OOD set.

- Test set: accuracy, NLL, Brier score and ECE of the ensemble predictive p̄ = (1/K) Σ_k p_k.
- Detection: for each uncertainty score (higher = more uncertain, :mod:`apd.uncertainty`), the test
  subset against each OOD set with OOD positive (:func:`apd.metrics.detection`: AUROC, AUPR-In,
  AUPR-Out, FPR at 95 % TPR). Scores that measure disagreement between members
  (:data:`~apd.uncertainty.ENSEMBLE_SCORES`) are ``None`` for a one-member ensemble: undefined, not 50.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from apd.evaluation.stored import StoredPredictions
from apd.metrics import accuracy, brier, detection, ece, nll
from apd.posteriors.base import Posterior
from apd.uncertainty import ENSEMBLE_SCORES
from apd.uncertainty import scores as uncertainty_scores

ACCURACY_METRICS = {"acc": accuracy, "nll": nll, "brier": brier, "ece": ece}


@dataclass(frozen=True)
class EvaluationInputs:
    """The inputs one judgement covers: the labelled test set, the in-distribution side of detection
    ``x_in``, and each OOD set (as many images as ``x_in``)."""

    x_test: Tensor
    y_test: Tensor
    x_in: Tensor
    ood: dict[str, Tensor]

    def stacked(self, device: torch.device | str) -> Tensor:
        """Every input in one tensor: test, in-distribution subset, then the OOD sets in order."""
        return torch.cat([self.x_test, self.x_in, *self.ood.values()]).to(device)

    def parts(self) -> dict[str, slice]:
        """Where each input set lies in :meth:`stacked`: ``"test"``, ``"in"`` (the in-distribution side), then
        each OOD set by name."""
        named = {"test": self.x_test, "in": self.x_in, **self.ood}
        bounds = np.cumsum([0, *(len(x) for x in named.values())])
        return {name: slice(int(a), int(b)) for name, a, b in zip(named, bounds[:-1], bounds[1:], strict=True)}

    @property
    def n_test(self) -> int:
        return len(self.y_test)


@dataclass
class Judgement:
    """One ensemble's results: ``accuracy`` (metric → value), ``detection`` (set → score → metrics or
    None), the test predictive ``test_probs`` [N, C], per-input scores ``inside`` (score → [n_in])
    and ``outside`` (set → score → [n_out]) for histograms, and for the test inputs (``"test"``) and each
    OOD set the predictive p̄ [n, C] (``predictive``) and the per-input BALD [n] (``information``; 0 for
    one network), float64 on the CPU, for the function-space distances to SGLD."""

    accuracy: dict[str, float]
    detection: dict[str, dict[str, dict | None]]
    test_probs: Tensor
    inside: dict[str, np.ndarray]
    outside: dict[str, dict[str, np.ndarray]]
    predictive: dict[str, Tensor] = field(default_factory=dict)
    information: dict[str, Tensor] = field(default_factory=dict)

    def set_aurocs(self, score: str) -> dict[str, float | None]:
        """Each OOD set's AUROC of ``score`` in percent; None where the ensemble cannot have the score (one
        network has no BALD)."""
        return {name: None if found.get(score) is None else 100.0 * found[score]["auroc"]
                for name, found in self.detection.items()}

    def mean_auroc(self, score: str) -> float:
        """The AUROC of ``score`` averaged over the OOD sets S that have it, (1/|S|) Σ_{o ∈ S} AUROC_o, in
        percent; NaN where none has it."""
        values = [value for value in self.set_aurocs(score).values() if value is not None]
        return float(np.mean(values)) if values else float("nan")


def judge_probs(probs: Tensor, inputs: EvaluationInputs, scores: list[str],
                detect: Callable[[np.ndarray, np.ndarray], dict] = detection,
                member_entropy: Tensor | None = None, doubled: Tensor | None = None) -> Judgement:
    """:class:`Judgement` of member probabilities ``probs`` [K, N, C] over ``inputs.stacked()``; ``detect``
    gives each set's detection metrics (:func:`apd.metrics.auroc` where only the AUROC is needed);
    ``member_entropy``: the members' entropies [K, N] (:func:`apd.uncertainty.member_entropies`) where known;
    ``doubled``: ``probs`` in float64 where converted already (into a buffer reused from one judgement to the
    next: :class:`~apd.evaluation.stored.MemberBuffers`)."""
    n_test, n_in = inputs.n_test, len(inputs.x_in)
    test_probs = probs[:, :n_test].mean(0)
    y = inputs.y_test.to(probs.device)
    metrics = {name: fn(test_probs, y) for name, fn in ACCURACY_METRICS.items()}
    several = probs.shape[0] > 1
    defined = [s for s in scores if several or s not in ENSEMBLE_SCORES]
    # The predictive p̄ and BALD's member entropies (the costliest part, or given) computed once for every
    # stacked input: the per-input BALD of every input, the detection scores of the detection inputs (those
    # after the test inputs) and the predictive alike (one network's BALD is 0: its members agree).
    doubled = probs.double() if doubled is None else doubled  # once: the scores compute in float64 and take it
    mean_probs = doubled.mean(0)
    information = (uncertainty_scores(doubled, ["bald"], mean_probs=mean_probs, member_entropy=member_entropy)
                   ["bald"].cpu() if several else torch.zeros(doubled.shape[1], dtype=torch.float64))
    values = uncertainty_scores(doubled[:, n_test:], [s for s in defined if s != "bald"],
                                mean_probs=mean_probs[n_test:])
    per_input = {s: (information[n_test:] if s == "bald" else values[s].cpu()).numpy() for s in defined}
    inside = {s: v[:n_in] for s, v in per_input.items()}
    mean_probs = mean_probs.cpu()
    predictive, disagreement = {"test": mean_probs[:n_test]}, {"test": information[:n_test]}
    outside, found = {}, {}
    start = n_in
    for name, x_out in inputs.ood.items():
        part = slice(start, start + len(x_out))
        start += len(x_out)
        outside[name] = {s: v[part] for s, v in per_input.items()}
        found[name] = {s: detect(inside[s], outside[name][s]) if s in per_input else None for s in scores}
        stacked = slice(n_test + part.start, n_test + part.stop)
        predictive[name], disagreement[name] = mean_probs[stacked], information[stacked]
    return Judgement(metrics, found, test_probs, inside, outside, predictive, disagreement)


@torch.no_grad()
def judge(method: Posterior, inputs: EvaluationInputs, k: int, generator: torch.Generator | None,
          scores: list[str], stored: StoredPredictions | None = None) -> Judgement:
    """One fresh draw of ``k`` members of ``method`` (as many as it can give), judged on ``inputs``; members
    that are stored samples are read from ``stored`` (a store's predictions on ``inputs.stacked()``) where
    given."""
    probs = None if stored is None else stored.draw(method, k, generator)
    if probs is None:
        probs = method.predict_probs(inputs.stacked(method.device), k, generator)
    return judge_probs(probs, inputs, scores)
