"""The on-disk format of a sample store, and the low-level reads and writes of its rows.

Layout of one file:

* ``samples``: float32 [n, D], chunked one row per chunk by default, resizable along rows, optionally
  lzf- or gzip-compressed after a byte shuffle. One row per chunk makes appending a row one fresh chunk
  write and reading a random row one chunk read; several rows per chunk measured slower for both, and
  far slower with compression, since every flush recompresses the partly filled chunk
  (``benchmarks/bench_store.py`` times appends and reads).
* ``step`` (int64), ``chain`` (int32), ``lr`` (float64), ``log_lik`` (float64, NaN when not given):
  one entry per sample, resizable.
* root attributes: ``format`` = ``"apd-samples"``, ``format_version``, ``spec`` (:meth:`ParamSpec.to_json`),
  ``meta`` (a JSON string chosen by the caller), ``created`` (ISO time), ``n_complete`` and
  ``writing`` (1 while a writer holds the file, 0 once it closed it).

This module holds those names, the check that an open file is such a store (:func:`validate`), the
hyperslab reads and writes of rows, the compression filters, and where a joined store
(:mod:`apd.samplers.store_join`) finds its shards and the check that they still hold its rows. Only h5py
and numpy; :class:`~apd.samplers.store.SampleStore` builds on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
from h5py import h5s

from apd.errors import ArtifactError
from apd.nets import ParamSpec

FORMAT_NAME = "apd-samples"
FORMAT_VERSION = 1

SAMPLES = "samples"
N_COMPLETE = "n_complete"
WRITING = "writing"
# Per-sample columns and their dtypes; ``steps``/``chains``/``lrs``/``log_liks`` read them back.
COLUMNS: dict[str, np.dtype] = {
    "step": np.dtype(np.int64),
    "chain": np.dtype(np.int32),
    "lr": np.dtype(np.float64),
    "log_lik": np.dtype(np.float64),
}
LOCKING = "best-effort"


def filters(compression: str) -> dict:
    """h5py filter arguments: with compression, the byte-shuffle filter goes first (it groups the
    exponent bytes of the float32 weights, which compress far better than the mantissa bytes)."""
    if compression == "none":
        return {}
    return {"compression": compression, "shuffle": True}


# Reads and writes use h5py's low-level DatasetID.read/write with a hyperslab selection: per call that
# costs a fraction of ``dataset[i] = …`` or ``read_direct``, which matters when every append touches
# five datasets and a random batch reads each of its rows separately.


def _rows_selection(dataset: h5py.Dataset, start: int, shape: tuple[int, ...]) -> h5s.SpaceID:
    space = dataset.id.get_space()
    space.select_hyperslab((start, *([0] * (len(shape) - 1))), shape)
    return space


def write_at(dataset: h5py.Dataset, start: int, values: np.ndarray) -> None:
    """Write the C-contiguous ``values`` [k, …] to rows start:start+k of ``dataset``."""
    dataset.id.write(h5s.create_simple(values.shape), _rows_selection(dataset, start, values.shape), values)


def read_at(dataset: h5py.Dataset, start: int, out: np.ndarray) -> None:
    """Fill the C-contiguous ``out`` [k, …] with rows start:start+k of ``dataset``."""
    dataset.id.read(h5s.create_simple(out.shape), _rows_selection(dataset, start, out.shape), out)

def source_path(path: Path, name: str) -> Path:
    """Where a joined store at ``path`` finds the shard it records as ``name``."""
    return Path(name) if os.path.isabs(name) else path.parent / name


def check_shards(samples: h5py.Dataset, path: Path) -> None:
    """Every shard of a joined store is present and holds every row the store maps onto it (HDF5 itself
    would read the fill value, NaN, for a missing shard's rows)."""
    needed: dict[str, int] = {}
    for mapping in samples.virtual_sources():
        (_, _), (last, _) = mapping.src_space.get_select_bounds()
        needed[mapping.file_name] = max(needed.get(mapping.file_name, 0), int(last) + 1)
    for name, rows in needed.items():
        shard = source_path(path, name)
        if not shard.is_file():
            raise ArtifactError(f"{path}: its shard {shard} is missing")
        try:
            with h5py.File(shard, "r", locking=LOCKING) as file:
                committed = min(int(file.attrs[N_COMPLETE]), file[SAMPLES].shape[0])
        except (OSError, KeyError) as exc:
            raise ArtifactError(f"{path}: its shard {shard} is not a readable sample store ({exc})") from None
        if committed < rows:
            raise ArtifactError(f"{path}: its shard {shard} holds {committed} samples, the joined store reads "
                                f"{rows} from it (truncated)")


def validate(file: h5py.File, path: Path, expect_spec: ParamSpec | None) -> tuple[ParamSpec, dict, int]:
    """Check the format marker, spec, meta and datasets of an open file; return (spec, meta, n)."""
    attrs = file.attrs
    if attrs.get("format") != FORMAT_NAME:
        raise ArtifactError(f"{path}: not an apd sample store (no format={FORMAT_NAME!r} attribute)")
    version = attrs.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: sample store format version {version}, this apd reads "
                            f"version {FORMAT_VERSION}")
    try:
        spec = ParamSpec.from_json(str(attrs["spec"]))
        meta = json.loads(str(attrs["meta"]))
        n = int(attrs[N_COMPLETE])
        samples = file[SAMPLES]
        lengths = [file[name].shape[0] for name in COLUMNS]
    except (KeyError, ValueError, TypeError, OSError, ArtifactError) as exc:
        raise ArtifactError(f"{path}: malformed sample store ({exc})") from None
    if n < 0:
        raise ArtifactError(f"{path}: malformed sample store ({N_COMPLETE} is {n})")
    if samples.dtype != np.float32 or samples.ndim != 2 or samples.shape[1] != spec.numel:
        raise ArtifactError(f"{path}: malformed sample store (samples {samples.dtype} {samples.shape}, "
                            f"spec needs [n, {spec.numel}] float32)")
    if expect_spec is not None and spec != expect_spec:
        raise ArtifactError(f"{path}: samples are for a different network ({describe(spec)}; "
                            f"expected {describe(expect_spec)})")
    return spec, meta, min(n, samples.shape[0], *lengths)


def describe(spec: ParamSpec) -> str:
    shapes = ", ".join(f"{name} {list(shape)}" for name, shape in zip(spec.names, spec.shapes, strict=True))
    return f"{spec.numel} parameters: {shapes}"
