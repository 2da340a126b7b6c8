"""Joining the shards that parallel sampler workers wrote into one read-only sample store without copying a
sample: an HDF5 virtual dataset maps the joined rows onto the shards' rows, ordered by chain.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from apd.errors import ArtifactError
from apd.samplers.store import SampleStore
from apd.samplers.store_format import (
    COLUMNS,
    FORMAT_NAME,
    FORMAT_VERSION,
    LOCKING,
    N_COMPLETE,
    SAMPLES,
    WRITING,
    describe,
)

_JOINED_LIBVER = ("earliest", "v110")  # a virtual dataset needs the 1.10 layout message; readers need HDF5 ≥ 1.10
_REPACK_BYTES = 2**28  # rows copied at a time by repack_by_chain


def repack_by_chain(source: str | Path, target: str | Path, compression: str = "none") -> int:
    """Copy the complete store at ``source`` into a new store at ``target`` (replaced if there) with its rows
    ordered by chain id, each chain's rows in sampling order: the order :func:`join_stores` gives, from the
    rows a sampler stepping its chains together appends interleaved (iteration, then chain). Returns the row
    count; ``source`` is left as it is."""
    with SampleStore.open(source) as store:
        order = np.argsort(store.chains, kind="stable")
        values = {name: store._column(name)[order] for name in COLUMNS}
        block = max(1, _REPACK_BYTES // (4 * store.dim))
        with SampleStore.create(target, store.spec, store.meta, compression=compression, overwrite=True) as out:
            for start in range(0, order.size, block):
                part = slice(start, start + block)
                out.append_many(store.read(order[part]), steps=values["step"][part], chains=values["chain"][part],
                                lrs=values["lr"][part], log_liks=values["log_lik"][part])
    return int(order.size)


def join_stores(path: str | Path, shards: Sequence[str | Path], names: Sequence[str] | None = None,
                meta: dict | None = None) -> int:
    """Join complete stores (``shards``) into one read-only store at ``path`` without copying a sample;
    returns its row count.

    The joined ``samples`` is an HDF5 virtual dataset (HDF5 ≥ 1.10) whose rows map onto the shards' rows;
    the small per-sample columns (step, chain, lr, log_lik) are copied. Rows are ordered by chain id, each
    chain's rows in sampling order, so ``k`` evenly spaced rows of the joined store take an equal share of
    every chain of equal length, and the join of W workers' shards equals, row for row, the join of one
    worker's. Each chain must lie in one shard, its rows there evenly spaced: contiguous (chains run one after
    another) or one per kept iteration among the shard's other chains (chains stepped together, rows ordered
    by iteration then chain); a chain in two shards, a shard left open by its writer (``writing`` = 1), or
    shards of different networks are an :class:`ArtifactError`.

    ``names`` are the file names the virtual dataset records, one per shard (default: each shard's path
    relative to ``path``'s folder): relative names are looked up beside the joined file when it is read,
    so the folder can move as a whole, and a shard built under a temporary name can be joined under its
    final one. ``meta`` is the joined store's meta (default: the first shard's). :meth:`SampleStore.open`
    checks, on every open, that each shard is present and holds the rows it is joined for.
    """
    path = Path(path)
    shards = [Path(shard) for shard in shards]
    if not shards:
        raise ValueError("nothing to join")
    if names is None:
        names = [os.path.relpath(shard.resolve(), path.resolve().parent) for shard in shards]
    if len(names) != len(shards):
        raise ValueError(f"{len(shards)} shards but {len(names)} names")
    spec, first_meta, lengths, pieces, columns = None, None, [], [], {name: [] for name in COLUMNS}
    owner: dict[int, Path] = {}
    for index, shard in enumerate(shards):
        with SampleStore.open(shard) as store:
            if store._file.attrs.get(WRITING, 0):
                raise ArtifactError(f"{shard}: still being written, or its writer stopped before closing it")
            if spec is None:
                spec, first_meta = store.spec, store.meta
            elif store.spec != spec:
                raise ArtifactError(f"{shard}: samples are for a different network ({describe(store.spec)}; "
                                    f"{shards[0]} has {describe(spec)})")
            values = {name: store._column(name) for name in COLUMNS}
            for chain in dict.fromkeys(values["chain"].tolist()):
                if chain in owner:
                    raise ArtifactError(f"cannot join: chain {chain} is in {owner[chain]} and {shard}")
                owner[chain] = shard
                pieces.append((chain, index, np.flatnonzero(values["chain"] == chain)))
            lengths.append(len(store))
            for name in COLUMNS:
                columns[name].append(values[name])
    pieces.sort(key=lambda piece: piece[0])
    first_rows = np.cumsum([0, *lengths])
    total = int(first_rows[-1])
    layout = h5py.VirtualLayout(shape=(total, spec.numel), dtype=np.float32)
    offset = 0
    for chain, index, rows in pieces:
        sources = _progression(rows)
        if sources is None:
            raise ArtifactError(f"cannot join: chain {chain}'s rows in {shards[index]} are not evenly spaced "
                                "among the shard's other chains")
        source = h5py.VirtualSource(names[index], SAMPLES, shape=(lengths[index], spec.numel), dtype=np.float32)
        layout[offset:offset + rows.size] = source[sources]
        offset += rows.size
    order = np.concatenate([rows + first_rows[index] for _, index, rows in pieces])
    meta_json = json.dumps(first_meta if meta is None else meta, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        file = h5py.File(path, "w", libver=_JOINED_LIBVER, locking=LOCKING)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot create the joined store ({exc})") from None
    with file:
        file.attrs["format"] = FORMAT_NAME
        file.attrs["format_version"] = FORMAT_VERSION
        file.attrs["spec"] = spec.to_json()
        file.attrs["meta"] = meta_json
        file.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        file.attrs[N_COMPLETE] = np.int64(total)
        file.attrs[WRITING] = np.int8(0)
        file.create_virtual_dataset(SAMPLES, layout, fillvalue=np.nan)
        for name, dtype in COLUMNS.items():
            file.create_dataset(name, data=np.concatenate(columns[name]).astype(dtype)[order])
    return total


def _progression(rows: np.ndarray) -> slice | None:
    """``rows`` (increasing) as a slice start:stop:step, or None when they are not evenly spaced."""
    step = int(rows[1] - rows[0]) if rows.size > 1 else 1
    if step < 1 or np.any(np.diff(rows) != step):
        return None
    return slice(int(rows[0]), int(rows[-1]) + 1, step)
