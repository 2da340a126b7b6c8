"""Burn-in read from the trace: how many of each chain's first stored samples to drop, chosen per store.

A fixed ``[sgld] burn_in`` is the same number of iterations for every run, and some chains are still far
from stationary there. :func:`trace_burn_in` instead looks at the log-likelihood recorded with every stored
sample (``store.log_liks``: the minibatch's mean log-likelihood at that step) and picks the smallest prefix
b, on the grid b = ⌊f·m⌋ for f = 0, 5 %, …, 50 % of the m samples every chain holds, after which the
rank-normalised split R̂ of that trace across chains is at most 1.05 (:data:`BURN_IN_RHAT`).

Why this statistic: split R̂ (Vehtari et al. 2021; :mod:`apd.samplers.rank_stats`) compares the two halves
of every chain as well as the chains with each other, so a prefix that drifts (a chain still climbing from
its start) makes the first half's location differ from the second's and raises R̂ even when every chain
drifts alike, which a between-chain comparison alone would miss; rank normalisation and folding make it
insensitive to the trace's scale and heavy tails (the minibatch log-likelihood is noisy). The threshold is
the older 1.05 (Gelman et al.; :data:`~apd.samplers.rank_stats.RHAT_SEVERE`), not the 1.01 the function-space
diagnostics use: it decides what to drop from one scalar per sample, where 1.01 would mostly chase the
sampling error of R̂ itself. The grid stops at half the chain, the classic "discard the first half": where
no prefix on it reaches 1.05 the half is dropped (or, for chains too short for the whole grid, the longest
prefix that leaves split R̂ defined) and ``reached`` is False. One chain is cut into its two
halves, as two chains (split R̂ then cuts each again).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from apd.samplers.rank_stats import MIN_DRAWS, RHAT_SEVERE, rank_diagnostics
from apd.samplers.store import chain_partition

BURN_IN_GRID = tuple(i / 20 for i in range(11))  # fractions of each chain's stored samples: 0, 5 %, …, 50 %
BURN_IN_RHAT = RHAT_SEVERE  # split R̂ of the log-likelihood trace at most this after the burn-in


def trace_burn_in(log_liks: np.ndarray, chains: np.ndarray, grid: tuple[float, ...] = BURN_IN_GRID,
                  threshold: float = BURN_IN_RHAT) -> dict:
    """The burn-in of the module docstring for samples with ``log_liks`` and chain ids ``chains`` (a
    store's columns): ``burn_in`` (each chain's first samples to drop), its ``fraction`` of the m samples
    per chain, ``rhat`` after it, ``reached`` (R̂ ≤ ``threshold`` somewhere on the grid), and ``grid``
    (fraction, samples dropped, R̂) up to the one chosen. Chains longer than the shortest are read to its
    length m. A ``ValueError`` where a log-likelihood is missing or chains are too short."""
    log_liks = np.asarray(log_liks, dtype=np.float64)
    if not np.isfinite(log_liks).all():
        raise ValueError("the store records no (or a non-finite) log-likelihood for some samples")
    _, rows, _ = chain_partition(chains)
    length = min(len(r) for r in rows)
    traces = np.stack([log_liks[r.numpy()[:length]] for r in rows])
    tried = []
    for fraction in grid:
        drop = int(Fraction(fraction).limit_denominator(1000) * length)  # ⌊f·m⌋ exactly, f = 7/20 not 0.35 − δ
        kept = traces[:, drop:]
        if len(rows) == 1:  # one chain: its two halves as two chains
            half = kept.shape[1] // 2
            kept = np.stack([kept[0, :half], kept[0, half:2 * half]])
        if kept.shape[1] < 2 * MIN_DRAWS:  # split R̂ needs MIN_DRAWS per half-chain: the grid ends here
            break
        rhat = float(rank_diagnostics(kept[:, :, None], engine="numpy")["rhat"][0])
        tried.append([fraction, drop, rhat])
        if rhat <= threshold:
            break
    if not tried:
        raise ValueError(f"chains of {length} samples are too short to read a burn-in from")
    fraction, drop, rhat = tried[-1]
    return {"burn_in": drop, "fraction": fraction, "rhat": rhat, "reached": rhat <= threshold,
            "threshold": threshold, "samples_per_chain": length, "chains": len(rows), "grid": tried,
            "trace": "the log-likelihood recorded with each stored sample"}


def retained_rows(chains: np.ndarray, burn_in: int) -> np.ndarray:
    """The rows (sorted) of samples at position ``burn_in`` or later within their own chain."""
    _, rows, _ = chain_partition(chains)
    return np.sort(np.concatenate([r.numpy()[burn_in:] for r in rows]))
