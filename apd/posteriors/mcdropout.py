"""MC dropout (Gal & Ghahramani, 2016) as a distribution over weights.

A dropout mask m ∈ {0, 1}^H on a hidden layer's H units, each kept with probability 1 − p and scaled by
1/(1 − p), multiplies that layer's outputs; since the next layer is linear, the masked network equals the
network whose next weight matrix has its columns multiplied by m_h/(1 − p). So a member of MC dropout
is a weight vector θ_m = θ̂ with those columns scaled, one mask per hidden layer, and the predictive is
p̄(y | x) = (1/k) Σ_m p(y | x, θ_m). Each member is one fixed network, shared by all inputs (in a
dropout layer in train mode every input would get its own mask: the per-input predictive is the same
distribution, and a fixed member is what an attacker of "one network" needs).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from apd.nets import ParamSpec, predict_logits_on_trunk, softmax_over_classes
from apd.posteriors.base import Members, Posterior


class MCDropout(Posterior):
    """Dropout masks on the hidden units of ``module`` (dropout rate ``p``), as weight vectors."""

    def __init__(self, module: nn.Module, p: float, name: str = "mcdropout") -> None:
        if not 0.0 < p < 1.0:
            raise ValueError(f"dropout rate must be in (0, 1), got {p}")
        self.name, self.p, self.spec = name, p, ParamSpec.from_module(module)
        self.weights = self.spec.flatten(module)
        self.device = self.weights.device

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        generator = self.on_device(generator)
        thetas = self.weights.repeat(k, 1)
        for w_start, _, n_out, n_in in self.spec.linear_layers()[1:]:
            keep = torch.rand(k, n_in, generator=generator, device=self.device) >= self.p
            scale = keep.to(thetas.dtype) / (1.0 - self.p)
            block = thetas[:, w_start:w_start + n_out * n_in].view(k, n_out, n_in)
            block.mul_(scale.unsqueeze(1))
        return thetas

    def members(self, k: int, generator: torch.Generator | None = None) -> Members:
        """x ↦ p_k(y | x) [K, N, C] for one draw of k masks: the layers no mask reaches (a CNN's convolutions,
        the first linear layer) run once for all k members (:func:`~apd.nets.predict_logits_on_trunk`), the
        same function as predicting with the k weight vectors, to float rounding."""
        if len(self.spec.linear_layers()) < 2:  # no hidden layer, so no mask: every member is the network
            return super().members(k, generator)
        weights = self.sample_weights(k, generator)
        return lambda x: softmax_over_classes(predict_logits_on_trunk(self.spec, self.weights, weights,
                                                                      x.to(self.device)))

    def stored_parameters(self) -> int:
        return self.spec.numel
