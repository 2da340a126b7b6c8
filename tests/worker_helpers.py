"""Helpers of the tests that start worker processes: tasks for ``python -m apd.pipeline.spawned`` workers
(module-level functions, so that a fresh interpreter with the checkout on its path unpickles them by name),
and a free port for ``torchrun`` launches."""

from __future__ import annotations

import socket
import time
from pathlib import Path


def signal_then_wait(rank: int, size: int, init_method: str, started: str, release: str) -> None:
    """Touch ``started``, then wait (two minutes at most) until ``release`` exists."""
    Path(started).touch()
    deadline = time.monotonic() + 120
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def free_port() -> int:
    """A TCP port free on the loopback address now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
