"""Kept SGLD samples: a fixed set of k rows of a sample store, held in memory, used as the posterior.

This is the yardstick for any compressed posterior (docs/design.md, "Honest protocol"): a method that stores
S·D numbers is compared with ⌈S⌉ kept SGLD samples. Which rows are kept is chosen by

- :func:`evenly_spaced_rows` — evenly spaced over the run; with several chains, evenly across chains
  (the same number from each, then evenly spaced within each chain);
- :func:`random_rows` — a uniformly random subset (for the spread of the yardstick);
- :func:`apd.posteriors.stein.stein_rows` — Stein thinning (Riabiz et al., 2022).

:class:`FixedEnsemble` is any fixed set of weight vectors (its *members*); :class:`KeptSamples` is one
read from a store (it remembers the rows). ``max_members()`` is the number of members M: ``sample_weights(k)``
and ``predict_probs(x, k)`` give all of them when ``k ≥ M`` (never more, never repeats; a caller reports
``ensemble_size(k)``, the number it actually got), and a random subset of k members without
replacement when ``k`` is smaller.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from apd.nets import ParamSpec
from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore


class FixedEnsemble(Posterior):
    """A fixed set of M weight vectors (``vectors`` [M, D], given as ``members``); storage M·D.

    ``sample_weights(k)``: all M members (in their order) when k ≥ M, else k of them drawn without
    replacement (in member order) with ``generator``.
    """

    def __init__(self, members: Tensor, spec: ParamSpec, device: torch.device | str = "cpu",
                 name: str = "ensemble") -> None:
        if members.dim() != 2 or members.shape[0] < 1 or members.shape[1] != spec.numel:
            raise ValueError(f"members must be [M ≥ 1, {spec.numel}], got {list(members.shape)}")
        self.name, self.spec, self.device = name, spec, torch.device(device)
        self.vectors = members.detach().to(self.device, torch.float32)

    def __len__(self) -> int:
        return self.vectors.shape[0]

    def max_members(self) -> int:
        return len(self)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        if k < 1:
            raise ValueError(f"asked for {k} members; need at least 1")
        if k >= len(self):
            return self.vectors
        device = generator.device if generator is not None else torch.device("cpu")
        rows = torch.randperm(len(self), generator=generator, device=device)[:k].sort().values
        return self.vectors[rows.to(self.device)]

    def stored_parameters(self) -> int:
        return len(self) * self.spec.numel


class KeptSamples(FixedEnsemble):
    """k SGLD samples (rows ``rows`` of a sample store), read once into memory; storage k·D."""

    def __init__(self, members: Tensor, spec: ParamSpec, rows: np.ndarray | None = None,
                 device: torch.device | str = "cpu", name: str = "kept") -> None:
        super().__init__(members, spec, device, name)
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        if self.rows is not None and self.rows.shape != (len(self),):
            raise ValueError(f"{len(self)} members but {self.rows.size} row indices")

    @classmethod
    def from_store(cls, store: SampleStore, rows: np.ndarray | list[int], device: torch.device | str = "cpu",
                   name: str | None = None) -> KeptSamples:
        """The store's rows ``rows`` (distinct; kept in ascending order) as an ensemble."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size == 0:
            raise ValueError("no rows to keep")
        if np.unique(rows).size != rows.size:
            raise ValueError("kept rows must be distinct (a repeated row would cost storage and add nothing)")
        rows = np.sort(rows)
        return cls(store.read(rows), store.spec, rows, device, name or f"kept-{rows.size}")


def evenly_spaced_rows(n: int, k: int, chains: np.ndarray | None = None) -> np.ndarray:
    """k distinct row indices out of n, sorted, spread evenly (``round(linspace(0, n − 1, k))``, the rule
    of :func:`apd.distillation.training.evenly_spaced`).

    With ``chains`` (the chain id of each of the n rows, e.g. ``store.chains``), evenly across chains:
    each of the C chains gives ⌊k/C⌋ rows (the first k mod C chains, by id, one more), evenly spaced over
    that chain's own rows. A chain too short for its share is a ``ValueError``.
    """
    if not 1 <= k <= n:
        raise ValueError(f"cannot keep {k} of {n} rows")
    if chains is None:
        return _spread(np.arange(n), k)
    chains = np.asarray(chains).reshape(-1)
    if chains.size != n:
        raise ValueError(f"{chains.size} chain ids for {n} rows")
    ids = np.unique(chains)
    shares = [k // ids.size + (i < k % ids.size) for i in range(ids.size)]
    picked = []
    for chain, share in zip(ids, shares, strict=True):
        rows = np.flatnonzero(chains == chain)
        if share > rows.size:
            raise ValueError(f"chain {chain} holds {rows.size} rows, fewer than its share {share} of {k}")
        if share:
            picked.append(_spread(rows, share))
    return np.sort(np.concatenate(picked))


def random_rows(n: int, k: int, generator: torch.Generator | None = None) -> np.ndarray:
    """k distinct row indices out of n drawn uniformly without replacement, sorted."""
    if not 1 <= k <= n:
        raise ValueError(f"cannot keep {k} of {n} rows")
    return np.sort(torch.randperm(n, generator=generator)[:k].numpy()).astype(np.int64)


def _spread(rows: np.ndarray, k: int) -> np.ndarray:
    positions = np.unique(np.round(np.linspace(0, rows.size - 1, k)).astype(np.int64))
    return rows[positions]
