"""A single network θ̂ (the SGD baseline): every draw is θ̂, so its ensemble has one member."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from apd.nets import ParamSpec
from apd.posteriors.base import Posterior


class PointEstimate(Posterior):
    """δ(θ − θ̂) for the weights of ``module``."""

    def __init__(self, module: nn.Module, name: str = "sgd") -> None:
        self.name, self.spec = name, ParamSpec.from_module(module)
        self.weights = self.spec.flatten(module).unsqueeze(0)
        self.device = self.weights.device

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return self.weights

    def max_members(self) -> int:
        return 1

    def stored_parameters(self) -> int:
        return self.spec.numel
