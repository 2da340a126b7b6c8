"""APD (Wang et al., 2018): weight vectors from the distilled generator, θ = decode(G(z)), z ~ 𝒩(0, I)."""

from __future__ import annotations

import torch
from torch import Tensor

from apd.distillation.generator import DistilledGenerator
from apd.nets import ParamSpec
from apd.posteriors.base import Posterior


class APDGenerator(Posterior):
    """The distilled generator ``model`` for networks of ``spec``."""

    def __init__(self, model: DistilledGenerator, spec: ParamSpec, name: str = "apd") -> None:
        self.name, self.model, self.spec = name, model, spec
        self.device = next(model.parameters()).device

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return self.model.sample_weights(k, self.on_device(generator))

    @property
    def precision(self) -> str:
        """What the generator's tensors are stored at."""
        return self.model.precision

    @property
    def mean_precision(self) -> str:
        """What the codec's mean of the weights is stored at."""
        return self.model.stored_as.mean

    def stored_parameters(self) -> int:
        return self.model.stored_parameters()

    def storage_in_samples(self) -> float:
        """Bytes at the generator's stored precision, in SGLD samples' worth."""
        return self.model.storage_in_samples()
