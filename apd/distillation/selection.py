"""Which generator step to keep: a distance between the generated and SGLD's predictive distributions on
validation inputs, never accuracy (the posterior mean alone is as accurate as the ensemble, so accuracy
cannot tell a collapsed generator from a faithful one).

For an ensemble of K networks with member probabilities p_k(y | x), the predictive is
p̄(y | x) = (1/K) Σ_k p_k(y | x) and its disagreement is the mutual information (BALD; Houlsby et al.,
2011) I(x) = H[p̄(· | x)] − (1/K) Σ_k H[p_k(· | x)]. The criterion is

    c = (1/N) Σ_n KL( p̄_SGLD(· | x_n) ‖ p̄_gen(· | x_n) ) + (1/N) Σ_n | I_gen(x_n) − I_SGLD(x_n) |,

in nats, on N validation inputs: the first term asks for the same predictions, the second for the same
disagreement input by input (lower is better; 0 for an ensemble with SGLD's per-input predictive and
disagreement).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from apd.metrics import accuracy
from apd.nets import ParamSpec, predict_probs
from apd.uncertainty import bald

PROBABILITY_FLOOR = 1e-12  # keeps log p̄ finite where an ensemble gives a class no mass


@dataclass(frozen=True)
class ReferencePredictive:
    """SGLD's side of the criterion on fixed inputs ``x`` with labels ``y``: the predictive p̄ [N, C],
    the per-input BALD [N] and the ensemble's accuracy."""

    x: Tensor
    y: Tensor
    mean_probs: Tensor
    information: Tensor
    accuracy: float

    @classmethod
    def of(cls, spec: ParamSpec, weights: Tensor, x: Tensor, y: Tensor) -> ReferencePredictive:
        probs = predict_probs(spec, weights, x)
        return cls(x, y, probs.double().mean(0), bald(probs), accuracy(probs.mean(0), y))

    @property
    def mean_information(self) -> float:
        return float(self.information.mean())


def function_space_gap(probs: Tensor, reference: ReferencePredictive) -> dict[str, float]:
    """``kl``, ``bald_gap`` and their sum ``criterion`` (module docstring) of member probabilities
    ``probs`` [K, N, C] against ``reference``, plus the ensemble's ``mean_bald`` and ``accuracy`` (for the
    record; it plays no part in the choice)."""
    mean_probs = probs.double().mean(0).clamp_min(PROBABILITY_FLOOR)
    ref = reference.mean_probs.clamp_min(PROBABILITY_FLOOR)
    kl = (ref * (ref.log() - mean_probs.log())).sum(-1).mean()
    information = bald(probs)
    gap = (information - reference.information).abs().mean()
    return {"kl": float(kl), "bald_gap": float(gap), "criterion": float(kl + gap),
            "mean_bald": float(information.mean()), "accuracy": accuracy(probs.mean(0), reference.y)}


@torch.no_grad()
def generated_gap(spec: ParamSpec, weights: Tensor, reference: ReferencePredictive) -> dict[str, float]:
    """:func:`function_space_gap` of the networks ``weights`` [K, D] on the reference's inputs."""
    return function_space_gap(predict_probs(spec, weights, reference.x), reference)
