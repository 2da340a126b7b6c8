"""How a kept SGLD sample is stored: rounded whole at a precision, or as its deviation from its chain's mean.

:class:`RoundedWhole` at a precision P (:data:`~apd.distillation.precision.PRECISIONS`; a precision's name
stands for it) stores each kept sample rounded whole, θ̂_s = Q_P(θ_s)
(:func:`~apd.distillation.precision.round_trip`; at int8 and int4 one scale per block of 64 numbers, the
block's largest magnitude over the largest code); k samples take k·b_P bytes, b_P one D-vector at P
(:func:`~apd.distillation.precision.stored_bytes`).

:class:`AroundChainMeans` stores each chain's mean once, at precision M, and each kept sample of chain c as
its deviation from that mean, at P:

    θ̂_s = μ̂_c + Q_P(θ_s − μ̂_c),   μ̂_c = Q_M(μ_c),   μ_c = (1/n_c) Σ_{s ∈ c} θ_s,

the mean over all n_c stored samples of the chain (:func:`apd.posteriors.modes.chain_means`). A block's scale
then spans the deviations rather than the weights, so its code steps are finer wherever a chain moves less
than its weights spread: what APD's codec does when it rounds subspace coordinates about a mean it keeps at
M (:class:`~apd.distillation.precision.PartPrecisions`). k samples from j distinct chains take
k·b_P + j·b_M bytes; the yardstick's selections are stratified by chain
(:func:`~apd.posteriors.kept.chain_shares`), so that j = min(k, C) for C chains, whichever samples are kept.

Both have one interface: ``key`` (the storage in words, as results name it), ``stored(weights, chains)``
(the samples as read back) and ``worth(k, dim)`` (k samples' bytes in SGLD samples' worth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from apd.distillation.precision import in_samples, round_trip, stored_bytes
from apd.posteriors.modes import chain_means
from apd.samplers.store import SampleStore, StoreRows


@dataclass(frozen=True)
class RoundedWhole:
    """Kept samples each rounded whole at ``precision`` (module docstring)."""

    precision: str

    @property
    def key(self) -> str:
        """The storage in words, as results name it: the precision, ``int4``."""
        return self.precision

    def stored(self, weights: Tensor, chains: np.ndarray) -> Tensor:
        """θ̂_s = Q_P(θ_s) [k, D] of the samples ``weights`` [k, D] (of any chains)."""
        if self.precision == "float32":
            return weights
        return torch.stack([round_trip(row, self.precision) for row in weights])

    def worth(self, k: int, dim: int) -> float:
        """The storage of k kept samples of ``dim`` weights in SGLD samples' worth: k·b_P bytes."""
        return k * in_samples(stored_bytes(dim, self.precision), dim)


@dataclass(frozen=True, eq=False)
class AroundChainMeans:
    """Kept samples stored at ``precision`` as deviations from their chain's mean, stored at ``mean_at`` (module
    docstring): μ̂_c, the rows of ``means`` [C, D], for the chains ``ids`` (ascending)."""

    precision: str
    mean_at: str
    means: Tensor
    ids: np.ndarray

    @classmethod
    def of(cls, store: SampleStore | StoreRows, precision: str, mean_at: str) -> AroundChainMeans:
        """The chain means of ``store`` (every stored sample of each chain), stored at ``mean_at``."""
        means, _ = chain_means(store)
        return cls(precision, mean_at, torch.stack([round_trip(mean, mean_at) for mean in means]),
                   np.unique(store.chains))

    @property
    def key(self) -> str:
        """The storage in words, as results name it: ``int4 around chain means at int8``."""
        return f"{self.precision} around chain means at {self.mean_at}"

    def stored(self, weights: Tensor, chains: np.ndarray) -> Tensor:
        """θ̂_s [k, D] of the samples ``weights`` [k, D] of the chains ``chains`` [k]."""
        means = self.means[torch.from_numpy(np.searchsorted(self.ids, np.asarray(chains)))]
        return means + torch.stack([round_trip(deviation, self.precision) for deviation in weights - means])

    def worth(self, k: int, dim: int) -> float:
        """The storage of k kept samples of ``dim`` weights in SGLD samples' worth: k deviations and the
        min(k, C) means of the chains a stratified selection takes them from."""
        means = min(k, len(self.ids))
        return in_samples(k * stored_bytes(dim, self.precision) + means * stored_bytes(dim, self.mean_at), dim)


KeptStorage = str | RoundedWhole | AroundChainMeans  # a precision's name: RoundedWhole at it


def as_storage(storage: KeptStorage) -> RoundedWhole | AroundChainMeans:
    """``storage``, a precision's name read as :class:`RoundedWhole` at it."""
    return RoundedWhole(storage) if isinstance(storage, str) else storage


def storage_key(storage: KeptStorage) -> str:
    """A storage's name, as results name it: the precision, or :attr:`AroundChainMeans.key`."""
    return as_storage(storage).key


def kept_worth(k: int, dim: int, storage: KeptStorage) -> float:
    """k kept samples of ``dim`` weights in SGLD samples' worth, stored as ``storage`` is."""
    return as_storage(storage).worth(k, dim)


def kept_for(worth: float, dim: int, storage: KeptStorage, available: int) -> int:
    """How many SGLD samples stored as ``storage`` a method of storage ``worth`` (SGLD samples' worth) is set
    against: the fewest k whose :func:`kept_worth` is at least ``worth`` (⌈S / s_P⌉ for samples rounded whole
    at P, s_P one sample's storage there: ⌈S⌉ at float32), so that they take at least the method's bytes; at
    most ``available``."""
    one = kept_worth(1, dim, storage)  # the dearest sample: the first brings its chain's mean
    k = math.ceil(worth / one - 1e-9)  # the fewest that can do
    while k < available and kept_worth(k, dim, storage) < worth - 1e-9 * one:
        k += 1
    return min(available, k)
