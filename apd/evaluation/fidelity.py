"""How closely a weight-space method matches SGLD beyond accuracy."""

from __future__ import annotations

import torch
from torch import Tensor

from apd.posteriors.base import Posterior
from apd.uncertainty import bald


@torch.no_grad()
def weight_fidelity(method: Posterior, sgld: Posterior, k: int, generator: torch.Generator) -> dict:
    """k weight vectors of ``method`` against 2k of SGLD (a reference half and a held-out half):

    - ``weight_std_ratio``: median over weights of std_method / std_SGLD;
    - ``nn_distance``: mean Euclidean distance from a generated vector to its nearest SGLD sample
      (k reference samples), against ``heldout_nn_distance``, the same for k other SGLD samples;
      ``nn_ratio`` = their quotient (≪ 1 suggests memorised samples, ≫ 1 vectors off the posterior).
    """
    reference = sgld.sample_weights(2 * k, generator)
    k = len(reference) // 2
    reference, heldout = reference[:k], reference[k:2 * k]
    generated = method.sample_weights(k, generator).to(reference.device)
    nn_generated = torch.cdist(generated, reference).min(1).values.mean().item()
    nn_heldout = torch.cdist(heldout, reference).min(1).values.mean().item()
    return {"weight_std_ratio": (generated.std(0) / reference.std(0).clamp_min(1e-12)).median().item(),
            "nn_distance": nn_generated, "heldout_nn_distance": nn_heldout, "nn_ratio": nn_generated / nn_heldout}


def bald_ratio(method_bald: Tensor, sgld_bald: Tensor) -> float:
    """``bald_ratio`` = (1/N) Σ_n I_method(x_n) / ((1/N) Σ_n I_SGLD(x_n)): the mean per-input BALD (mutual
    information between the label and the weights) of the method's ensemble over SGLD's, on the same N inputs."""
    return float(method_bald.mean() / sgld_bald.mean())


@torch.no_grad()
def fidelity(method: Posterior, sgld: Posterior, x: Tensor, k: int, generator: torch.Generator) -> dict:
    """:func:`weight_fidelity`, and :func:`bald_ratio` of k fresh draws of each method predicted on ``x``."""
    found = weight_fidelity(method, sgld, k, generator)
    return {**found, "bald_ratio": bald_ratio(bald(method.predict_probs(x, k, generator)),
                                              bald(sgld.predict_probs(x, k, generator)))}
