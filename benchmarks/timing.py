"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` calls of ``fn`` in seconds, after one warm-up call: the one least disturbed
    by other load on a shared machine."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
