"""SGLD samples (Welling & Teh, 2011) read from a sample store: k rows drawn without replacement per
call, read from disk, never all loaded."""

from __future__ import annotations

import torch
from torch import Tensor

from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore


class SGLDSamples(Posterior):
    """The rows of ``store``, each a member; draws spread over every chain the store holds."""

    def __init__(self, store: SampleStore, device: torch.device | str = "cpu", name: str = "sgld") -> None:
        self.name, self.store, self.spec, self.device = name, store, store.spec, torch.device(device)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        k = self.ensemble_size(k)
        rows = torch.randperm(len(self.store), generator=generator, device=generator.device if generator else "cpu")
        return self.store.read(rows[:k].cpu().numpy()).to(self.device)

    def max_members(self) -> int:
        return len(self.store)

    def stored_parameters(self) -> int:
        return len(self.store) * self.spec.numel
