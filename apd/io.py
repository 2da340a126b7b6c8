"""Reading and writing artifact files safely: JSON, text and weights-only torch files, each written to a
temporary file beside its target and renamed over it, so a reader never sees a partial file; several
files replaced together once all are written; whole directories swapped in one step.

Nothing here is ever unpickled: torch files are loaded with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from apd.errors import ArtifactError
from apd.interrupts import raise_if_interrupted


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON (keys sorted, indented) to a temporary file beside ``path`` and rename it over
    ``path`` (:func:`write_bytes_atomic`); data that JSON cannot hold raises before any file is touched."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def hdf5_atomic(path: Path) -> Iterator[Any]:
    """An HDF5 file (``h5py.File``) built in memory and written to ``path`` (:func:`write_bytes_atomic`)
    when the block ends without an error. HDF5 itself never writes to the disk, so a full disk is a plain
    ``OSError`` (ENOSPC): HDF5 writing into a full disk breaks its file handles and can crash the process."""
    import h5py

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as fh:
        yield fh
    write_bytes_atomic(path, buffer.getvalue())


@contextlib.contextmanager
def written_together(finals: list[Path]) -> Iterator[dict[Path, Path]]:
    """``with written_together([a, b]) as built:`` the block writes each final file's content to
    ``built[final]``, a temporary name beside it; when the block ends without an error (and without a
    Ctrl-C, :func:`apd.interrupts.raise_if_interrupted`) every one is renamed over its final name, else every
    temporary is removed and no final file is touched. A failure while writing (a full disk, a rendering
    error) so replaces none of them; the renames that follow need no space."""
    built = {final: final.with_name(f".{final.name}.together.tmp") for final in finals}
    try:
        yield built
        raise_if_interrupted()
        for final, tmp in built.items():
            os.replace(tmp, final)
    finally:
        for tmp in built.values():
            tmp.unlink(missing_ok=True)


def replace_directory(built: Path, final: Path) -> None:
    """Put the directory ``built`` in the place of ``final``. Where the system can (Linux's ``renameat2``),
    the two are exchanged in one atomic step, so ``final`` always names one complete directory or the
    other; elsewhere the old one is first moved aside to ``final.old``, which :func:`restore_directory`
    puts back if the process dies before the new one is in place. Nothing is replaced after a Ctrl-C
    (:func:`apd.interrupts.raise_if_interrupted`)."""
    raise_if_interrupted()
    if final.is_dir() and _exchange(built, final):
        remove_tree(built)  # it now holds the old contents
        return
    old = final.with_name(final.name + ".old")
    remove_tree(old)
    if final.exists() or final.is_symlink():
        final.rename(old)
    built.rename(final)
    remove_tree(old)


def remove_tree(path: Path) -> None:
    """Remove ``path``: a folder with what it holds, or a file or symbolic link in its place (never what a
    link points to); nothing when there is none."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def restore_directory(final: Path) -> None:
    """Undo a :func:`replace_directory` cut short between its two renames."""
    old = final.with_name(final.name + ".old")
    if old.is_dir() and not final.exists():
        old.rename(final)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_FULL_DISK = 2**20  # free bytes below which a failed write is put down to a full disk


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
        try:
            torch.save(obj, tmp)
        except RuntimeError as exc:  # torch reports a failed write (a full disk above all) as a RuntimeError
            full = shutil.disk_usage(path.parent).free < _FULL_DISK
            raise OSError(errno.ENOSPC if full else errno.EIO, "No space left on device" if full else
                          f"cannot write ({str(exc).splitlines()[0]})", str(path)) from None
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_torch(path: Path) -> Any:
    """Load a state dict or checkpoint with ``weights_only=True`` (never unpickles arbitrary objects). A
    file that does not load, or holds a NaN or infinite value in a floating-point tensor (nothing here
    saves one), is an :class:`ArtifactError`."""
    import torch

    if not path.is_file():
        raise ArtifactError(f"{path}: not found")
    try:
        with warnings.catch_warnings():  # torch warns about foreign files before it refuses them
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for corrupt or foreign files
        kind = type(exc).__name__
        raise ArtifactError(f"{path}: not a readable weights-only torch file ({kind})") from None
    bad = nonfinite_tensor(obj)
    if bad is not None:
        raise ArtifactError(f"{path}: {bad} holds NaN or infinite values")
    return obj


def nonfinite_tensor(obj: Any, where: str = "") -> str | None:
    """The key path of the first floating-point tensor in ``obj`` (nested dicts, lists, tuples) holding a
    NaN or an infinity, or None when every one is finite: what a checkpoint must never be written with."""
    import torch

    if isinstance(obj, torch.Tensor):
        return (where or "tensor") if obj.is_floating_point() and not torch.isfinite(obj).all() else None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list | tuple) else ()
    for key, value in items:
        found = nonfinite_tensor(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None
