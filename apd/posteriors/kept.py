"""Kept SGLD samples: a fixed set of k rows of a sample store, held in memory, used as the posterior.

This is the yardstick for any compressed posterior (docs/design.md, "Honest protocol"): a method that stores
S·D numbers is compared with ⌈S⌉ kept SGLD samples. Which rows are kept is chosen by

- :func:`evenly_spaced_rows` — centred in equal parts of each chain (the same number from each chain);
- :func:`last_rows` — the last samples of each chain (with one per chain: each chain's final state);
- :func:`random_rows` — random subsets stratified by chain (for the spread of the yardstick);
- :func:`apd.posteriors.stein.stein_rows` — Stein thinning (Riabiz et al., 2022).

:class:`FixedEnsemble` is any fixed set of weight vectors (its *members*); :class:`KeptSamples` is one
read from a store (it remembers the rows). ``max_members()`` is the number of members M: ``sample_weights(k)``
and ``predict_probs(x, k)`` give all of them when ``k ≥ M`` (never more, never repeats; a caller reports
``ensemble_size(k)``, the number it actually got), and a random subset of k members without
replacement when ``k`` is smaller.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from apd.nets import ParamSpec
from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore, StoreRows, chain_partition


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
        picked = self._pick(k, generator)
        return self.vectors if picked is None else self.vectors[picked.to(self.device)]

    def _pick(self, k: int, generator: torch.Generator | None) -> Tensor | None:
        """The members a draw of k is: None for all of them, else k member indices in order."""
        if k < 1:
            raise ValueError(f"asked for {k} members; need at least 1")
        if k >= len(self):
            return None
        device = generator.device if generator is not None else torch.device("cpu")
        return torch.randperm(len(self), generator=generator, device=device)[:k].sort().values

    def stored_parameters(self) -> int:
        return len(self) * self.spec.numel


class KeptSamples(FixedEnsemble):
    """k SGLD samples (rows ``rows`` of a sample store), read once into memory; storage k·D."""

    def __init__(self, members: Tensor, spec: ParamSpec, rows: np.ndarray | None = None,
                 device: torch.device | str = "cpu", name: str = "kept",
                 source: SampleStore | StoreRows | None = None) -> None:
        super().__init__(members, spec, device, name)
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        if self.rows is not None and self.rows.shape != (len(self),):
            raise ValueError(f"{len(self)} members but {self.rows.size} row indices")
        self.source = source  # the store the rows are of, where known

    def stored_rows(self, store: SampleStore | StoreRows, k: int,
                    generator: torch.Generator | None = None) -> np.ndarray | None:
        """The rows a draw is, when ``store`` is the one they were read from."""
        if self.rows is None or store is not self.source:
            return None
        picked = self._pick(k, generator)
        return self.rows if picked is None else self.rows[picked.cpu().numpy()]

    @classmethod
    def from_store(cls, store: SampleStore | StoreRows, rows: np.ndarray | list[int],
                   device: torch.device | str = "cpu", name: str | None = None) -> KeptSamples:
        """The store's rows ``rows`` (distinct; kept in ascending order) as an ensemble, with the store as its
        source."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size == 0:
            raise ValueError("no rows to keep")
        if np.unique(rows).size != rows.size:
            raise ValueError("kept rows must be distinct (a repeated row would cost storage and add nothing)")
        rows = np.sort(rows)
        return cls(store.read(rows), store.spec, rows, device, name or f"kept-{rows.size}", store)


def evenly_spaced_rows(n: int, k: int, chains: np.ndarray | None = None) -> np.ndarray:
    """k distinct row indices out of n, sorted, centred in equal parts of each chain.

    Each chain gives its share of the k rows (:func:`chain_shares`: ⌊k/C⌋ from each of the C chains, one
    more from the first k mod C chains by id; ``chains`` None is one chain). A chain of m rows giving j of
    them gives the centres of j equal parts of its rows, positions

        p_i = ⌊(i + ½)·m / j⌋,  i = 0 … j − 1,

    (distinct, since consecutive centres are m/j ≥ 1 apart). So one row of a chain is its middle one,
    never the first stored sample after burn-in: position 0 is kept only when j > m/2, more than half of the
    chain. A chain too short for its share is a ``ValueError``.
    """
    return _pick(n, k, chains, lambda rows, j: rows[((2 * np.arange(j) + 1) * rows.size) // (2 * j)])


def last_rows(n: int, k: int, chains: np.ndarray | None = None) -> np.ndarray:
    """k distinct row indices out of n, sorted: each chain's share (:func:`chain_shares`) taken from its end,
    its last j rows; with as many rows as chains, the last sample of each chain."""
    return _pick(n, k, chains, lambda rows, j: rows[rows.size - j:])


def random_rows(n: int, k: int, generator: torch.Generator | None = None,
                chains: np.ndarray | None = None) -> np.ndarray:
    """k distinct row indices out of n, sorted, drawn stratified by chain with ``generator``: each of the C
    chains gives ⌊k/C⌋ rows and k mod C distinct chains, drawn uniformly among those long enough, one more
    (so that k < C does not always leave the same chains out); each chain's rows are drawn uniformly without
    replacement among its own. ``chains`` None is one chain: a uniformly random subset."""
    device = generator.device if generator is not None else "cpu"

    def draw(rows: np.ndarray, j: int) -> np.ndarray:
        return rows[torch.randperm(rows.size, generator=generator, device=device)[:j].cpu().numpy()]

    return _pick(n, k, chains, draw, generator)


def chain_shares(k: int, lengths: list[int], generator: torch.Generator | None = None) -> list[int]:
    """How many of k rows each of C chains of ``lengths`` gives: ⌊k/C⌋ each, and one more from k mod C of
    the chains holding more than ⌊k/C⌋ rows: the first by id or, with ``generator``, distinct ones drawn
    uniformly. Chains too short for that are a ``ValueError``."""
    base, extra = divmod(k, len(lengths))
    shares = [base] * len(lengths)
    longer = [c for c, m in enumerate(lengths) if m > base]
    if extra > len(longer) or base > min(lengths):
        raise ValueError(f"chains of {lengths} rows cannot give {k} rows evenly")
    if generator is None:
        chosen = longer[:extra]
    else:
        chosen = [longer[i] for i in torch.randperm(len(longer), generator=generator, device=generator.device)[:extra]]
    for c in chosen:
        shares[c] += 1
    return shares


def _pick(n: int, k: int, chains: np.ndarray | None, within: Callable[[np.ndarray, int], np.ndarray],
          generator: torch.Generator | None = None) -> np.ndarray:
    """k rows: ``within(rows, j)`` of each chain's rows and share j (:func:`chain_shares`), sorted."""
    if not 1 <= k <= n:
        raise ValueError(f"cannot keep {k} of {n} rows")
    labels = np.zeros(n, dtype=np.int64) if chains is None else np.asarray(chains).reshape(-1)
    if labels.size != n:
        raise ValueError(f"{labels.size} chain ids for {n} rows")
    _, rows, _ = chain_partition(labels)
    groups = [r.numpy() for r in rows]
    shares = chain_shares(k, [g.size for g in groups], generator)
    return np.sort(np.concatenate([within(g, j) for g, j in zip(groups, shares, strict=True) if j]))
