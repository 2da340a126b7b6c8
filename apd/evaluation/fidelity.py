"""How closely a weight-space method matches SGLD beyond accuracy."""

from __future__ import annotations

import torch
from torch import Tensor

from apd.evaluation.stored import StoredPredictions
from apd.posteriors.base import Posterior
from apd.uncertainty import bald


@torch.no_grad()
def fidelity(method: Posterior, sgld: Posterior, x_test: Tensor, k: int, generator: torch.Generator,
             stored: StoredPredictions | None = None) -> dict:
    """k draws of each method (2k of SGLD: a reference half and a held-out half), predicted on the test
    inputs ``x_test``; with ``stored`` (a store's predictions on inputs that begin with ``x_test``, as
    :meth:`~apd.evaluation.protocol.EvaluationInputs.stacked` does), members that are its stored samples are
    read from it:

    - ``weight_std_ratio``: median over weights of std_method / std_SGLD;
    - ``bald_ratio``: mean test-set BALD of the method's ensemble over SGLD's;
    - ``nn_distance``: mean Euclidean distance from a generated vector to its nearest SGLD sample
      (k reference samples), against ``heldout_nn_distance``, the same for k other SGLD samples;
      ``nn_ratio`` = their quotient (≪ 1 suggests memorised samples, ≫ 1 vectors off the posterior).
    """
    def test_probs(posterior: Posterior) -> Tensor:
        probs = None if stored is None else stored.draw(posterior, k, generator)
        return posterior.predict_probs(x_test, k, generator) if probs is None else probs[:, :len(x_test)]

    reference = sgld.sample_weights(2 * k, generator)
    k = len(reference) // 2
    reference, heldout = reference[:k], reference[k:2 * k]
    generated = method.sample_weights(k, generator).to(reference.device)
    std_ratio = (generated.std(0) / reference.std(0).clamp_min(1e-12)).median().item()
    bald_method = bald(test_probs(method)).mean().item()
    bald_sgld = bald(test_probs(sgld)).mean().item()
    nn_generated = torch.cdist(generated, reference).min(1).values.mean().item()
    nn_heldout = torch.cdist(heldout, reference).min(1).values.mean().item()
    return {"weight_std_ratio": std_ratio, "bald_ratio": bald_method / bald_sgld, "nn_distance": nn_generated,
            "heldout_nn_distance": nn_heldout, "nn_ratio": nn_generated / nn_heldout}
