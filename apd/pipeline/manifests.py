"""Stage manifests: the JSON file that marks an artifact complete.

A manifest records the stage, its config hash (of the sections the stage depends on), the digests of
its inputs' manifests, the SHA-256 of the artifact's own file, the package version, and details
(timings, diagnostics). It is written last, by atomic rename, so an existing manifest whose digest
matches its file means "complete".
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apd._version import __version__
from apd.errors import ArtifactError
from apd.io import load_torch, read_json, write_json_atomic

log = logging.getLogger(__name__)

_READ_BLOCK = 8 * 2**20


def manifest_digest(path: Path) -> str:
    """Hash of a manifest's bytes: what a downstream stage records as its input's identity."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not found") from None


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (first 16 hex digits), read in blocks."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while block := fh.read(_READ_BLOCK):
                digest.update(block)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not found") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read ({exc.strerror})") from None
    return digest.hexdigest()[:16]


def manifest_record(stage: str, config_hash: str, inputs: dict[str, str], **details: Any) -> dict[str, Any]:
    """What a manifest holds besides its files' digests: stage, config hash, inputs' manifest digests,
    version, time and ``details``."""
    return {"stage": stage, "config_hash": config_hash, "inputs": inputs, "version": __version__,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **details}


def write_manifest(path: Path, record: dict[str, Any]) -> None:
    write_json_atomic(path, record)


def is_complete(manifest: Path, config_hash: str, inputs: dict[str, str], check_files: bool = True) -> bool:
    """True when ``manifest`` is for this config hash and these inputs and every file it names still has
    the digest it recorded (files beside the manifest)."""
    record = _load_matching(manifest, read_json, "manifest", config_hash=config_hash, inputs=inputs)
    if record is None:
        return False
    if check_files:
        try:
            files = recorded_files(record, manifest)
        except ArtifactError as exc:
            log.warning("not reusing it: %s", exc)
            return False
        for name, digest in files.items():
            path = manifest.parent / name
            if not path.is_file() or file_digest(path) != digest:
                log.warning("%s: changed since %s was written; not reusing it", path, manifest.name)
                return False
    return True


def recorded_files(record: dict, manifest: Path, key: str = "files") -> dict[str, str]:
    """A manifest's ``files`` (or ``inputs``) entry: names and digests, checked to be strings."""
    entry = record.get(key, {})
    if not isinstance(entry, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entry.items()):
        raise ArtifactError(f"{manifest}: malformed manifest ({key!r} is not a table of digests)")
    return entry


def load_checkpoint(path: Path, **expected: Any) -> dict | None:
    """A stage's checkpoint whose entries equal ``expected`` (e.g. its config hash), or None when it is
    absent, unreadable or from another configuration: the stage then starts afresh."""
    return _load_matching(path, load_torch, "checkpoint", **expected)


def _load_matching(path: Path, reader: Callable[[Path], Any], what: str, **expected: Any) -> dict | None:
    """``reader(path)`` if the file exists, reads and has every ``expected`` entry; else None (with a
    warning for an unreadable file, a note for one from another configuration)."""
    if not path.is_file():
        return None
    try:
        record = reader(path)
    except ArtifactError as exc:
        log.warning("ignoring %s: %s", what, exc)
        return None
    if not isinstance(record, dict) or any(record.get(key) != value for key, value in expected.items()):
        log.info("%s %s is from another configuration; not reusing it", what, path)
        return None
    return record
