"""Deterministic sample rows and stores, shared by the sample-store tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from apd.nets import ParamSpec, mlp
from apd.samplers.store import SampleStore

SPEC = ParamSpec.from_module(mlp([6, 5, 3]))  # D = 6·5 + 5 + 5·3 + 3 = 53
META = {"config": {"lr": 0.05, "hidden": [5]}, "version": "0.1.0", "dataset": "digits", "fingerprint": "ab12"}


def row(i: int, dim: int = SPEC.numel) -> np.ndarray:
    """The deterministic sample written at row i: θ_i[j] = i + j / 1000."""
    return (i + np.arange(dim) / 1000).astype(np.float32)


def rows(n: int, start: int = 0) -> np.ndarray:
    return np.stack([row(i) for i in range(start, start + n)])


def write_shard(path: Path, chains: list[int], per_chain: int, **kwargs) -> None:
    """A shard holding ``chains`` stepped together, as a sampler writes them: at step 10·k, one row per chain;
    chain c's k-th sample is row(100·c + k)."""
    with SampleStore.create(path, SPEC, {**META, "chains": chains}, **kwargs) as store:
        for k in range(per_chain):
            store.append_many(np.stack([row(100 * chain + k) for chain in chains]), steps=10 * k, chains=chains,
                              lrs=[0.1 * chain for chain in chains], log_liks=[-k - chain for chain in chains])
