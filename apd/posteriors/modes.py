"""A mixture over the modes SGLD's chains settle in, each with a Kronecker-factored Laplace spread.

Chains started from over-dispersed prior draws can stay in separate modes of the posterior. The single
mean of their samples is then no network at all (on Fashion-MNIST fcNN2 it classifies 57 % of validation
images, each chain's own mean 86–87 %: ``apd experiment modes``), and a model of θ built around it,
as the subspace codec of :mod:`apd.distillation.codec` is, puts networks between the modes. This model
keeps one mean per chain:

    q(θ) = Σ_m π_m 𝒩(θ; μ_m, α²·Σ_m),   Σ_m = (N·G_m ⊗ A_m + λI)⁻¹ layer by layer,

with μ_m the mean of chain m's stored samples, π_m its share of them, Σ_m the Kronecker-factored Laplace
covariance at μ_m (Ritter, Botev & Barber, 2018; :class:`~apd.distillation.kronecker.KroneckerResidual`)
and one factor α for all modes, chosen on validation inputs alone so that the mixture's networks disagree
there as much as SGLD's do (mean mutual information; :func:`apd.distillation.residual.matched_scale`).
A chain's mode is estimated two ways where the pipeline aligns its samples: the plain mean of the chain's
samples, and the mean over them aligned as ``apd distill`` aligns them for the generator
(:mod:`apd.distillation.alignment`). A chain that visits differently permuted copies of its mode (hidden
units relabelled, the same function) blurs the plain mean (on digits each chain's plain mean classifies
67–82 % of the validation images, its aligned mean 95–97 %: ``apd experiment modes``); alignment to a
reference shared by every chain adds permutation noise to a chain that does not (on fcNN1 it relabels one
chain's samples 3 to 91 ways, and the chains' validation NLL rises from 0.31 to 0.32–0.44). Each chain keeps
the estimate whose single network has the lower validation NLL (:func:`prefer_aligned`). It has no
generator: it measures what a few stored modes with a local Gaussian spread keep of SGLD's behaviour, at
M·(1 + the factors' share) samples' worth of storage. Members are assigned to modes in proportion to π
(systematic allocation, no sampling noise in the counts).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from apd.distillation.alignment import permute
from apd.distillation.chain_generators import systematic_allocation
from apd.distillation.kronecker import KroneckerResidual
from apd.distillation.residual import matched_scale
from apd.metrics import nll
from apd.nets import ParamSpec, predict_probs
from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore

_CHUNK_ELEMENTS = 2**26  # floats of samples read at once


def chain_means(store: SampleStore, perms: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(μ_m [M, D], π_m [M]) over the store's chains in ascending order: each chain's mean (accumulated in
    float64) and its share of the rows; with ``perms`` [len(store), H], the mean of the rows each permuted by
    its own (:func:`~apd.distillation.alignment.permute`)."""
    chains = store.chains
    labels = np.unique(chains)
    totals = torch.zeros(len(labels), store.dim, dtype=torch.float64)
    chunk = max(1, _CHUNK_ELEMENTS // store.dim)
    for start in range(0, len(store), chunk):
        rows = store.read_all(start, min(len(store), start + chunk))
        if perms is not None:
            rows = permute(rows, store.spec, perms[start:start + len(rows)])
        rows = rows.double()
        which = torch.from_numpy(np.searchsorted(labels, chains[start:start + len(rows)]))
        totals.index_add_(0, which, rows)
    counts = torch.from_numpy(np.array([(chains == c).sum() for c in labels], dtype=np.float64))
    return (totals / counts[:, None]).float(), (counts / counts.sum()).float()


def prefer_aligned(plain: Tensor, aligned: Tensor, spec: ParamSpec, x: Tensor, y: Tensor) -> tuple[Tensor, dict]:
    """Per chain, whether the aligned mean estimates its mode better than the plain one: True where the
    single network at ``aligned[m]`` has a lower NLL, −(1/N) Σ_n log p(y_n | x_n, θ), on (x, y) (validation
    images) than the network at ``plain[m]``; and both NLLs per chain."""
    losses = {name: [nll(p, y) for p in predict_probs(spec, means.to(x.device), x)]
              for name, means in (("as_stored", plain), ("aligned", aligned))}
    return torch.tensor([a < b for a, b in zip(losses["aligned"], losses["as_stored"], strict=True)]), losses


class ModeMixture(Posterior):
    """Σ_m π_m N(μ_m, α² Σ_m) (module docstring) for means [M, D], weights [M] and one Kronecker spread per
    mode (their ``scale`` is α)."""

    def __init__(self, means: Tensor, weights: Tensor, spreads: list[KroneckerResidual], spec: ParamSpec,
                 device: torch.device | str = "cpu", name: str = "modes") -> None:
        if means.shape != (len(weights), spec.numel) or len(spreads) != len(weights):
            raise ValueError(f"{len(weights)} modes need means [{len(weights)}, {spec.numel}] and as many spreads, "
                             f"got means {list(means.shape)} and {len(spreads)} spreads")
        self.name, self.spec, self.device = name, spec, torch.device(device)
        self.means, self.weights = means.to(self.device), weights.to(self.device)
        self.spreads = [spread.to(self.device) for spread in spreads]

    @classmethod
    def fit(cls, means: Tensor, weights: Tensor, spec: ParamSpec, layer_sizes: list[int], rank: int,
            x_fisher: Tensor, data_size: float, prior_precision: float, generator: torch.Generator,
            device: torch.device | str = "cpu") -> ModeMixture:
        """Modes at ``means`` [M, D] with shares ``weights`` [M] (e.g. :func:`chain_means`), a spread with the
        top-``rank`` input directions per layer fit at each mean on ``x_fisher``, N = ``data_size``,
        λ = ``prior_precision`` (α = 1 until :meth:`match_disagreement`)."""
        spreads = [KroneckerResidual.fit(layer_sizes, rank, mean, x_fisher, data_size, prior_precision, generator)
                   for mean in means]
        return cls(means, weights, spreads, spec, device)

    def modes_of(self, k: int) -> Tensor:
        """The mode of each of k members (:func:`systematic_allocation` by the modes' shares)."""
        return systematic_allocation(self.weights, k)

    def _spread(self, modes: Tensor, generator: torch.Generator | None) -> Tensor:
        noise = torch.empty(len(modes), self.spec.numel, device=self.device)
        for m, spread in enumerate(self.spreads):
            members = (modes == m).nonzero()[:, 0]
            if len(members):
                noise[members] = spread.sample(len(members), generator)
        return noise

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        modes = self.modes_of(k)
        return self.means[modes] + self._spread(modes, self.on_device(generator))

    def match_disagreement(self, x: Tensor, target: float, networks: int, generator: torch.Generator) -> float:
        """Set α so that ``networks`` members have mean mutual information ``target`` on ``x``
        (:func:`~apd.distillation.residual.matched_scale`, the spreads drawn once at α = 1); returns α."""
        for spread in self.spreads:
            spread.scale.fill_(1.0)
        modes = self.modes_of(networks)
        alpha = matched_scale(self.means[modes], self._spread(modes, self.on_device(generator)), self.spec,
                              x.to(self.device), target)
        for spread in self.spreads:
            spread.scale.fill_(alpha)
        return alpha

    def stored_parameters(self) -> int:
        factors = sum(buffer.numel() for spread in self.spreads for buffer in spread.buffers())
        return self.means.numel() + self.weights.numel() + factors
