"""The samples' alignment as an artifact: computed once per pipeline, read by every process that needs it.

Every process of ``apd distill`` (one per group of generator seeds) and ``apd evaluate`` (the MoG and the mode
mixture are fit to the samples aligned as APD's generator learns them) needs the same permutations of every
stored sample's hidden units (:func:`apd.pipeline.recipes.store_alignment`); on fcNN1's 9,972 samples they take
about 45 s of one core to compute. The first process to need them writes ``alignment.h5`` (the permutations
[len(store), H], int16 or int32) and its manifest ``alignment.json`` (the alignment's record, the samples it was
made from, and a key of the settings it depends on: ``[distill] align`` and ``fit_samples``, the root seed, and
:data:`FORMAT`); the others read them. The file is reused while its manifest matches the samples there now, the
key and the file's digest, ``--force`` or not (it is a function of those alone, as the samples are an input the
stage does not redo); deleting it makes it again. It holds the pipeline's own settings only: a study that aligns
otherwise computes its alignment in memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from apd.config import DistillConfig
from apd.errors import ArtifactError
from apd.io import read_json
from apd.pipeline.layout import manifest_of, partial_of
from apd.pipeline.manifests import is_complete, manifest_digest, manifest_record
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import publish

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the alignment's algorithm changes what it computes: files of another are made again
DATASET = "permutations"


def is_pipeline_alignment(ctx: RunContext, store_path: Path, d: DistillConfig) -> bool:
    """Whether aligning the store at ``store_path`` as ``d`` says is the pipeline's own alignment (its complete
    store, its ``[distill] align`` and ``fit_samples``): the one kept as an artifact."""
    own = ctx.cfg.distill
    return (Path(store_path) == ctx.layout.samples and manifest_of(ctx.layout.samples).is_file()
            and d.align != "none" and (d.align, d.fit_samples) == (own.align, own.fit_samples))


def alignment_key(ctx: RunContext) -> str:
    """SHA-256 (first 16 hex digits) of the settings the pipeline's alignment depends on besides its samples."""
    d = ctx.cfg.distill
    text = json.dumps({"align": d.align, "fit_samples": d.fit_samples, "seed": ctx.cfg.seed, "format": FORMAT},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _inputs(ctx: RunContext) -> dict[str, str]:
    return {"samples": manifest_digest(manifest_of(ctx.layout.samples))}


def load_alignment(ctx: RunContext, rows: int, width: int) -> tuple[Tensor, dict] | None:
    """The stored permutations [rows, width] (int64) and the alignment's record, or None where there is no
    complete file for the samples there now and the pipeline's settings, or one of another shape."""
    path = ctx.layout.alignment
    if not is_complete(manifest_of(path), alignment_key(ctx), _inputs(ctx)):
        return None
    try:
        with h5py.File(path, "r") as fh:
            perms = np.asarray(fh[DATASET])
        record = read_json(manifest_of(path))["alignment"]
    except (OSError, KeyError, ArtifactError) as exc:
        log.warning("%s: unreadable (%s); aligning again", path, exc)
        return None
    if perms.shape != (rows, width):
        log.warning("%s: permutations of shape %s for %d samples of %d hidden units; aligning again",
                    path, list(perms.shape), rows, width)
        return None
    log.info("hidden units aligned as %s says", path.name)
    return torch.from_numpy(perms.astype(np.int64)), record


def save_alignment(ctx: RunContext, perms: Tensor, record: dict) -> None:
    """Write ``perms`` [len(store), H] and the alignment's ``record`` as the pipeline's alignment (built under a
    partial name, swapped in with its manifest last)."""
    path = ctx.layout.alignment
    partial = partial_of(path)
    dtype = np.int16 if perms.numel() == 0 or int(perms.max()) <= np.iinfo(np.int16).max else np.int32
    try:
        with h5py.File(partial, "w") as fh:
            fh.create_dataset(DATASET, data=perms.numpy().astype(dtype))
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ArtifactError(f"{partial}: cannot write the samples' alignment ({exc})") from None
    publish({partial: path}, manifest_of(path),
            manifest_record("distill", alignment_key(ctx), _inputs(ctx), alignment=record))
