"""One generator for many chains' modes (``[distill] mode_embedding = E``): codes c = G([z, e_j]),
z ~ 𝒩(0, I), with chain j drawn by its share of the store and e_j ∈ R^E a learned embedding of chain j.

One generator per chain (:mod:`apd.distillation.chain_generators`) keeps C modes apart at the cost of C
generators. Here one network serves every chain: its input is z joined to the chain's embedding, so its
first layer is W_z·z + W_e·e_j + b, a bias of rank E per chain, and the chains differ only in where that
bias moves the network. Storage is one generator, C·E embedding numbers and the C shares.

It trains as a conditional WGAN-GP (Mirza & Osindero, 2014, "Conditional generative adversarial nets";
with the gradient penalty of Gulrajani et al., 2017): every real batch row is a sample of the store with
its chain, drawn uniformly over the rows, so chain j with probability w_j (its share); its fake row has
the same chain and a fresh z. The critic reads the chain one-hot, which on an affine first layer is a
learned bias per chain: h = W·x + b + β_j. A batch carries each row's chain as a last column (after the
codes), so the objectives of :mod:`apd.distillation.gan` apply unchanged: real and fake rows of one pair
share their chain, so their interpolate does too, h(x̂) is the same interpolation of h(real) and h(fake),
and ‖∇ₓD(x̂)‖² = gᵀ(W Wᵀ)g with W the weight on the codes alone (:class:`ChainInput`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from apd.distillation.chain_generators import systematic_allocation
from apd.distillation.gan import Critic, GANTrainer, draw
from apd.nets import mlp


class ConditionedGenerator(nn.Module):
    """c = G([z, e_j]) for chains j of ``shares`` [C] (a stored buffer), embeddings ``embedding`` [C, E]
    (learned, initialised 𝒩(0, 1)) and the MLP G: z_dim + E → ``hidden`` → ``out_dim``. It samples like one
    :class:`~apd.distillation.gan.Generator`, so a codec and a validation monitor take it."""

    def __init__(self, z_dim: int, hidden: list[int], out_dim: int, shares: Tensor, embedding_dim: int) -> None:
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"a chain embedding needs at least one dimension, got {embedding_dim}")
        self.z_dim, self.out_dim = z_dim, out_dim
        self.embedding = nn.Parameter(torch.randn(len(shares), embedding_dim))
        self.register_buffer("shares", shares.float())
        self.net = mlp([z_dim + embedding_dim, *hidden, out_dim])

    @property
    def chains(self) -> int:
        return len(self.shares)

    def forward(self, z: Tensor, chains: Tensor) -> Tensor:
        """G([z, e_j]) for z [k, z_dim] and each row's chain ``chains`` [k] (int64): codes [k, out_dim]."""
        return self.net(torch.cat([z, self.embedding[chains]], dim=-1))

    def draw_chains(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k chains [k], in order, by systematic resampling of the shares from a random start
        (:func:`~apd.distillation.chain_generators.systematic_allocation`): chain j's count is k·w_j to
        within one and k·w_j in expectation."""
        start = draw(torch.rand, (1,), self.shares, generator)
        return systematic_allocation(self.shares, k, start)

    def sample(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k codes [k, out_dim]: the chains of :meth:`draw_chains`, then a z for each member, from ``generator``."""
        chains = self.draw_chains(k, generator)
        return self(draw(torch.randn, (k, self.z_dim), self.embedding, generator), chains)


class ChainInput(nn.Module):
    """A critic's first layer on rows [codes, chain]: h = W·x + b + β_j, x the codes, j the chain in the last
    column, β [C, out] a learned bias per chain (zero at first); :attr:`weight` is W, the map of the codes."""

    def __init__(self, layer: nn.Linear, chains: int) -> None:
        super().__init__()
        self.layer = layer
        self.chain_bias = nn.Parameter(torch.zeros(chains, layer.out_features))

    @property
    def weight(self) -> Tensor:
        return self.layer.weight

    def forward(self, rows: Tensor) -> Tensor:
        """h for rows [B, in + 1]: [B, out]."""
        return self.layer(rows[..., :-1]) + self.chain_bias[rows[..., -1].long()]


def conditioned_critic(code_dim: int, hidden: list[int], chains: int) -> Critic:
    """A :class:`~apd.distillation.gan.Critic` of codes of ``code_dim`` with the chain read by its first layer
    (:class:`ChainInput`): it scores rows [codes, chain] of ``code_dim`` + 1 columns."""
    critic = Critic(code_dim, hidden)
    critic.net[0] = ChainInput(critic.net[0], chains)
    critic.in_dim = code_dim + 1
    return critic


def labelled(codes: Tensor, chains: Tensor) -> Tensor:
    """Rows [codes, chain]: ``codes`` [k, r] with each row's chain [k] as a last column."""
    return torch.cat([codes, chains.to(codes.dtype).unsqueeze(-1)], dim=-1)


class ConditionedTrainer(GANTrainer):
    """The conditional GAN of a :class:`ConditionedGenerator` and a :func:`conditioned_critic`: real batches
    are rows [codes, chain]; a critic step's fakes take the real rows' chains, a generator step's chains are
    drawn by share (:meth:`ConditionedGenerator.draw_chains`), each with a fresh z, from the trainer's stream
    (checkpointed with it). One seed: a conditioned trainer is not stacked."""

    label_columns = 1

    def _fakes_for(self, chains: Tensor) -> Tensor:
        z = draw(torch.randn, (len(chains), self.generator.z_dim), self.generator.embedding, self.rng)
        return labelled(self.generator(z, chains), chains)

    def fakes_like(self, real: Tensor) -> Tensor:
        """Fake rows with the chains of the real rows ``real`` [B, r + 1]."""
        return self._fakes_for(real[:, -1].long())

    def fakes(self, batch_size: int) -> Tensor:
        """``batch_size`` fake rows, their chains drawn by share."""
        return self._fakes_for(self.generator.draw_chains(batch_size, self.rng))
