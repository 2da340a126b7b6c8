"""Timing helper shared by the benchmark scripts."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.nn.utils import vector_to_parameters


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


def best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """:func:`best_time` of each of ``fns``, their calls interleaved (one call of each per round, after one
    warm-up round), so that a busy spell of a shared machine slows all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def loop_predict(net: torch.nn.Module, weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The obvious per-network loop the batched prediction is timed against: each row of ``weights`` copied
    into ``net`` (``vector_to_parameters``) and run on ``x``; class probabilities [K, N, C]."""
    with torch.no_grad():
        out = []
        for w in weights:
            vector_to_parameters(w, net.parameters())
            out.append(torch.softmax(net(x), dim=-1))
    return torch.stack(out)
