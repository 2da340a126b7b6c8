"""Tasks that tests hand to ``python -m apd.pipeline.spawned`` workers: module-level functions, so that a
fresh interpreter with the checkout on its path unpickles them by name."""

from __future__ import annotations

import time
from pathlib import Path


def signal_then_wait(rank: int, size: int, init_method: str, started: str, release: str) -> None:
    """Touch ``started``, then wait (two minutes at most) until ``release`` exists."""
    Path(started).touch()
    deadline = time.monotonic() + 120
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
