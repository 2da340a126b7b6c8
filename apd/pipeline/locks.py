"""One writer per artifact directory: an advisory ``fcntl`` lock on ``NAME/.lock``, held for a whole stage.

A stage takes the lock before it opens anything for writing; a second process asking for it while the
first holds it stops at once with an :class:`ArtifactError` naming the holder's PID (written into the
lock file). The kernel drops the lock when its holder exits, however it exits, so a killed stage never
leaves a stale lock behind. Commands that only read (``apd report``, ``apd info``) take it shared, so
they wait for no reader but never see a stage half-way through swapping its outputs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from apd.errors import ArtifactError


@contextlib.contextmanager
def artifact_lock(lock_path: Path, shared: bool = False) -> Iterator[None]:
    """Hold the lock at ``lock_path`` (exclusive, or ``shared``) for the ``with`` block; never waits."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock_path, "a+")  # noqa: SIM115 (held open for the whole block)
    except OSError as exc:
        raise ArtifactError(f"{lock_path.parent}: cannot write there ({exc.strerror})") from None
    with handle:
        try:
            fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ArtifactError(f"{lock_path.parent}: another apd process (PID {holder}) is working on these "
                                "artifacts; wait for it to finish") from None
        if not shared:
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
