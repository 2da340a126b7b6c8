"""A full disk and HDF5's write failures, for the sample store. HDF5 fails on a full disk in ways that break
its file handles (a failed write, then a crash when the process exits), so the store never writes into the
last MiB of a disk (:func:`require_space` raises ``OSError(ENOSPC)`` first) and turns every failure while
writing into one ``OSError``, keeping the broken handles alive and noting the failure
(:func:`hdf5_write_failed`) so that the process can leave without freeing them.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

FREE_MARGIN = 2**20  # bytes an append leaves free on the disk, or it does not write (``require_space``)

_write_failed = False  # set once HDF5 failed to write a store (see hdf5_write_failed)
_broken: list[object] = []  # stores and files whose HDF5 handles broke, never freed


def hdf5_write_failed() -> bool:
    """Whether HDF5 failed to write a store in this process (a full disk that filled under it, say). Its
    handles are then broken and freeing them when the interpreter exits can crash it: a process that
    saw this should leave with ``os._exit`` once it has reported the error."""
    return _write_failed


@contextlib.contextmanager
def writing_to(path: Path, *holders: object) -> Iterator[None]:
    """Turn HDF5's failures while writing ``path`` into one ``OSError`` (``ENOSPC`` when the disk is full),
    noting that its handles are broken (:func:`hdf5_write_failed`) and keeping ``holders`` (what holds
    them) alive, since freeing a broken handle can crash the process."""
    global _write_failed
    try:
        yield
    except (OSError, RuntimeError) as exc:
        _write_failed = True
        _broken.extend(holders)
        raise disk_error(path, exc) from None


def disk_error(path: Path, exc: BaseException) -> OSError:
    text = " ".join(str(exc).split())
    full = "errno = 28" in text or shutil.disk_usage(path.parent).free < FREE_MARGIN
    return OSError(errno.ENOSPC if full else errno.EIO, "No space left on device" if full else
                   f"cannot write the sample store ({text[:200]})", str(path))


def require_space(path: Path, nbytes: int) -> None:
    """Stop with ``ENOSPC`` before a write of ``nbytes`` to ``path`` that could fill the disk: HDF5 fails on
    a full disk in ways that leave its file handles broken (a write error, then a crash at exit), so the
    store never lets it get there; :data:`FREE_MARGIN` stays free for what is written when the file closes."""
    free = shutil.disk_usage(path.parent).free
    if free < nbytes + FREE_MARGIN:
        raise OSError(errno.ENOSPC, f"No space left on device (the sample store stops with {free / 2**20:.1f} MiB "
                      "free)", str(path))
