"""HDF5 store of flat weight samples θ ∈ R^D written by the SGLD sampler and read by later stages. The file's
layout is described in :mod:`apd.samplers.store_format`; :mod:`apd.samplers.store_join` joins shards.

Crash safety. Every append writes its rows, flushes, then raises ``n_complete`` and flushes again, so
the committed count only ever covers rows whose data and chunk index already reached the file; a reader
trusts ``min(n_complete, dataset lengths)``. A writer killed at any moment (even by SIGKILL) therefore
leaves a file that opens and holds every sample whose ``append`` returned (``tests/test_store.py`` kills
a writer to check it). Such a file reads correctly, but appending to it was seen to fail (once in about
30 killed writers: HDF5 "addr overflow", its record of the file's end behind what the killed writer had
placed); so a store left with ``writing`` = 1 is rebuilt (its committed rows copied into a
fresh file that then replaces it) before it is appended to. A flush hands the bytes to the operating
system without fsync: this covers a crashed or killed process, not a power cut. Two HDF5 choices support it:

* the file format is capped at the 1.8 level (``_LIBVER``): the 1.10+ superblock records "open for
  writing" and then refuses to open a crashed writer's file (short of SWMR reading) until ``h5clear``
  is run on it;
* file locking is "best-effort": where the filesystem supports locks, a second process opening a store
  that a writer holds (or a writer opening one a reader holds) gets a clear error instead of corrupting
  or misreading it; where it does not (some network filesystems), nothing fails. HDF5 gives the
  environment variable ``HDF5_USE_FILE_LOCKING=FALSE`` precedence, to switch locking off entirely.

A full disk (:mod:`apd.samplers.store_disk`). The store never writes into the last MiB of a disk: ``create``
and ``append`` raise ``OSError(ENOSPC)`` first, and the file closes cleanly with every committed sample.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

import h5py
import numpy as np
import torch
from h5py import h5a
from torch import Tensor

from apd.errors import ArtifactError
from apd.nets import ParamSpec
from apd.samplers.store_disk import disk_error, require_space, writing_to
from apd.samplers.store_format import (
    COLUMNS,
    FORMAT_NAME,
    FORMAT_VERSION,
    LOCKING,
    N_COMPLETE,
    SAMPLES,
    WRITING,
    check_shards,
    filters,
    read_at,
    source_path,
    validate,
    write_at,
)
from apd.samplers.store_shards import ShardReader

COMPRESSIONS = ("none", "lzf", "gzip")

# Entries per chunk of a column: every flush rewrites the column's last chunk, so it stays small (2 KB).
_COLUMN_CHUNK = 256
_REBUILD_ROWS = 1000  # rows copied per append when a crashed writer's store is rebuilt
# File format bounds: 1.8-level objects and a version 0 superblock, which has no "open for write" flag.
_LIBVER = ("earliest", "v108")


def chain_partition(chains: np.ndarray) -> tuple[list[int], list[Tensor], Tensor]:
    """The chains of a store's rows (``chains``: each row's chain id): their ids in increasing order, each
    chain's row indices, and each chain's share of the rows."""
    labels = np.asarray(chains)
    ids = [int(c) for c in np.unique(labels)]
    rows = [torch.from_numpy(np.flatnonzero(labels == c)) for c in ids]
    return ids, rows, torch.tensor([len(r) / len(labels) for r in rows])


def chain_labels(chains: np.ndarray) -> Tensor:
    """Each row's chain as a label 0 … C − 1 [len(chains)] (int64), in increasing order of the chain ids, the
    order of :func:`chain_partition`."""
    labels = np.asarray(chains)
    return torch.from_numpy(np.searchsorted(np.unique(labels), labels))


class SampleStore:
    """An HDF5 file of weight samples (see the module docstring). Build with :meth:`create`/:meth:`open`."""

    def __init__(self, file: h5py.File, path: Path, spec: ParamSpec, meta: dict, n: int,
                 shards: ShardReader | None = None) -> None:
        self._file = file
        self.path = path
        self.spec = spec
        self.meta = meta
        self._n = n
        self._samples: h5py.Dataset = file[SAMPLES]
        self._columns: dict[str, h5py.Dataset] = {name: file[name] for name in COLUMNS}
        self._n_complete = h5a.open(file.id, N_COMPLETE.encode())
        self._finite = np.zeros(n, dtype=bool)  # rows read and found finite, each checked once per handle
        # a joined store's rows are read from its shards (apd.samplers.store_shards), not through HDF5's mapping
        self._shards = shards

    # ----------------------------------------------------------------------------------------- opening

    @classmethod
    def create(
        cls,
        path: str | Path,
        spec: ParamSpec,
        meta: dict,
        compression: Literal["none", "lzf", "gzip"] = "none",
        chunk_rows: int | None = None,
        overwrite: bool = False,
    ) -> SampleStore:
        """A new, empty store for vectors of ``spec.numel`` floats, opened for appending.

        ``meta`` must be JSON-serialisable; ``chunk_rows`` (default 1) rows share one HDF5 chunk.
        An existing file is an :class:`ArtifactError` unless ``overwrite`` is set.
        """
        path = Path(path)
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        if chunk_rows is not None and chunk_rows < 1:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        if path.exists() and not overwrite:
            raise ArtifactError(f"{path}: already exists (pass overwrite=True to replace it)")
        meta_json = json.dumps(meta, sort_keys=True)
        dim = spec.numel
        path.parent.mkdir(parents=True, exist_ok=True)
        require_space(path, 0)
        try:
            file = h5py.File(path, "w", libver=_LIBVER, locking=LOCKING)
        except OSError as exc:
            if "errno = 28" in str(exc):
                raise disk_error(path, exc) from None
            raise ArtifactError(f"{path}: cannot create the sample store ({exc})") from None
        with writing_to(path, file):
            file.attrs["format"] = FORMAT_NAME
            file.attrs["format_version"] = FORMAT_VERSION
            file.attrs["spec"] = spec.to_json()
            file.attrs["meta"] = meta_json
            file.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            file.attrs[N_COMPLETE] = np.int64(0)
            file.attrs[WRITING] = np.int8(1)
            file.create_dataset(
                SAMPLES, shape=(0, dim), maxshape=(None, dim), dtype=np.float32,
                chunks=(chunk_rows or 1, dim), **filters(compression),
            )
            for name, dtype in COLUMNS.items():
                file.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(_COLUMN_CHUNK,))
            file.flush()
        return cls(file, path, spec, json.loads(meta_json), 0)

    @classmethod
    def open(
        cls, path: str | Path, mode: Literal["r", "a"] = "r", expect_spec: ParamSpec | None = None
    ) -> SampleStore:
        """Open an existing store for reading (``"r"``, never modifies the file) or appending (``"a"``).

        A missing, unreadable, foreign or malformed file, or one whose spec differs from
        ``expect_spec``, is an :class:`ArtifactError` naming the path. In ``"a"`` mode, rows a crashed
        writer left past ``n_complete`` are dropped.
        """
        path = Path(path)
        if mode not in ("r", "a"):
            raise ValueError(f"mode must be 'r' or 'a', got {mode!r}")
        if not path.is_file():
            raise ArtifactError(f"{path}: sample store not found")
        try:
            file = h5py.File(path, "r" if mode == "r" else "r+", libver=_LIBVER, locking=LOCKING)
        except OSError as exc:
            if "unable to lock file" in str(exc):
                raise ArtifactError(f"{path}: in use by another process (HDF5 file lock; is a sampler still "
                                    "writing it? HDF5_USE_FILE_LOCKING=FALSE disables the check)") from None
            raise ArtifactError(f"{path}: not a readable HDF5 file ({exc})") from None
        try:
            spec, meta, n = validate(file, path, expect_spec)
            shards = None
            if file[SAMPLES].is_virtual:
                if mode == "a":
                    raise ArtifactError(f"{path}: a joined store (a virtual dataset over its shards) is read-only")
                check_shards(file[SAMPLES], path)
                shards = ShardReader.of(file[SAMPLES], path, n)
        except BaseException:
            file.close()
            raise
        if mode == "a" and file.attrs.get(WRITING, 0):
            file.close()
            _rebuild(path, spec, meta)
            return cls.open(path, mode, expect_spec)
        store = cls(file, path, spec, meta, n, shards)
        if mode == "a":
            require_space(path, 0)
            with writing_to(path, store, file):
                if any(ds.shape[0] != n for ds in store._datasets()):
                    store._resize(n)
                file.attrs[WRITING] = np.int8(1)
                file.flush()
        return store

    def close(self) -> None:
        """Mark the file as no longer being written (in ``"a"`` mode), flush and close it (idempotent)."""
        if self._shards is not None:
            self._shards.close()
        if self._file.id.valid:
            if self._file.mode != "r+":
                self._file.close()
                return
            with writing_to(self.path, self):
                try:
                    self._file.attrs[WRITING] = np.int8(0)
                finally:
                    self._file.close()

    def __enter__(self) -> SampleStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------- writing

    def append(self, vec: Tensor | np.ndarray, step: int, chain: int = 0, lr: float = float("nan"),
               log_lik: float = float("nan")) -> int:
        """Append one sample θ (a [D] tensor or array) with its scalars; returns its row index.

        The row is on disk (flushed and committed) when this returns.
        """
        rows = self._as_rows(vec, single=True)
        return self._write_rows(rows, step, chain, lr, log_lik).start

    def append_many(self, vecs: Tensor | np.ndarray, steps: np.ndarray | list[int] | int,
                    chains: np.ndarray | list[int] | int = 0,
                    lrs: np.ndarray | list[float] | float = float("nan"),
                    log_liks: np.ndarray | list[float] | float = float("nan")) -> range:
        """Append k samples ([k, D]) in one flush; scalars are length-k or broadcast. Returns their rows."""
        return self._write_rows(self._as_rows(vecs, single=False), steps, chains, lrs, log_liks)

    def truncate(self, n: int) -> None:
        """Drop every row from index ``n`` on (a resumed sampler goes back to its last checkpoint)."""
        self._require_writable()
        if not 0 <= n <= self._n:
            raise ValueError(f"cannot truncate a store of {self._n} samples to {n}")
        with writing_to(self.path, self):
            self._commit(n)
            self._resize(n)
            self._file.flush()
        self._finite[n:] = False

    # ----------------------------------------------------------------------------------------- reading

    def __len__(self) -> int:
        return self._n

    @property
    def samples(self) -> h5py.Dataset:
        """The raw ``samples`` dataset [rows, D]; only the first ``len(store)`` rows are committed."""
        return self._samples

    @property
    def shards(self) -> list[Path]:
        """The files a joined store's rows live in (:func:`~apd.samplers.store_join.join_stores`), in the order
        they were joined; empty for a store that holds its own rows."""
        if not self._samples.is_virtual:
            return []
        return list(dict.fromkeys(source_path(self.path, m.file_name) for m in self._samples.virtual_sources()))

    @property
    def file_bytes(self) -> int:
        """Bytes on disk of the store's file and of the shards a joined store reads its rows from."""
        return sum(path.stat().st_size for path in (self.path, *self.shards))

    @property
    def dim(self) -> int:
        """D, the length of one weight vector."""
        return self.spec.numel

    @property
    def steps(self) -> np.ndarray:
        """Sampler iteration of each committed sample (int64 [n])."""
        return self._column("step")

    @property
    def chains(self) -> np.ndarray:
        """Chain id of each committed sample (int32 [n])."""
        return self._column("chain")

    @property
    def lrs(self) -> np.ndarray:
        """Step size in force when each sample was taken (float64 [n])."""
        return self._column("lr")

    @property
    def log_liks(self) -> np.ndarray:
        """Log-likelihood recorded with each sample, NaN where none was given (float64 [n])."""
        return self._column("log_lik")

    def read(self, indices: Tensor | np.ndarray | list[int]) -> Tensor:
        """Rows θ_i for arbitrary indices (any order, repeats allowed) as a float32 tensor [k, D].

        Each row goes straight into its place in the result and a run of consecutive indices
        (i, i+1, …) is one read. ``benchmarks/bench_store.py`` measures this 2–20× faster than one
        fancy-indexed h5py read and 1.1–3× faster than an h5py per-row loop. Reading the distinct rows
        once and gathering the repeats afterwards measured slower: the gather copies as many bytes as
        re-reading a row from the page cache.
        """
        if isinstance(indices, Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return torch.empty((0, self.dim))
        if idx.min() < 0 or idx.max() >= self._n:
            raise IndexError(f"sample index out of range for a store of {self._n} samples")
        out = np.empty((idx.size, self.dim), dtype=np.float32)
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        for a, b in zip(np.r_[0, breaks], np.r_[breaks, idx.size], strict=True):
            self._read_rows(int(idx[a]), out[a:b])
        return torch.from_numpy(out)

    def random_batch(self, k: int, rng: torch.Generator | np.random.Generator) -> Tensor:
        """k rows drawn uniformly with replacement, i ~ U{0, …, n−1}, as a tensor [k, D]."""
        if self._n == 0:
            raise ValueError("cannot draw from an empty sample store")
        if isinstance(rng, torch.Generator):
            idx = torch.randint(self._n, (k,), generator=rng).numpy()
        else:
            idx = rng.integers(0, self._n, size=k)
        return self.read(idx)

    def read_all(self, start: int = 0, stop: int | None = None) -> Tensor:
        """The contiguous rows ``start:stop`` (default: all committed rows) as a tensor [stop−start, D].

        HDF5 reads them chunk by chunk straight into the result; for a store larger than memory,
        call this on successive ranges.
        """
        stop = self._n if stop is None else stop
        if not 0 <= start <= stop <= self._n:
            raise IndexError(f"rows {start}:{stop} out of range for a store of {self._n} samples")
        rows = np.empty((stop - start, self.dim), dtype=np.float32)
        self._read_rows(start, rows)
        return torch.from_numpy(rows)

    # ---------------------------------------------------------------------------------------- internals

    def _datasets(self) -> list[h5py.Dataset]:
        return [self._samples, *self._columns.values()]

    def _column(self, name: str) -> np.ndarray:
        return self._columns[name][: self._n]

    def _read_rows(self, start: int, out: np.ndarray) -> None:
        """Fill ``out`` [k, D] with rows start:start+k. A corrupt chunk, or a row holding NaN or infinite
        values (which no sampler stores: a store edited or damaged afterwards), is an :class:`ArtifactError`.
        Each row is checked the first time it is read, so checking costs one pass over the store at most."""
        if out.size == 0:
            return
        try:
            if self._shards is None:
                read_at(self._samples, start, out)
            else:
                self._shards.read(start, out)
        except OSError as exc:
            raise ArtifactError(f"{self.path}: cannot read rows {start}:{start + len(out)} ({exc})") from None
        stop = start + len(out)
        if len(self._finite) < stop:
            self._finite = np.concatenate([self._finite, np.zeros(stop - len(self._finite), dtype=bool)])
        for i in np.flatnonzero(~self._finite[start:stop]):
            if not np.isfinite(out[i]).all():
                raise ArtifactError(f"{self.path}: sample {start + i} holds NaN or infinite values (the store "
                                    "was damaged after it was written)")
        self._finite[start:stop] = True

    def _require_writable(self) -> None:
        if self._file.mode != "r+":
            raise ValueError(f"{self.path} is open read-only; open it with mode='a' to write")

    def _resize(self, n: int) -> None:
        for dataset in self._datasets():
            dataset.id.set_extent((n, *dataset.shape[1:]))

    def _as_rows(self, vecs: Tensor | np.ndarray, single: bool) -> np.ndarray:
        if isinstance(vecs, Tensor):
            vecs = vecs.detach().to("cpu", torch.float32).numpy()
        with np.errstate(over="ignore"):  # a value past float32's range becomes inf, refused below
            rows = np.ascontiguousarray(vecs, dtype=np.float32)
        if single and rows.shape != (self.dim,):
            raise ValueError(f"a sample must have shape [{self.dim}], got {list(rows.shape)}")
        if not single and (rows.ndim != 2 or rows.shape[1] != self.dim):
            raise ValueError(f"samples must have shape [k, {self.dim}], got {list(rows.shape)}")
        rows = rows.reshape(-1, self.dim)
        finite = np.isfinite(rows).all(1)
        if not finite.all():  # a store holds finite samples only: reading checks that, so refuse them here
            raise ValueError(f"sample {int(np.argmin(finite))} of those appended holds NaN or infinite values "
                             f"(at float32); nothing was written")
        return rows

    def _write_rows(self, rows: np.ndarray, steps: object, chains: object, lrs: object,
                    log_liks: object) -> range:
        """Write rows and their columns, flush, then commit them by raising ``n_complete`` and flushing."""
        self._require_writable()
        require_space(self.path, rows.nbytes)
        start, stop = self._n, self._n + rows.shape[0]
        columns = {name: np.ascontiguousarray(np.broadcast_to(np.asarray(values, COLUMNS[name]), len(rows)))
                   for name, values in zip(COLUMNS, (steps, chains, lrs, log_liks), strict=True)}
        with writing_to(self.path, self):
            self._resize(stop)
            for dataset, values in zip(self._datasets(), [rows, *columns.values()], strict=True):
                write_at(dataset, start, values)
            self._file.flush()
            self._commit(stop)
        return range(start, stop)

    def _commit(self, n: int) -> None:
        """Record ``n`` as the committed row count (``n_complete``) and flush it."""
        self._n_complete.write(np.array(n, dtype=np.int64))
        self._file.flush()
        self._n = n


def _rebuild(path: Path, spec: ParamSpec, meta: dict) -> None:
    """Replace the store at ``path`` by a fresh file holding its committed rows and columns, with the same
    chunking, compression and creation time; the original stays in place until the copy is complete."""
    fresh = path.with_name(path.name + ".rebuild")
    try:
        with SampleStore.open(path) as old:
            samples = old.samples
            with SampleStore.create(fresh, spec, meta, compression=samples.compression or "none",
                                    chunk_rows=samples.chunks[0], overwrite=True) as new:
                new._file.attrs["created"] = old._file.attrs["created"]
                columns = [old.steps, old.chains, old.lrs, old.log_liks]
                for start in range(0, len(old), _REBUILD_ROWS):
                    stop = min(len(old), start + _REBUILD_ROWS)
                    new.append_many(old.read_all(start, stop), *(column[start:stop] for column in columns))
        fresh.replace(path)
    finally:
        fresh.unlink(missing_ok=True)


class StoreRows:
    """Some rows of an open :class:`SampleStore` (e.g. those after a burn-in), read as a store: row i of the
    view is the store's row ``rows[i]`` for ``len``, ``read``, ``read_all`` and the columns; ``spec``,
    ``meta`` and ``file_bytes`` are the store's."""

    def __init__(self, store: SampleStore, rows: np.ndarray) -> None:
        self.store, self.rows = store, np.asarray(rows, dtype=np.int64)
        self.spec, self.meta = store.spec, store.meta

    def __len__(self) -> int:
        return self.rows.size

    @property
    def dim(self) -> int:
        return self.store.dim

    @property
    def file_bytes(self) -> int:
        return self.store.file_bytes

    @property
    def chains(self) -> np.ndarray:
        return self.store.chains[self.rows]

    @property
    def steps(self) -> np.ndarray:
        return self.store.steps[self.rows]

    @property
    def log_liks(self) -> np.ndarray:
        return self.store.log_liks[self.rows]

    def read(self, indices: Tensor | np.ndarray | list[int]) -> Tensor:
        if isinstance(indices, Tensor):
            indices = indices.cpu().numpy()
        return self.store.read(self.rows[np.asarray(indices, dtype=np.int64).reshape(-1)])

    def read_all(self, start: int = 0, stop: int | None = None) -> Tensor:
        return self.store.read(self.rows[start:stop])
