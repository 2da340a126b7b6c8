"""Predictions of a sample store's rows on one input batch, each row predicted once and shared.

SGLD's draws, the kept and Stein-thinned samples, SGLD's side of the fidelity table, the yardstick's
reference and its kept subsets are all ensembles of stored samples θ_s, scored on the same stacked
evaluation inputs x. Their member predictions p_s(y | x) = softmax(f(x; θ_s)) are rows of one
[S, N, C] prediction of the S stored samples: :class:`StoredPredictions` computes a row the first time an
ensemble needs it, at each storage precision it is asked at (θ_s as stored at that precision,
:func:`apd.distillation.precision.round_trip`), and hands out later requests from what it kept.

A row's prediction does not depend on which other rows it is computed with (the batched
:func:`apd.nets.predict_probs` computes each network on its own), so an ensemble read from here is the one
its own prediction gives. Rows are kept while they fit :data:`KEPT_BYTES`; past it, a row is predicted
again whenever it is asked for.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from apd.distillation.precision import round_trip
from apd.nets import predict_probs
from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore, StoreRows

READ_ROWS = 200  # rows read and predicted at a time (a LeNet-5 row is 0.25 MB, an fcNN2 row 1.9 MB)
# Predictions kept, in bytes (on the device they are computed on): Fashion-MNIST's 20,000 stacked inputs
# take 0.8 MB a row, so the 3,980 samples of the LeNet-5 and fcNN2 stores fit.
KEPT_BYTES = 4 * 2**30


class StoredPredictions:
    """p_s(y | x) [N, C] of the rows s of ``store`` on the inputs ``x`` [N, ...], computed on ``device``
    (module docstring)."""

    def __init__(self, store: SampleStore | StoreRows, x: Tensor, device: torch.device | str,
                 kept_bytes: int = KEPT_BYTES) -> None:
        self.store, self.device, self.kept_bytes = store, torch.device(device), kept_bytes
        self.x = x.to(self.device)
        self._kept: dict[str, dict[int, Tensor]] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self.store)

    def probs(self, rows: np.ndarray | Tensor | list[int], precision: str = "float32") -> Tensor:
        """The member predictions [k, N, C] of the store's ``rows`` (in their order, repeats allowed), each row
        stored at ``precision``."""
        rows = [int(r) for r in np.asarray(rows, dtype=np.int64).reshape(-1)]
        kept = self._kept.setdefault(precision, {})
        missing = sorted(set(rows) - kept.keys())
        fresh: dict[int, Tensor] = {}
        for start in range(0, len(missing), READ_ROWS):
            block = missing[start:start + READ_ROWS]
            predicted = self._predict(block, precision)
            if self._bytes + predicted.nbytes <= self.kept_bytes:
                kept.update(zip(block, predicted, strict=True))
                self._bytes += predicted.nbytes
            else:
                fresh.update(zip(block, predicted, strict=True))
        return torch.stack([kept[r] if r in kept else fresh[r] for r in rows])

    def draw(self, method: Posterior, k: int, generator: torch.Generator | None) -> Tensor | None:
        """``method.predict_probs(x, k, generator)`` (the same draw, ``generator`` advanced alike) read from
        here, where its members are rows of this store as stored (:meth:`Posterior.stored_rows`); None, with
        ``generator`` untouched, where they are not."""
        rows = method.stored_rows(self.store, k, generator)
        return None if rows is None else self.probs(rows)

    def _predict(self, rows: list[int], precision: str) -> Tensor:
        weights = self.store.read(np.asarray(rows, dtype=np.int64))
        if precision != "float32":
            weights = torch.stack([round_trip(row, precision) for row in weights])
        return predict_probs(self.store.spec, weights.to(self.device), self.x)
