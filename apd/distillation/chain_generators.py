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

from apd.distillation.gan import Critic, GANLoss, GANTrainer, Generator, stacked
from apd.errors import ArtifactError


def systematic_allocation(shares: Tensor, k: int, start: Tensor | float = 0.5) -> Tensor:
    """The part of each of k members, for parts of ``shares`` w (normalised to sum to 1 here, so that shares
    read back rounded, as a generator stored below float32 holds them, keep their proportions): member i
    takes the part whose cumulative share first exceeds (i + u)/k (systematic sampling, start u ∈ [0, 1); ½ by
    default), so part j gets k·w_j members to within one, in order. A start u ~ U[0, 1) makes it systematic
    resampling (Kitagawa, 1996): part j's count then has expectation exactly k·w_j."""
    positions = (torch.arange(k, device=shares.device) + start) / k
    cumulative = shares.cumsum(0)
    return torch.searchsorted(cumulative / cumulative[-1], positions).clamp_max(len(shares) - 1)


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
    """The C chains' GANs trained as one batched computation: a :class:`~apd.distillation.gan.GANTrainer` of
    their :func:`~apd.distillation.gan.stacked` generators and critics, chain j's streams seeded with
    ``seeds[j]``, so chain j trains as a trainer of its generator and critic alone would, whatever chains
    train with it (to float rounding). ``generator`` is the :class:`ChainGenerators` of the C generators,
    whose weights are views of the stack and so always the trained ones; ``critic`` is the stacked critic.
    ``cuda_graph`` as :class:`~apd.distillation.gan.GANTrainer`'s.
    :meth:`step` takes one step of every chain on its own chain's real batches."""

    def __init__(self, generators: Sequence[Generator], critics: Sequence[Critic], shares: Tensor,
                 loss: GANLoss | str = "wgan-gp", *, lr: float | None = None,
                 betas: tuple[float, float] | None = None, seeds: Sequence[int],
                 cuda_graph: bool | None = None) -> None:
        if not len(generators) == len(critics) == len(seeds):
            raise ValueError(f"{len(generators)} generators, {len(critics)} critics and {len(seeds)} seeds")
        self.trainer = GANTrainer(stacked(generators), stacked(critics), loss, lr=lr, betas=betas, seed=list(seeds),
                                  chain_weights=shares, cuda_graph=cuda_graph)
        self.generator = ChainGenerators(generators, shares)
        self.critic = self.trainer.critic

    @property
    def generator_steps(self) -> int:
        return self.trainer.generator_steps

    def step(self, real_batches: Sequence[Callable[[], Tensor]], n_critic: int = 5) -> dict[str, float]:
        """:meth:`GANTrainer.step` of every chain at once, chain j's real batches from ``real_batches[j]``
        (each called once per critic step, in chain order); each statistic averaged over the chains by their
        shares."""
        return self.trainer.averaged(self.step_by_chain(real_batches, n_critic))

    def step_by_chain(self, real_batches: Sequence[Callable[[], Tensor]], n_critic: int = 5) -> dict[str, Tensor]:
        """:meth:`step`, its statistics each chain's own ([C] float64 tensors,
        :meth:`GANTrainer.step_by_chain`)."""
        return self.trainer.step_by_chain(lambda: torch.stack([batches() for batches in real_batches]), n_critic)

    def state_dict(self) -> dict[str, Any]:
        """The stacked trainer's :meth:`GANTrainer.state_dict` (every chain's random stream included)."""
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; one of another number of chains is an
        :class:`ArtifactError`, and so is a checkpoint of the chains' trainers one by one (made before they
        trained as one)."""
        if "chains" in state:
            raise ArtifactError("GAN checkpoint holds the chains' trainers one by one, saved before they trained "
                                "as one batch; run `apd distill --force`")
        self.trainer.load_state_dict(state)
