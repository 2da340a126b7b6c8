"""Reading a joined store's rows (:func:`~apd.samplers.store_join.join_stores`) from its shards directly.

A joined store's ``samples`` is an HDF5 virtual dataset whose rows map, chain by chain, onto the shards'
rows. A shard whose worker stepped several chains together holds their rows interleaved (iteration, then
chain), so a chain's rows there are a strided selection, and HDF5 reads a strided selection of whole rows
far slower than the same rows one hyperslab each (fcNN1's store, four chains on two workers: 1,000
consecutive joined rows in 3.5 s through the virtual dataset, 0.1 s from the shards;
``benchmarks/bench_chains.py`` times both). :class:`ShardReader` resolves the mapping once, when the store is opened,
to a shard and a row there for every joined row, and reads each run of rows consecutive in one shard as
one hyperslab of that shard: the same bytes, in the same places.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from apd.errors import ArtifactError
from apd.samplers.store_format import LOCKING, SAMPLES, read_at, source_path


def _selected_rows(space: h5py.h5s.SpaceID, width: int) -> np.ndarray | None:
    """The rows of a regular hyperslab selection of whole rows of ``width`` columns, in HDF5's order of its
    elements; None for any other selection."""
    if space.get_select_type() != h5py.h5s.SEL_HYPERSLABS or not space.is_regular_hyperslab():
        return None
    start, stride, count, block = space.get_regular_hyperslab()
    if start[1] != 0 or count[1] * block[1] != width or (count[1] > 1 and stride[1] != block[1]):
        return None
    blocks = start[0] + stride[0] * np.arange(count[0], dtype=np.int64)
    return (blocks[:, None] + np.arange(block[0], dtype=np.int64)).reshape(-1)


class ShardReader:
    """Rows of a joined store read from its shards: ``files`` (opened read-only), and for each of the
    store's rows its shard's position in ``files`` (``shard``) and its row there (``row``)."""

    def __init__(self, files: list[h5py.File], shard: np.ndarray, row: np.ndarray) -> None:
        self.files, self.shard, self.row = files, shard, row
        self._datasets = [file[SAMPLES] for file in files]

    @classmethod
    def of(cls, samples: h5py.Dataset, path: Path, n: int) -> ShardReader | None:
        """The reader of the first ``n`` rows of the virtual dataset ``samples`` of the joined store at
        ``path``; None where a mapping is not one of whole rows, as :func:`join_stores` writes them, or a
        row is mapped by none (HDF5's own reading of the virtual dataset then serves)."""
        width = samples.shape[1]
        names: list[str] = []
        shard = np.full(n, -1, dtype=np.int64)
        row = np.zeros(n, dtype=np.int64)
        for mapping in samples.virtual_sources():
            joined, source = _selected_rows(mapping.vspace, width), _selected_rows(mapping.src_space, width)
            if joined is None or source is None or joined.size != source.size:
                return None
            if mapping.file_name not in names:
                names.append(mapping.file_name)
            inside = joined < n
            shard[joined[inside]] = names.index(mapping.file_name)
            row[joined[inside]] = source[inside]
        if (shard < 0).any():
            return None
        files: list[h5py.File] = []
        try:
            for name in names:
                files.append(h5py.File(source_path(path, name), "r", locking=LOCKING))
        except OSError as exc:
            for file in files:
                file.close()
            raise ArtifactError(f"{path}: cannot open its shard {source_path(path, name)} ({exc})") from None
        return cls(files, shard, row)

    def read(self, start: int, out: np.ndarray) -> None:
        """Fill the C-contiguous ``out`` [k, D] with the joined rows start:start+k, one hyperslab read per run
        of rows consecutive in one shard."""
        if len(out) == 1:  # a random row: no runs to find
            read_at(self._datasets[self.shard[start]], int(self.row[start]), out)
            return
        shard, row = self.shard[start:start + len(out)], self.row[start:start + len(out)]
        breaks = np.flatnonzero((np.diff(shard) != 0) | (np.diff(row) != 1)) + 1
        for a, b in zip(np.r_[0, breaks], np.r_[breaks, len(out)], strict=True):
            read_at(self._datasets[shard[a]], int(row[a]), out[a:b])

    def close(self) -> None:
        for file in self.files:
            file.close()
