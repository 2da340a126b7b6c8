"""SGLD samples (Welling & Teh, 2011) read from a sample store: k rows drawn without replacement per
call, read from disk, never all loaded; optionally with each row's hidden units reordered by its alignment
permutation (:mod:`apd.distillation.alignment`), which moves the weights but not the function."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from apd.distillation.alignment import permute
from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore, StoreRows


class SGLDSamples(Posterior):
    """The rows of ``store``, each a member; draws spread over every chain the store holds. With ``perms``
    [len(store), H], row i comes with its hidden units permuted by ``perms[i]``."""

    def __init__(self, store: SampleStore | StoreRows, device: torch.device | str = "cpu", name: str = "sgld",
                 perms: Tensor | None = None) -> None:
        self.name, self.store, self.spec, self.device = name, store, store.spec, torch.device(device)
        self.perms = perms

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        rows = self._draw(k, generator)
        weights = self.store.read(rows.numpy())
        if self.perms is not None:
            weights = permute(weights, self.spec, self.perms[rows])
        return weights.to(self.device)

    def stored_rows(self, store: SampleStore | StoreRows, k: int,
                    generator: torch.Generator | None = None) -> np.ndarray | None:
        """The rows a draw is, when ``store`` is this posterior's and its members are not permuted."""
        return None if self.perms is not None or store is not self.store else self._draw(k, generator).numpy()

    def _draw(self, k: int, generator: torch.Generator | None) -> Tensor:
        """min(k, len(store)) distinct rows drawn uniformly, in the order drawn (on the CPU)."""
        return torch.randperm(len(self.store), generator=generator,
                              device=generator.device if generator else "cpu")[:self.ensemble_size(k)].cpu()

    def max_members(self) -> int:
        return len(self.store)

    def stored_parameters(self) -> int:
        return len(self.store) * self.spec.numel
