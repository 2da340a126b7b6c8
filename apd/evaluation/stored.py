"""Predictions of a sample store's rows on one input batch, each row predicted once and shared.

SGLD's draws, the kept and Stein-thinned samples, SGLD's side of the fidelity table, the yardstick's
reference and its kept subsets are all ensembles of stored samples θ_s, scored on the same stacked
evaluation inputs x. Their member predictions p_s(y | x) = softmax(f(x; θ_s)) are rows of one
[S, N, C] prediction of the S stored samples: :class:`StoredPredictions` computes a row the first time an
ensemble needs it, as each storage it is asked at keeps it (θ_s rounded at a precision, or about its chain's
mean: :mod:`apd.evaluation.kept_storage`), and hands out later requests from what it kept. With a row
it keeps the row's entropies H[p_s(· | x_n)] [N] (float64), BALD's costliest part, once computed: an
ensemble's BALD H[p̄] − (1/K) Σ_s H[p_s] then averages them (:meth:`StoredPredictions.members`) where
computing them again for each of the yardstick's subsets took most of its judging time. An ensemble judged
many times at one size (a yardstick size's subsets) is stacked into buffers allocated once
(:class:`MemberBuffers`): fresh memory for each subset's [k, N, C] predictions, and again for them in float64,
cost several times the copies themselves.

A row's prediction does not depend on which other rows it is computed with (the batched
:func:`apd.nets.predict_probs` computes each network on its own), so an ensemble read from here is the one
its own prediction gives. Rows are kept while they take at most :data:`KEPT_SHARE` of the memory the
device has available when the predictions are set up (:func:`available_bytes`); past it, a row is predicted
again whenever it is asked for. Entropies are kept in what the predictions leave of that share, and give
way to them: a prediction that needs their room drops them (oldest first), since they are quick to compute
again. Fashion-MNIST's 20,000 stacked inputs take 0.8 MB a row (and 0.16 MB of entropies), so fcNN1's 9,972
samples take 8 GB at float32: kept whole where 16 GB are available. The yardstick's kept subsets
draw from the whole store at every size, so a row not kept is predicted again many times over; a user done
with one storage's rows drops them (:meth:`StoredPredictions.forget`), so that the next storage's fit in their
room (fcNN1's int8 rows beside its float32 ones would take 14 GB).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from apd.evaluation.kept_storage import KeptStorage, as_storage, storage_key
from apd.nets import predict_probs
from apd.posteriors.base import Posterior
from apd.samplers.store import SampleStore, StoreRows
from apd.uncertainty import member_entropies

READ_ROWS = 200  # rows read and predicted at a time (a LeNet-5 row is 0.25 MB, an fcNN2 row 1.9 MB)
ENTROPY_ROWS = 50  # rows whose entropies are computed at a time (float64: 80 MB for Fashion's 20,000 inputs)
Key = TypeVar("Key")
KEPT_SHARE = 0.5  # of the device's available memory, the most the kept predictions take
MEMINFO = Path("/proc/meminfo")
NO_BAR = partial(tqdm, disable=True)


def available_bytes(device: torch.device) -> int:
    """Memory available for new tensors on ``device``: the CUDA driver's free memory on the card, or on the CPU
    the kernel's estimate of memory available without swapping (``MemAvailable`` of /proc/meminfo; the free
    pages ``os.sysconf`` reports where there is no such file)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if MEMINFO.is_file():
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class MemberBuffers(NamedTuple):
    """Room for an ensemble of k stored rows, reused from one ensemble of that size to the next: their
    predictions ``probs`` [k, N, C] (float32, as kept), the same in float64 (``doubled``, what the scores
    compute from) and their entropies ``entropies`` [k, N] (float64)."""

    probs: Tensor
    doubled: Tensor
    entropies: Tensor


