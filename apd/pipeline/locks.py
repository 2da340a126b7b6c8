"""One writer per artifact directory: an advisory ``fcntl`` lock on ``NAME/.lock``, held for a whole stage.

A stage takes the lock before it opens anything for writing; a second process asking for it while the
first holds it stops at once with an :class:`ArtifactError` naming the holder's PID (written into the
lock file). The kernel drops the lock when its holder exits, however it exits, so a killed stage never
leaves a stale lock behind. A command that only reads (``apd info``) takes it shared: readers do not
exclude each other, but a reader never sees a stage half-way through swapping its outputs, and a stage
never starts while one reads. On a read-only file system, where no writer can be, a reader goes on
without the lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from apd.errors import ArtifactError


@contextlib.contextmanager
def artifact_lock(lock_path: Path, shared: bool = False) -> Iterator[None]:
    """Hold the lock at ``lock_path`` (exclusive, or ``shared``) for the ``with`` block; never waits. The
    folders it creates for the lock are removed again when the block leaves nothing else in them (a command
    that failed, or only read), so that a command leaves no folder it did not need."""
    created = [folder for folder in (lock_path.parent, *lock_path.parent.parents) if not folder.exists()]
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if shared and exc.errno == errno.EROFS:
            yield
            return
        if exc.errno == errno.EISDIR:
            raise ArtifactError(f"{lock_path}: a directory where apd keeps its lock file; move it away") from None
        raise ArtifactError(f"{lock_path.parent}: cannot write there ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise ArtifactError(f"{lock_path.parent}: another apd process (PID {holder}) is working on these "
                                "artifacts; wait for it to finish") from None
        if not shared:
            with contextlib.suppress(OSError):  # the PID is a note for others (a full disk may refuse it)
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            if created and os.listdir(lock_path.parent) == [lock_path.name]:
                lock_path.unlink()
                for folder in created:  # the deepest first; one another process has filled stays
                    folder.rmdir()
        os.close(fd)  # closing the descriptor releases the lock


def _holder(fd: int, tries: int = 50) -> str:
    """The PID written into the lock file, read again for a moment while it names no live process (the
    holder writes it just after taking the lock, over the PID of an earlier holder)."""
    text = ""
    for _ in range(tries):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            try:
                os.kill(int(text), 0)
                return text
            except ProcessLookupError:
                pass
            except PermissionError:  # alive, another user's
                return text
        time.sleep(0.01)
    return text or "unknown"
