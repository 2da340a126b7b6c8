r"""Rank-normalised split R-hat, bulk ESS and tail ESS of many scalar quantities at once, and their summary.

The statistics are those of Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-normalization,
folding, and localization: an improved R̂ for assessing convergence of MCMC", *Bayesian Analysis*
16(2):667–718 (arXiv 1903.08008), computed by ArviZ (``az.rhat(method="rank")``,
``az.ess(method="bulk"/"tail")``) or by a numpy transcription of its code on whole arrays. For M chains of
N draws of a scalar θ:

* **Split.** Each chain is cut into its first and last ⌊N/2⌋ draws (the middle draw of an odd N is
  dropped), giving M' = 2M chains of N' = ⌊N/2⌋ draws θ⁽ᵐ⁾ₙ.
* **Rank normalisation.** With r⁽ᵐ⁾ₙ the rank of θ⁽ᵐ⁾ₙ among all S = M'N' draws (ties averaged),
  z⁽ᵐ⁾ₙ = Φ⁻¹((r⁽ᵐ⁾ₙ − 3/8) / (S + 1/4)).
* **R̂ of z.** With chain means z̄⁽ᵐ⁾, grand mean z̄, chain variances s²ₘ (divisor N' − 1):
  B = N'/(M' − 1) Σₘ (z̄⁽ᵐ⁾ − z̄)², W = (1/M') Σₘ s²ₘ, var⁺ = (N' − 1)/N' · W + B/N',
  R̂ = √(var⁺ / W).
* **Rank-normalised split R̂** = max(R̂_bulk, R̂_folded): R̂_bulk is the above on θ, R̂_folded on the
  folded draws |θ − median(θ)| (which sees chains with equal locations but different scales).
* **ESS** of a (transformed) draw set: ρ̂ₜ = 1 − (W − (1/M') Σₘ ρ̂ₜ⁽ᵐ⁾ s²ₘ)/var⁺ from the per-chain
  autocorrelations, truncated by Geyer's initial positive sequence and made monotone; τ̂ = −1 + 2 Σₜ ρ̂ₜ
  (over the kept pairs), ESS = M'N' / τ̂. **Bulk ESS** applies it to the rank-normalised split draws z;
  **tail ESS** is the smaller ESS of the indicators I(θ ≤ q₀.₀₅) and I(θ ≤ q₀.₉₅) on the split draws.

The recommended thresholds (Vehtari et al. 2021, §4): R̂ < 1.01 and bulk/tail ESS above 100 per chain
(400 for four chains). Only numpy, scipy and ArviZ (imported on first use); nothing here knows what the
quantities are.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from torch import Tensor

RHAT_THRESHOLD = 1.01  # R̂ above this flags a quantity (Vehtari et al. 2021, §4)
RHAT_SEVERE = 1.05  # the older, looser threshold, reported beside it
MIN_DRAWS = 4  # fewest draws per chain the statistics are defined for

_AZ: Any = None


def _arviz() -> Any:
    """ArviZ, imported on first use (it pulls in xarray and pandas) without its refactoring notice."""
    global _AZ
    if _AZ is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            import arviz

        _AZ = arviz
    return _AZ


def _as_dataset(draws: np.ndarray) -> Any:
    import xarray as xr

    chains, n_draws, n_q = draws.shape
    return xr.Dataset(
        {"value": (("chain", "draw", "quantity"), draws)},
        coords={"chain": np.arange(chains), "draw": np.arange(n_draws), "quantity": np.arange(n_q)},
    )


def check_draws(draws: np.ndarray | Tensor) -> np.ndarray:
    """``draws`` as a float64 array [chains, draws, Q] ([chains, draws] is one quantity); a ``ValueError`` for
    another shape or fewer than :data:`MIN_DRAWS` draws per chain."""
    if isinstance(draws, Tensor):
        draws = draws.detach().cpu().numpy()
    draws = np.asarray(draws, dtype=np.float64)
    if draws.ndim == 2:
        draws = draws[:, :, None]
    if draws.ndim != 3:
        raise ValueError(f"draws must be [chains, draws, Q], got shape {list(draws.shape)}")
    if draws.shape[1] < MIN_DRAWS:
        raise ValueError(f"need at least {MIN_DRAWS} draws per chain, got {draws.shape[1]}")
    return draws


def rank_diagnostics(draws: np.ndarray | Tensor, engine: str = "arviz") -> dict[str, np.ndarray]:
    """Rank-normalised split R̂, bulk ESS and tail ESS of Q scalar quantities at once.

    ``draws`` is [chains, draws, Q] (or [chains, draws] for one quantity). Returns ``{"rhat", "ess_bulk",
    "ess_tail"}``, each a float64 array [Q] (equations in the module docstring; Vehtari et al. 2021).
    R̂ needs two chains or more (NaN for one; each is split in two, so two chains give four halves); a
    quantity that is constant over every draw has R̂ NaN and ESS equal to the number of draws; one with a
    non-finite draw has NaN everywhere.

    ``engine="arviz"`` calls ``az.rhat(method="rank")`` and ``az.ess(method="bulk"/"tail")`` on an xarray
    Dataset with a ``quantity`` dimension; ArviZ then evaluates the quantities one by one in Python: on one
    thread of this project's 2-core test machine, 4.4 ms per quantity at 4 chains × 500 draws (8.7 s for
    Q = 2000, 21 s at 2000 draws). ``engine="numpy"`` computes the same statistics on whole
    [chains, draws, Q] arrays, ArviZ 0.23's code (``_rhat_rank``, ``_ess_bulk``, ``_ess_tail``, ``_ess``)
    transcribed, and agrees with it to 1e-15 relative (``tests/samplers/test_diagnostics.py`` compares them on ties,
    constant, binary and short chains); ``benchmarks/bench_diagnostics.py`` measured it 5–7× faster at
    500 draws per chain and about 2× at 2000 (rank transforms and FFTs then dominate both).
    """
    draws = check_draws(draws)
    if engine == "numpy":
        return _rank_diagnostics_numpy(draws)
    if engine != "arviz":
        raise ValueError(f"engine must be 'arviz' or 'numpy', got {engine!r}")
    az = _arviz()
    dataset = _as_dataset(draws)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        if draws.shape[0] >= 2:
            rhat = az.rhat(dataset, method="rank")["value"].to_numpy()
        else:
            rhat = np.full(draws.shape[2], np.nan)
        bulk = az.ess(dataset, method="bulk")["value"].to_numpy()
        tail = az.ess(dataset, method="tail")["value"].to_numpy()
    return {"rhat": np.asarray(rhat, dtype=np.float64), "ess_bulk": np.asarray(bulk, dtype=np.float64),
            "ess_tail": np.asarray(tail, dtype=np.float64)}


# ArviZ 0.23's diagnostics (arviz/stats/diagnostics.py: _rhat_rank, _ess_bulk, _ess_tail, _ess) on arrays
# [chains, draws, Q], in blocks of quantities so the FFT buffers stay near 64 MB.

_NUMPY_BLOCK_ELEMENTS = 2**22


def _rank_diagnostics_numpy(draws: np.ndarray) -> dict[str, np.ndarray]:
    chains, n_draws, n_q = draws.shape
    out = {key: np.full(n_q, np.nan) for key in ("rhat", "ess_bulk", "ess_tail")}
    step = max(1, _NUMPY_BLOCK_ELEMENTS // (chains * n_draws * 2))
    with np.errstate(all="ignore"):
        for a in range(0, n_q, step):
            block = draws[:, :, a:a + step]
            split = _split(block)
            z = _z_scale_np(split)
            if chains >= 2:
                bulk_rhat = _rhat_np(z)
                folded = np.abs(split - np.median(split.reshape(-1, split.shape[2]), axis=0))
                folded_rhat = _rhat_np(_z_scale_np(folded))
                # Python's max(bulk, folded) as ArviZ takes it: the folded value only where it is larger
                out["rhat"][a:a + step] = np.where(folded_rhat > bulk_rhat, folded_rhat, bulk_rhat)
            out["ess_bulk"][a:a + step] = _ess_np(z)
            flat = block.reshape(-1, block.shape[2])
            tails = [_ess_np(_split((block <= np.quantile(flat, prob, axis=0)).astype(np.float64)))
                     for prob in (0.05, 0.95)]
            out["ess_tail"][a:a + step] = np.minimum(*tails)
    invalid = ~np.isfinite(draws).all(axis=(0, 1))
    for values in out.values():
        values[invalid] = np.nan
    return out


def _split(x: np.ndarray) -> np.ndarray:
    """[M, N, Q] → [2M, ⌊N/2⌋, Q]: the first and the last ⌊N/2⌋ draws of each chain."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]])


