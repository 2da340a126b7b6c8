"""The processes a run has started, read from Linux's /proc: what the nothing-lost scenarios and tests use to
check that no sampling worker outlives the ``apd`` that started it."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> set[int]:
    """The processes ``pid``'s main thread has started and not yet reaped (Linux /proc)."""
    try:
        return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