class StoredPredictions:
    """p_s(y | x) [N, C] of the rows s of ``store`` on the inputs ``x`` [N, ...], computed on ``device``, kept
    up to ``kept_bytes`` (by default :data:`KEPT_SHARE` of the device's available memory; module docstring).
    ``progress`` makes the bar (tqdm's arguments) that counts the networks of each prediction of more than one
    block (fcNN1's 9,972 samples take minutes on a CPU), and the bars of those who read them many blocks at a
    time (:func:`~apd.evaluation.yardstick.reference_sums`); by default none is shown."""

    def __init__(self, store: SampleStore | StoreRows, x: Tensor, device: torch.device | str,
                 kept_bytes: int | None = None, progress: Callable[..., tqdm] | None = None) -> None:
        self.store, self.device = store, torch.device(device)
        self.progress = NO_BAR if progress is None else progress
        self.kept_bytes = int(KEPT_SHARE * available_bytes(self.device)) if kept_bytes is None else kept_bytes
        self.x = x.to(self.device)
        self._kept: dict[str, dict[int, Tensor]] = {}  # by storage_key
        self._entropies: dict[tuple[str, int], Tensor] = {}  # (storage key, row) of a kept row, oldest first
        self._bytes = 0  # of the kept predictions
        self._row_bytes = 4 * len(x) * store.spec.layer_sizes[-1]  # one row's float32 [N, C]
        self._entropy_row_bytes = 8 * len(x)  # its entropies, float64 [N]

    def __len__(self) -> int:
        return len(self.store)

    def probs(self, rows: np.ndarray | Tensor | list[int], storage: KeptStorage = "float32") -> Tensor:
        """The member predictions [k, N, C] of the store's ``rows`` (in their order, repeats allowed), each row
        stored as ``storage`` is."""
        rows, found = self._gather(rows, storage)
        return torch.stack([found[r] for r in rows])

    def member_buffers(self, k: int) -> MemberBuffers:
        """Room for :meth:`members` of k rows, on this object's device."""
        n, classes = len(self.x), self.store.spec.layer_sizes[-1]
        return MemberBuffers(torch.empty(k, n, classes, device=self.device),
                             torch.empty(k, n, classes, dtype=torch.float64, device=self.device),
                             torch.empty(k, n, dtype=torch.float64, device=self.device))

    def members(self, rows: np.ndarray | Tensor | list[int], storage: KeptStorage = "float32",
                into: MemberBuffers | None = None) -> tuple[Tensor, Tensor]:
        """:meth:`probs` of ``rows`` and their entropies H[p_s(· | x_n)] [k, N] (float64,
        :func:`apd.uncertainty.member_entropies`): read where kept, else computed now and kept with a kept row
        while they fit beside the predictions (which come first: :meth:`_room_for`). With ``into``
        (:meth:`member_buffers` of as many rows), both are written there, over the ensemble before."""
        if into is not None and len(into.probs) != len(rows):
            raise ValueError(f"buffers for {len(into.probs)} rows given {len(rows)}")
        rows, found = self._gather(rows, storage)
        key = storage_key(storage)
        kept = self._kept[key]
        missing = sorted({r for r in rows if (key, r) not in self._entropies})
        computed = {}
        for start in range(0, len(missing), ENTROPY_ROWS):
            part = missing[start:start + ENTROPY_ROWS]
            computed.update(zip(part, member_entropies(torch.stack([found[r] for r in part])), strict=True))
        for r in missing:
            if r in kept and self._bytes + self._entropy_bytes() + self._entropy_row_bytes <= self.kept_bytes:
                self._entropies[key, r] = computed[r].clone()  # its own memory, freed when dropped
        probs, entropies = (None, None) if into is None else (into.probs, into.entropies)
        return (torch.stack([found[r] for r in rows], out=probs),
                torch.stack([computed[r] if r in computed else self._entropies[key, r] for r in rows], out=entropies))

    def _gather(self, rows: np.ndarray | Tensor | list[int],
                storage: KeptStorage) -> tuple[list[int], dict[int, Tensor]]:
        """``rows`` as a list, and the prediction of each: kept, or predicted now (past the budget)."""
        rows = [int(r) for r in np.asarray(rows, dtype=np.int64).reshape(-1)]
        kept = self._kept.setdefault(storage_key(storage), {})
        fresh = self._fill(sorted(set(rows) - kept.keys()), storage, keep_only=False)
        return rows, {r: kept[r] if r in kept else fresh[r] for r in set(rows)}

    def prefetch(self, rows: np.ndarray | Tensor | list[int], storage: KeptStorage = "float32") -> None:
        """Predict the store's ``rows`` not yet kept as ``storage`` stores them, :data:`READ_ROWS` at a time, and keep
        them while they fit: the ensembles drawn next (a yardstick size's every subset) are then read from
        here, where asking for each one's few rows in turn would predict them a few networks at a time,
        which costs a CNN several times more per network than a full block."""
        kept = self._kept.setdefault(storage_key(storage), {})
        wanted = {int(r) for r in np.asarray(rows, dtype=np.int64).reshape(-1)}
        self._fill(sorted(wanted - kept.keys()), storage, keep_only=True)

    def one_storage_at_a_time(self, storages: Mapping[Key, KeptStorage]) -> Iterator[Key]:
        """The keys of ``storages`` (each the storage its ensembles are judged at) grouped by storage, the
        storages in the order they first appear and each group in its own order; once the caller is done with a
        storage's last key (asks for the next one), that storage's rows are dropped (:meth:`forget`), so that
        the next storage's fit where they were kept."""
        order = list(dict.fromkeys(storage_key(storage) for storage in storages.values()))
        keys = sorted(storages, key=lambda key: order.index(storage_key(storages[key])))
        for at, key in enumerate(keys):
            yield key
            if at + 1 == len(keys) or storage_key(storages[keys[at + 1]]) != storage_key(storages[key]):
                self.forget(storages[key])

    def forget(self, storage: KeptStorage) -> None:
        """Drop the rows kept as ``storage`` stores them, and their entropies: no ensemble to come asks for them,
        and their room goes to another storage's rows (asked for again, they are predicted again)."""
        key = storage_key(storage)
        self._bytes -= self._row_bytes * len(self._kept.pop(key, {}))
        self._entropies = {kept: entropies for kept, entropies in self._entropies.items() if kept[0] != key}

    def _room_for(self, needed: int) -> bool:
        """Whether ``needed`` more bytes of predictions fit ``kept_bytes``, dropping kept entropies (oldest first)
        to make room: a row's entropies take milliseconds to compute again, its prediction far longer."""
        if self._bytes + needed > self.kept_bytes:
            return False
        while self._bytes + self._entropy_bytes() + needed > self.kept_bytes:
            del self._entropies[next(iter(self._entropies))]
        return True

    def _entropy_bytes(self) -> int:
        return self._entropy_row_bytes * len(self._entropies)

    def _fill(self, missing: list[int], storage: KeptStorage, keep_only: bool) -> dict[int, Tensor]:
        """Predict the rows ``missing``, a block at a time, keeping each block while it fits (``kept_bytes``);
        the blocks that do not fit are returned, or with ``keep_only`` not predicted."""
        kept, fresh = self._kept[storage_key(storage)], {}
        if not missing:  # every row kept: most calls of a yardstick's subsets
            return fresh
        blocks = range(0, len(missing), READ_ROWS)
        counted = self.progress if len(blocks) > 1 else NO_BAR  # a subset's few rows: too quick for a bar
        with counted(total=len(missing), desc=f"predicting stored samples ({storage_key(storage)})",
                     unit="network") as bar:
            for start in blocks:
                block = missing[start:start + READ_ROWS]
                fits = self._room_for(self._row_bytes * len(block))
                if keep_only and not fits:
                    break
                predicted = self._predict(block, storage)
                if fits:
                    kept.update(zip(block, predicted, strict=True))
                    self._bytes += self._row_bytes * len(block)
                else:
                    fresh.update(zip(block, predicted, strict=True))
                bar.update(len(block))
        return fresh

    def draw(self, method: Posterior, k: int, generator: torch.Generator | None) -> Tensor | None:
        """``method.predict_probs(x, k, generator)`` (the same draw, ``generator`` advanced alike) read from
        here, where its members are rows of this store as stored (:meth:`Posterior.stored_rows`); None, with
        ``generator`` untouched, where they are not."""
        rows = method.stored_rows(self.store, k, generator)
        return None if rows is None else self.probs(rows)

    def _predict(self, rows: list[int], storage: KeptStorage) -> Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        weights = as_storage(storage).stored(self.store.read(rows), self.store.chains[rows])
        return predict_probs(self.store.spec, weights.to(self.device), self.x)