def _z_scale_np(x: np.ndarray) -> np.ndarray:
    """Φ⁻¹((r − 3/8)/(S + 1/4)) of the ranks r (ties averaged) among all S draws of each quantity."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    rows = np.ascontiguousarray(x.reshape(-1, x.shape[2]).T)  # [Q, S]: sorting along contiguous rows is faster
    return ndtri((rankdata(rows, axis=1) - 3 / 8) / (rows.shape[1] + 1 / 4)).T.reshape(x.shape)


def _rhat_np(x: np.ndarray) -> np.ndarray:
    """√((B/W + N − 1)/N) of chains [M, N, Q], i.e. √(var⁺/W)."""
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), axis=0, ddof=1)
    within = np.mean(np.var(x, axis=1, ddof=1), axis=0)
    return np.sqrt((between / within + n - 1) / n)


def _ess_np(x: np.ndarray) -> np.ndarray:
    """ESS of chains [M, N, Q]: Geyer's initial positive and monotone sequences, as ArviZ's ``_ess``."""
    from scipy.fft import next_fast_len

    chains, n, n_q = x.shape
    size = chains * n
    centred = x - x.mean(axis=1, keepdims=True)
    m = next_fast_len(2 * n)
    spectrum = np.fft.rfft(centred, n=m, axis=1)
    acov = np.fft.irfft(spectrum * np.conjugate(spectrum), n=m, axis=1)[:, :n] / n  # [M, N, Q]
    mean_var = acov[:, 0].mean(axis=0) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus = var_plus + np.var(x.mean(axis=1), axis=0, ddof=1)
    rho = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus  # [N, Q]
    rho[0] = 1.0
    # pair k = (ρ_2k, ρ_2k+1); ArviZ forms pair k ≥ 1 while 2k − 1 < N − 3 and every earlier pair is > 0
    last = max(0, (n - 3) // 2)  # the last pair that can be formed
    pairs = rho[0:2 * last + 1:2] + rho[1:2 * last + 2:2]  # [last + 1, Q]
    nonpositive = pairs <= 0
    stop = np.where(nonpositive.any(axis=0), nonpositive.argmax(axis=0), last)  # K per quantity
    running_min = np.minimum.accumulate(pairs, axis=0)
    kept = np.arange(pairs.shape[0])[:, None] < stop[None, :]
    head = np.sum(np.where(kept, running_min, 0.0), axis=0)
    cols = np.arange(n_q)
    even = rho[2 * stop, cols]
    tail_term = np.where((even > 0) | (pairs[stop, cols] >= 0), even, 0.0)
    tau = -1.0 + 2.0 * head + tail_term
    tau = np.maximum(tau, 1 / np.log10(size))
    ess = size / tau
    constant = (x.max(axis=(0, 1)) - x.min(axis=(0, 1))) < np.finfo(float).resolution
    ess[constant] = size
    ess[~np.isfinite(rho).all(axis=0) & ~constant] = np.nan
    return ess


def _stat(func: Callable[[np.ndarray], Any], values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(func(finite)) if finite.size else None


def summarise(draws: np.ndarray | Tensor, stats: dict[str, np.ndarray] | None = None,
              engine: str = "arviz") -> dict[str, Any]:
    """Summary of :func:`rank_diagnostics` over the Q quantities of ``draws`` [chains, draws, Q].

    Returns a JSON-ready dict: ``quantities`` (Q), ``chains``, ``draws`` (per chain), ``rhat_median``,
    ``rhat_max``, ``frac_rhat_above_1.01``, ``frac_rhat_above_1.05``, ``ess_bulk_median``, ``ess_bulk_min``,
    ``ess_tail_median``, ``ess_tail_min``, ``n_constant`` (quantities constant over every draw, whose R̂ is
    undefined). Medians, maxima and minima are over the quantities with a defined value (None if there are
    none); the fractions are over all Q, an undefined R̂ counting as not above. ``stats`` reuses an
    earlier :func:`rank_diagnostics` result of the same draws (else it is computed with ``engine``).
    """
    draws = check_draws(draws)
    stats = rank_diagnostics(draws, engine) if stats is None else stats
    rhat = stats["rhat"]
    n_q = draws.shape[2]
    constant = np.ptp(draws, axis=(0, 1)) == 0
    with np.errstate(invalid="ignore"):
        above = {t: float(np.sum(rhat > t)) / n_q for t in (RHAT_THRESHOLD, RHAT_SEVERE)}
    return {
        "quantities": int(n_q),
        "chains": int(draws.shape[0]),
        "draws": int(draws.shape[1]),
        "rhat_median": _stat(np.median, rhat),
        "rhat_max": _stat(np.max, rhat),
        f"frac_rhat_above_{RHAT_THRESHOLD:g}": above[RHAT_THRESHOLD],
        f"frac_rhat_above_{RHAT_SEVERE:g}": above[RHAT_SEVERE],
        "ess_bulk_median": _stat(np.median, stats["ess_bulk"]),
        "ess_bulk_min": _stat(np.min, stats["ess_bulk"]),
        "ess_tail_median": _stat(np.median, stats["ess_tail"]),
        "ess_tail_min": _stat(np.min, stats["ess_tail"]),
        "n_constant": int(constant.sum()),
    }


__all__ = ["MIN_DRAWS", "RHAT_SEVERE", "RHAT_THRESHOLD", "check_draws", "rank_diagnostics", "summarise"]
