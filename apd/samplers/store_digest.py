"""The digest of what a sample store holds, as opposed to the digest of its file.

A store's file records its creation time, and its bytes depend on chunking, compression and whether its rows
live in shards; two runs that sample the same weights therefore leave files with different SHA-256 digests.
:func:`content_digest` hashes the committed rows and per-sample columns only, so that "the same samples" is
a checkable statement across machines, reruns and storage options.
"""

from __future__ import annotations

import hashlib

import numpy as np

from apd.samplers.store import SampleStore

# Rows hashed per read: about 64 MiB of float32 for fcNN1's 79,510 weights.
_BLOCK_BYTES = 64 * 2**20


def content_digest(store: SampleStore) -> str:
    """SHA-256 (first 16 hex digits) of the store's content: D, the row count n, the rows θ_0 … θ_{n−1} as
    little-endian float32 in store order, then the per-sample columns over the n committed rows (step as
    int64, chain as int32, lr and log_lik as float64), little-endian, in that order.

    Equal for stores holding the same samples in the same order whatever their file (attributes,
    chunking, compression, shards); a single changed bit of a row or a column changes it."""
    digest = hashlib.sha256(f"apd-samples dim={store.dim} n={len(store)}".encode())
    block = max(1, _BLOCK_BYTES // (4 * max(store.dim, 1)))
    for start in range(0, len(store), block):
        rows = store.read_all(start, min(start + block, len(store))).numpy()
        digest.update(np.ascontiguousarray(rows, dtype="<f4"))  # hashed in place, not copied
    for column, dtype in ((store.steps, "<i8"), (store.chains, "<i4"), (store.lrs, "<f8"), (store.log_liks, "<f8")):
        digest.update(np.ascontiguousarray(column, dtype=dtype))
    return digest.hexdigest()[:16]
