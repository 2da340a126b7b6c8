"""One generator per chain (``[distill] per_chain = true``): codes c = G_j(z), z ~ 𝒩(0, I), with chain j
picked for each member by the chains' shares of the store.

SGLD chains started apart may sit in separate modes. One generator fed one Gaussian latent maps it to a
connected set of codes (the image of a connected set under a continuous map), so some of its draws fall
between the modes, where no chain went. C generators, one trained on each chain's codes in one shared
codec, keep the modes apart; their draw of k is split over the chains by :func:`systematic_allocation`
of the chains' shares, and storage grows by one generator per chain, not by D.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from apd.distillation.gan import GANTrainer, Generator
from apd.errors import ArtifactError


def systematic_allocation(shares: Tensor, k: int) -> Tensor:
    """The part of each of k members, for parts of ``shares`` (summing to 1): member i takes the part whose
    cumulative share first exceeds (i + ½)/k (systematic sampling), so part j gets k·w_j members to within
    one, in order."""
    positions = (torch.arange(k, device=shares.device) + 0.5) / k
    return torch.searchsorted(shares.cumsum(0), positions).clamp_max(len(shares) - 1)


class ChainGenerators(nn.Module):
    """C generators of codes and the chains' shares [C] (a stored buffer): :meth:`sample` draws k codes,
    k·share_j of them (to within one, :func:`systematic_allocation`) from generator j, grouped by chain.
    It samples like one :class:`~apd.distillation.gan.Generator`, so a codec and a validation monitor take
    either."""

    def __init__(self, generators: Sequence[Generator], shares: Tensor) -> None:
        super().__init__()
        if len(generators) != len(shares):
            raise ValueError(f"{len(generators)} generators for {len(shares)} chain shares")
        self.generators = nn.ModuleList(generators)
        self.register_buffer("shares", shares.float())
        self.z_dim, self.out_dim = generators[0].z_dim, generators[0].out_dim

    def sample(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k codes [k, out_dim]: generator j's draws for its share of the k members, chain after chain."""
        counts = torch.bincount(systematic_allocation(self.shares, k), minlength=len(self.generators)).tolist()
        return torch.cat([g.sample(n, generator=generator) for g, n in zip(self.generators, counts, strict=True)
                          if n])


class ChainTrainers:
    """One :class:`~apd.distillation.gan.GANTrainer` per chain, stepped together: :meth:`step` takes one
    step of each on its own chain's real batches. It has what the pipeline's training loop uses of one
    trainer: ``generator`` (the :class:`ChainGenerators`), ``critic``, ``generator_steps``, ``step`` and a
    checkpointable state."""

    def __init__(self, trainers: Sequence[GANTrainer], shares: Tensor) -> None:
        self.trainers = list(trainers)
        self.generator = ChainGenerators([t.generator for t in self.trainers], shares)
        self.critic = nn.ModuleList([t.critic for t in self.trainers])

    @property
    def generator_steps(self) -> int:
        return self.trainers[0].generator_steps

    def step(self, real_batches: Sequence[Callable[[], Tensor]], n_critic: int = 5) -> dict[str, float]:
        """:meth:`GANTrainer.step` of each chain's trainer on ``real_batches[j]``; each statistic averaged
        over the chains by their shares."""
        stats = [t.step(batches, n_critic) for t, batches in zip(self.trainers, real_batches, strict=True)]
        shares = self.generator.shares.tolist()
        return {name: sum(w * s[name] for w, s in zip(shares, stats, strict=True)) for name in stats[0]}

    def state_dict(self) -> dict[str, Any]:
        return {"chains": [t.state_dict() for t in self.trainers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        chains = state.get("chains", [])
        if len(chains) != len(self.trainers):
            raise ArtifactError(f"GAN checkpoint holds {len(chains)} chains' trainers, this run has "
                                f"{len(self.trainers)}")
        for trainer, chain_state in zip(self.trainers, chains, strict=True):
            trainer.load_state_dict(chain_state)
