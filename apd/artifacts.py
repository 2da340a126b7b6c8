"""Artifact layout and stage manifests.

Each stage writes its outputs under ``ROOT/NAME/`` and then a JSON manifest, written last by atomic
rename, so an existing manifest means the stage completed. A manifest records the stage's config hash
and the hashes of the manifests of its inputs; a stage whose manifest still matches is reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apd import __version__
from apd.errors import ArtifactError

log = logging.getLogger(__name__)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary file beside ``path`` and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON artifact; a missing or corrupt one is an :class:`ArtifactError`."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not found") from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data


def manifest_path(artifact: Path) -> Path:
    """The manifest that marks ``artifact`` complete: ``samples.h5`` → ``samples.json``."""
    return artifact.with_suffix(".json")


def manifest_digest(path: Path) -> str:
    """Hash of a manifest's bytes: what a downstream stage records as its input's identity."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not found") from None


def write_manifest(path: Path, stage: str, config_hash: str, inputs: dict[str, str],
                   **details: Any) -> None:
    """Mark a stage complete: its config hash, its inputs' manifest digests, version, time, details."""
    write_json_atomic(path, {
        "stage": stage,
        "config_hash": config_hash,
        "inputs": inputs,
        "version": __version__,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **details,
    })


def is_complete(path: Path, config_hash: str, inputs: dict[str, str]) -> bool:
    """True when ``path`` is a manifest for this config hash and these inputs."""
    return _load_matching(path, read_json, "manifest", config_hash=config_hash, inputs=inputs) is not None


def save_torch_atomic(path: Path, obj: Any) -> None:
    """``torch.save`` tensors and plain containers to a temporary file, then rename it over ``path``."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_torch(path: Path) -> Any:
    """Load a state dict or checkpoint with ``weights_only=True`` (never unpickles arbitrary objects)."""
    import torch

    if not path.is_file():
        raise ArtifactError(f"{path}: not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt or foreign files
        kind = type(exc).__name__
        raise ArtifactError(f"{path}: not a readable weights-only torch file ({kind})") from None


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
    if any(record.get(key) != value for key, value in expected.items()):
        log.info("%s %s is from another configuration; not reusing it", what, path)
        return None
    return record
