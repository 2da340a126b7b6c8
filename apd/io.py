"""Reading and writing artifact files safely: JSON and weights-only torch files, each written to a
temporary file beside its target and renamed over it, so a reader never sees a partial file.

Nothing here is ever unpickled: torch files are loaded with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from apd.errors import ArtifactError


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
