r"""Convergence diagnostics of SGLD chains: rank-normalised split R-hat, bulk ESS and tail ESS.

The statistics are those of Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021), "Rank-normalization,
folding, and localization: an improved R̂ for assessing convergence of MCMC", *Bayesian Analysis*
16(2):667–718 (arXiv 1903.08008), computed by ArviZ (``az.rhat(method="rank")``,
``az.ess(method="bulk"/"tail")``) for many scalar quantities at once. For M chains of N draws of a
scalar θ:

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
(400 for four chains). :func:`convergence_warning` applies them to the function-space quantities.

Quantities (:func:`compute_quantities`, :func:`diagnose`), each a family of scalars per draw θ_s:

* ``function``: p(y_true | x, θ_s) on validation inputs x (one quantity per input);
* ``log_lik``: (1/n) Σᵢ log p(yᵢ | xᵢ, θ_s) on a fixed training subset, computed from the weights;
* ``weight_pcs``: the projections of the centred weight vectors on their top-k principal directions
  (randomised SVD, Halko, Martinsson & Tropp 2011, streamed over blocks of samples).

Stores with a single chain are split into :data:`PSEUDO_CHAINS` consecutive pieces used as chains (the
summary says so: ``pseudo_chains`` = True). Only numpy, torch, ArviZ (imported on first use) and
matplotlib; nothing here knows of stages or artifact paths.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from apd.nets import ParamSpec, predict_logits

RHAT_THRESHOLD = 1.01  # R̂ above this flags a quantity (Vehtari et al. 2021, §4)
RHAT_SEVERE = 1.05  # the older, looser threshold, reported beside it
RHAT_FRACTION_LIMIT = 0.05  # warn when more than this fraction of function-space inputs exceed RHAT_THRESHOLD
MIN_BULK_ESS = 400.0  # warn when the median function-space bulk ESS is below this (100 per chain × 4 chains)
PSEUDO_CHAINS = 4  # pieces a single-chain store is split into
DEFAULT_MAX_DRAWS = 500  # draws per chain kept (evenly spaced) by diagnose
DEFAULT_MAX_INPUTS = 1000  # function-space inputs kept (evenly spaced) by diagnose
N_COMPONENTS = 5  # principal components of the weights
MIN_DRAWS = 4  # fewest draws per chain the statistics are defined for

FAMILIES = ("function", "log_lik", "weight_pcs")
_FAMILY_LABELS = {"function": "function-space inputs", "log_lik": "training log-likelihood",
                  "weight_pcs": "weight principal components"}
_BLOCK_ELEMENTS = 2**24  # floats of one block of weight vectors read at a time (64 MB as float32)
_MAX_BLOCK = 256
_DEFAULT_CACHE_BYTES = 1 << 30  # weight blocks are kept in memory for the SVD passes up to this size

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


# ------------------------------------------------------------------------------------------ statistics


def _as_dataset(draws: np.ndarray) -> Any:
    import xarray as xr

    chains, n_draws, n_q = draws.shape
    return xr.Dataset(
        {"value": (("chain", "draw", "quantity"), draws)},
        coords={"chain": np.arange(chains), "draw": np.arange(n_draws), "quantity": np.arange(n_q)},
    )


def _check_draws(draws: np.ndarray | Tensor) -> np.ndarray:
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
    draws = _check_draws(draws)
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
    draws = _check_draws(draws)
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


# ------------------------------------------------------------------------------------- chain layout


@dataclass(frozen=True)
class ChainLayout:
    """Which stored sample is draw n of chain m: ``rows`` int64 [chains, draws] indexes the samples.

    ``pseudo_chains`` is True when the chains are consecutive pieces of one stored chain;
    ``samples_available`` is the number of samples the layout was chosen from.
    """

    rows: np.ndarray
    pseudo_chains: bool
    samples_available: int

    @property
    def chains(self) -> int:
        return int(self.rows.shape[0])

    @property
    def draws(self) -> int:
        return int(self.rows.shape[1])


def _evenly_spaced(length: int, count: int | None) -> np.ndarray:
    """``count`` evenly spaced, distinct positions in range(length) including both ends (all if fewer)."""
    if count is None or count >= length:
        return np.arange(length)
    if count < 1:
        raise ValueError(f"count must be positive, got {count}")
    if count == 1:
        return np.array([length - 1])
    return np.rint(np.linspace(0, length - 1, count)).astype(np.int64)


def chain_layout(chain_ids: np.ndarray | Sequence[int] | Tensor, max_draws: int | None = None,
                 pseudo_chains: int = PSEUDO_CHAINS) -> ChainLayout:
    """Arrange samples with per-sample chain ids [n] into chains of equal length.

    Within a chain, samples keep their order in ``chain_ids`` (the store's row order, i.e. sampling order).
    Every chain is truncated to the shortest one's first L samples (the same sampler iterations when chains
    share their thinning). A single chain is split into ``pseudo_chains`` consecutive pieces of ⌊n/p⌋
    samples (the last n mod p samples are dropped). With ``max_draws``, each chain keeps ``max_draws``
    evenly spaced draws (first and last included). Raises ``ValueError`` with fewer than
    :data:`MIN_DRAWS` draws per chain.
    """
    if isinstance(chain_ids, Tensor):
        chain_ids = chain_ids.cpu().numpy()
    ids = np.asarray(chain_ids).reshape(-1)
    if ids.size == 0:
        raise ValueError("no samples to diagnose")
    labels = np.unique(ids)
    if labels.size == 1:
        if pseudo_chains < 2:
            raise ValueError(f"pseudo_chains must be at least 2, got {pseudo_chains}")
        length = ids.size // pseudo_chains
        rows = np.arange(length * pseudo_chains).reshape(pseudo_chains, length)
        pseudo = True
    else:
        members = [np.flatnonzero(ids == label) for label in labels]
        length = min(m.size for m in members)
        rows = np.stack([m[:length] for m in members])
        pseudo = False
    if length < MIN_DRAWS:
        kind = f"{pseudo_chains} pseudo-chains of one chain's {ids.size} samples" if pseudo else (
            f"the shortest of {labels.size} chains")
        raise ValueError(f"too few samples for convergence diagnostics: {length} draws in {kind} "
                         f"(at least {MIN_DRAWS} per chain are needed)")
    rows = rows[:, _evenly_spaced(length, max_draws)]
    return ChainLayout(rows=rows.astype(np.int64), pseudo_chains=pseudo, samples_available=int(ids.size))


def arrange_chains(chain_ids: np.ndarray | Sequence[int] | Tensor, draws: np.ndarray | Tensor,
                   max_draws: int | None = None, pseudo_chains: int = PSEUDO_CHAINS) -> np.ndarray:
    """Per-sample ``draws`` [n, Q] (or [n]) with chain ids [n] → [chains, draws, Q] (see :func:`chain_layout`)."""
    if isinstance(draws, Tensor):
        draws = draws.detach().cpu().numpy()
    draws = np.asarray(draws)
    if draws.ndim == 1:
        draws = draws[:, None]
    if draws.shape[0] != np.asarray(chain_ids).reshape(-1).shape[0]:
        raise ValueError(f"{draws.shape[0]} draws but {np.asarray(chain_ids).size} chain ids")
    return draws[chain_layout(chain_ids, max_draws, pseudo_chains).rows]


# ----------------------------------------------------------------------------------------- quantities


@dataclass
class Quantities:
    """Per-draw quantities of one chain layout: ``draws[family]`` is [chains, draws, Q_family] and
    ``names[family]`` its Q_family labels."""

    layout: ChainLayout
    draws: dict[str, np.ndarray]
    names: dict[str, list[str]]


ReadRows = Callable[[np.ndarray], Tensor]


def _resolve_samples(samples: Any, chain_ids: Any) -> tuple[ReadRows, np.ndarray]:
    """(read_rows, chain ids) from a store, a [n, D] array, a list of per-chain arrays or a callable."""
    if hasattr(samples, "read") and hasattr(samples, "chains"):  # a SampleStore (duck-typed)
        ids = np.asarray(samples.chains if chain_ids is None else chain_ids)
        return samples.read, ids
    if isinstance(samples, (list, tuple)):  # weights by chain
        blocks = [torch.as_tensor(np.asarray(b) if not isinstance(b, Tensor) else b, dtype=torch.float32)
                  for b in samples]
        if chain_ids is not None:
            raise ValueError("chain_ids cannot be given with weights grouped by chain")
        weights = torch.cat(blocks)
        ids = np.concatenate([np.full(len(b), i) for i, b in enumerate(blocks)])
        samples, chain_ids = weights, ids
    if isinstance(samples, (Tensor, np.ndarray)):
        weights = torch.as_tensor(samples, dtype=torch.float32)
        if weights.dim() != 2:
            raise ValueError(f"weights must be [n, D], got {list(weights.shape)}")
        ids = np.zeros(len(weights), dtype=np.int64) if chain_ids is None else np.asarray(chain_ids)
        if ids.shape != (len(weights),):
            raise ValueError(f"{len(weights)} weight vectors but chain ids of shape {list(ids.shape)}")
        return (lambda rows: weights[torch.as_tensor(rows)]), ids
    if callable(samples):
        if chain_ids is None:
            raise ValueError("a read_rows callable needs chain_ids")
        ids = np.asarray(chain_ids)
        return samples, ids
    raise TypeError(f"cannot read weight samples from {type(samples).__name__}")


def _log_lik_true(spec: ParamSpec | nn.Module, weights: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """log p(y_i | x_i, θ_k) → [k, N] (float32, via log-softmax)."""
    logits = predict_logits(spec, weights, x)
    log_probs = torch.log_softmax(logits, dim=-1)
    return log_probs.gather(2, y.view(1, -1, 1).expand(len(weights), -1, 1)).squeeze(2)


class _PCA:
    """Top-k principal-component scores of the rows of X [S, D], streamed over blocks of rows.

    Randomised SVD of the centred X_c = X − 1μᵀ (Halko, Martinsson & Tropp 2011, Alg. 4.4 with the power
    scheme): Y = X_c Ω (Ω Gaussian [D, l], l = k + 10), then ``n_iter`` times Z = orth(X_cᵀ orth(Y)),
    Y = X_c Z; with Q = orth(Y), B = QᵀX_c = U_B Σ V_Bᵀ, the scores X_c V_k = Q U_B[:, :k] Σ_k. Each
    product with X_c is one pass over the blocks, using X_c Z = X Z − 1(μᵀZ) and
    X_cᵀQ = XᵀQ − μ(1ᵀQ), so no centred copy is formed.
    """

    def __init__(self, n_rows: int, k: int, n_iter: int, seed: int) -> None:
        self.n_rows, self.k, self.n_iter, self.seed = n_rows, k, n_iter, seed
        self.omega: Tensor | None = None
        self.y: Tensor | None = None
        self.total: Tensor | None = None

    def first_pass(self, start: int, block: Tensor) -> None:
        """Accumulate Σ x and X Ω for one block of rows (the pass shared with the other quantities)."""
        block = block.double()
        if self.omega is None:
            dim = block.shape[1]
            self.width = min(self.k + 10, self.n_rows, dim)
            gen = torch.Generator().manual_seed(self.seed)
            self.omega = torch.randn(dim, self.width, generator=gen, dtype=torch.float64)
            self.y = torch.empty(self.n_rows, self.width, dtype=torch.float64)
            self.total = torch.zeros(dim, dtype=torch.float64)
        self.total += block.sum(0)
        self.y[start:start + len(block)] = block @ self.omega

    def scores(self, blocks: Callable[[], Any]) -> np.ndarray:
        """Finish the SVD with further passes over ``blocks()`` (an iterable of (start, block)); [S, k]."""
        mean = self.total / self.n_rows
        y = self.y - (mean @ self.omega)
        for _ in range(self.n_iter):
            z = torch.linalg.qr(self._xt_times(torch.linalg.qr(y).Q, mean, blocks)).Q
            y = self._x_times(z, mean, blocks)
        q = torch.linalg.qr(y).Q
        bt = self._xt_times(q, mean, blocks)  # [D, l] = X_cᵀQ = Bᵀ
        u_b, sigma, _ = torch.linalg.svd(bt.T, full_matrices=False)
        return (q @ u_b[:, :self.k] * sigma[:self.k]).numpy()

    def _x_times(self, z: Tensor, mean: Tensor, blocks: Callable[[], Any]) -> Tensor:
        out = torch.empty(self.n_rows, z.shape[1], dtype=torch.float64)
        for start, block in blocks():
            out[start:start + len(block)] = block.double() @ z
        return out - mean @ z

    def _xt_times(self, q: Tensor, mean: Tensor, blocks: Callable[[], Any]) -> Tensor:
        out = torch.zeros(len(mean), q.shape[1], dtype=torch.float64)
        for start, block in blocks():
            out += block.double().T @ q[start:start + len(block)]
        return out - torch.outer(mean, q.sum(0))


def _as_float(x: Tensor | np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x).float()


def _as_labels(y: Tensor | np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(y) if not isinstance(y, Tensor) else y).long().reshape(-1)


def compute_quantities(
    spec: ParamSpec | nn.Module,
    samples: Any,
    x_val: Tensor | np.ndarray,
    y_val: Tensor | np.ndarray,
    x_train: Tensor | np.ndarray,
    y_train: Tensor | np.ndarray,
    *,
    chain_ids: np.ndarray | Sequence[int] | None = None,
    max_draws: int | None = DEFAULT_MAX_DRAWS,
    max_inputs: int | None = DEFAULT_MAX_INPUTS,
    n_components: int = N_COMPONENTS,
    pseudo_chains: int = PSEUDO_CHAINS,
    power_iterations: int = 2,
    cache_bytes: int = _DEFAULT_CACHE_BYTES,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> Quantities:
    """The three quantity families (module docstring) for every draw of the chain layout of ``samples``.

    ``samples`` is a :class:`apd.samplers.store.SampleStore` (read with ``store.read(rows)``, chains from
    ``store.chains``), a weight array [n, D] with ``chain_ids`` [n] (one chain if omitted), a list of
    per-chain weight arrays [n_c, D], or a callable ``read_rows(indices) -> Tensor[k, D]`` with
    ``chain_ids``. Only the draws of :func:`chain_layout` (``max_draws`` per chain, evenly spaced) are
    read, in blocks of at most 64 MB; the blocks stay in memory for the SVD's later passes while they total
    at most ``cache_bytes``, and are read again otherwise. ``max_inputs`` evenly spaced validation inputs
    are used (all if None); ``x_train``/``y_train`` is the fixed training subset of the log-likelihood.
    Predictions run on ``device`` (default: the CPU, where the blocks are read), the SVD on the CPU in
    float64; ``seed`` fixes its random projection.
    """
    read_rows, ids = _resolve_samples(samples, chain_ids)
    layout = chain_layout(ids, max_draws, pseudo_chains)
    x_val, y_val = _as_float(x_val), _as_labels(y_val)
    x_train, y_train = _as_float(x_train), _as_labels(y_train)
    if len(x_val) != len(y_val) or len(x_train) != len(y_train):
        raise ValueError("inputs and labels differ in length")
    keep = _evenly_spaced(len(x_val), max_inputs)
    device = torch.device(device) if device is not None else torch.device("cpu")
    x_val, y_val = x_val[keep].to(device), y_val[keep].to(device)
    x_train, y_train = x_train.to(device), y_train.to(device)

    flat_rows = layout.rows.reshape(-1)
    n_rows = flat_rows.size
    spec = spec if isinstance(spec, ParamSpec) else ParamSpec.from_module(spec)
    dim = spec.numel
    block_rows = int(max(1, min(_MAX_BLOCK, _BLOCK_ELEMENTS // dim)))
    k = int(min(n_components, n_rows - 1, dim))
    cache: list[tuple[int, Tensor]] | None = [] if n_rows * dim * 4 <= cache_bytes else None

    def read_blocks() -> Any:
        for start in range(0, n_rows, block_rows):
            block = torch.as_tensor(read_rows(flat_rows[start:start + block_rows])).float().cpu()
            if block.shape != (min(block_rows, n_rows - start), dim):
                raise ValueError(f"read_rows gave a block of shape {list(block.shape)}, expected "
                                 f"[{min(block_rows, n_rows - start)}, {dim}]")
            yield start, block

    function = np.empty((n_rows, len(x_val)))
    log_lik = np.empty(n_rows)
    pca = _PCA(n_rows, k, power_iterations, seed) if k >= 1 else None
    with torch.no_grad():
        for start, block in read_blocks():
            stop = start + len(block)
            on_device = block.to(device)
            function[start:stop] = _log_lik_true(spec, on_device, x_val, y_val).double().exp().cpu().numpy()
            log_lik[start:stop] = _log_lik_true(spec, on_device, x_train, y_train).double().mean(1).cpu().numpy()
            if pca is not None:
                pca.first_pass(start, block)
            if cache is not None:
                cache.append((start, block))
        pcs = pca.scores(lambda: iter(cache) if cache is not None else read_blocks()) if pca else None

    shape = layout.rows.shape
    draws = {"function": function.reshape(*shape, -1), "log_lik": log_lik.reshape(*shape, 1)}
    names = {"function": [f"p(y|x) val[{i}]" for i in keep], "log_lik": ["mean log p(y|x) train"]}
    if pcs is not None:
        draws["weight_pcs"] = pcs.reshape(*shape, -1)
        names["weight_pcs"] = [f"weight PC{i + 1}" for i in range(k)]
    return Quantities(layout=layout, draws=draws, names=names)


def diagnose(
    spec: ParamSpec | nn.Module,
    samples: Any,
    x_val: Tensor | np.ndarray,
    y_val: Tensor | np.ndarray,
    x_train: Tensor | np.ndarray,
    y_train: Tensor | np.ndarray,
    *,
    chain_ids: np.ndarray | Sequence[int] | None = None,
    max_draws: int | None = DEFAULT_MAX_DRAWS,
    max_inputs: int | None = DEFAULT_MAX_INPUTS,
    n_components: int = N_COMPONENTS,
    pseudo_chains: int = PSEUDO_CHAINS,
    figure_path: str | Path | None = None,
    engine: str = "arviz",
    seed: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Convergence diagnostics of SGLD samples in function space, log-likelihood and weight PCs.

    Arguments as :func:`compute_quantities` (further keywords go to it); ``engine`` as
    :func:`rank_diagnostics`. Returns a JSON-ready dict:

    * ``chains_used`` (chains or pseudo-chains), ``draws_per_chain``, ``pseudo_chains`` (bool),
      ``samples_available`` (samples the draws were chosen from);
    * ``families``: for ``function``, ``log_lik`` and ``weight_pcs``, the :func:`summarise` dict
      (``rhat_median``, ``rhat_max``, ``frac_rhat_above_1.01``, ``frac_rhat_above_1.05``,
      ``ess_bulk_median``, ``ess_bulk_min``, ``ess_tail_median``, ``ess_tail_min``, ``quantities``,
      ``chains``, ``draws``, ``n_constant``);
    * ``worst_inputs``: the validation indices of the (up to) three inputs with the largest R̂;
    * ``thresholds``: the constants of the warning rule; ``warning``: :func:`convergence_warning`'s
      sentence or None.

    With ``figure_path``, :func:`plot_diagnostics` draws the three worst inputs, the training
    log-likelihood and the first two weight PCs there.
    """
    quantities = compute_quantities(
        spec, samples, x_val, y_val, x_train, y_train, chain_ids=chain_ids, max_draws=max_draws,
        max_inputs=max_inputs, n_components=n_components, pseudo_chains=pseudo_chains, seed=seed, **kwargs)
    layout = quantities.layout
    families: dict[str, Any] = {}
    stats: dict[str, dict[str, np.ndarray]] = {}
    for family, draws in quantities.draws.items():
        stats[family] = rank_diagnostics(draws, engine)
        families[family] = summarise(draws, stats[family])
    rhat_function = np.nan_to_num(stats["function"]["rhat"], nan=-np.inf)
    worst = [int(i) for i in np.argsort(-rhat_function, kind="stable")[:3]]
    keep = _evenly_spaced(len(x_val), max_inputs)
    summary = {
        "chains_used": layout.chains,
        "draws_per_chain": layout.draws,
        "pseudo_chains": layout.pseudo_chains,
        "samples_available": layout.samples_available,
        "families": families,
        "worst_inputs": [int(keep[i]) for i in worst],
        "thresholds": {"rhat": RHAT_THRESHOLD, "rhat_fraction": RHAT_FRACTION_LIMIT,
                       "min_bulk_ess": MIN_BULK_ESS},
    }
    summary["warning"] = convergence_warning(summary)
    if figure_path is not None:
        picks = [quantities.draws["function"][:, :, worst], quantities.draws["log_lik"]]
        names = [quantities.names["function"][i] for i in worst] + quantities.names["log_lik"]
        if "weight_pcs" in quantities.draws:
            picks.append(quantities.draws["weight_pcs"][:, :, :2])
            names += quantities.names["weight_pcs"][:2]
        rhat_picked = [stats["function"]["rhat"][i] for i in worst] + [stats["log_lik"]["rhat"][0]]
        if "weight_pcs" in stats:
            rhat_picked += list(stats["weight_pcs"]["rhat"][:2])
        labels = [f"{n} (R̂ {r:.3f})" if np.isfinite(r) else n for n, r in zip(names, rhat_picked, strict=True)]
        chains = "pseudo-chains" if layout.pseudo_chains else "chains"
        plot_diagnostics(np.concatenate(picks, axis=2), labels, figure_path,
                         title=f"{layout.chains} {chains} × {layout.draws} draws")
    return summary


# -------------------------------------------------------------------------------------------- warning


def convergence_warning(summary: dict[str, Any]) -> str | None:
    """One sentence when the function-space diagnostics fail, else None.

    Fails when R̂ > :data:`RHAT_THRESHOLD` on more than :data:`RHAT_FRACTION_LIMIT` of the function-space
    inputs, or when their median bulk ESS is below :data:`MIN_BULK_ESS`; the sentence names each failed
    check with its numbers. ``summary`` is a :func:`diagnose` result (or has its ``families`` key).
    """
    function = summary.get("families", {}).get("function")
    if function is None:
        return None
    reasons = []
    frac = function[f"frac_rhat_above_{RHAT_THRESHOLD:g}"]
    if frac > RHAT_FRACTION_LIMIT:
        reasons.append(f"R-hat > {RHAT_THRESHOLD:g} on {100 * frac:.1f} % of {function['quantities']} "
                       f"function-space inputs (limit {100 * RHAT_FRACTION_LIMIT:g} %, "
                       f"max R-hat {function['rhat_max']:.3f})")
    ess = function["ess_bulk_median"]
    if ess is not None and ess < MIN_BULK_ESS:
        reasons.append(f"the median function-space bulk ESS is {ess:.0f} (below {MIN_BULK_ESS:g})")
    if not reasons:
        return None
    chains = "pseudo-chains" if summary.get("pseudo_chains") else "chains"
    return (f"SGLD samples may not have converged ({function['chains']} {chains} × {function['draws']} "
            f"draws): " + " and ".join(reasons) + ".")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """A :func:`diagnose` result as a few lines of text: one per quantity family, the warning apart
    (``{"error": …}``, what a caller records when there were too few draws, gives one line saying so)."""
    if "families" not in summary:
        return [f"convergence diagnostics: none ({summary.get('error', 'not computed')})"]

    def number(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    chains = "pseudo-chains (one chain cut in pieces)" if summary["pseudo_chains"] else "chains"
    lines = [f"convergence diagnostics, {summary['chains_used']} {chains} × {summary['draws_per_chain']} draws "
             f"of {summary['samples_available']:,} samples (rank-normalised split R-hat, bulk/tail ESS):"]
    for family in FAMILIES:
        f = summary["families"].get(family)
        if f is None:
            continue
        frac = f[f"frac_rhat_above_{RHAT_THRESHOLD:g}"]
        lines.append(f"  {_FAMILY_LABELS[family] + ' (' + str(f['quantities']) + ')':<32} R-hat median "
                     f"{number(f['rhat_median'], 3)}, max {number(f['rhat_max'], 3)}, > {RHAT_THRESHOLD:g} on "
                     f"{100 * frac:.1f} %; bulk ESS median {number(f['ess_bulk_median'], 0)} (min "
                     f"{number(f['ess_bulk_min'], 0)}), tail ESS median {number(f['ess_tail_median'], 0)}")
    return lines


# --------------------------------------------------------------------------------------------- figure


def plot_diagnostics(draws: np.ndarray | Tensor, names: Sequence[str], path: str | Path,
                     title: str | None = None, bins: int = 20) -> Path:
    """Trace plot (left) and rank plot (right) of each quantity of ``draws`` [chains, draws, Q]; PNG at ``path``.

    Rank plot (Vehtari et al. 2021, §4.1): the draws of all chains are ranked together and each chain's
    ranks are histogrammed in ``bins`` equal bins, one row of bars per chain; with converged chains every
    histogram is near uniform (dashed line: the expected count per bin). Drawn on a matplotlib
    :class:`~matplotlib.figure.Figure` (Agg canvas, no pyplot state).
    """
    from matplotlib.figure import Figure
    from scipy.stats import rankdata

    draws = _check_draws(draws)
    chains, n_draws, n_q = draws.shape
    if len(names) != n_q:
        raise ValueError(f"{n_q} quantities but {len(names)} names")
    height = 1.9 * n_q + 0.6
    figure = Figure(figsize=(10, height))
    # a fixed layout: constrained layout measured twice as slow to render for no visible gain here
    axes = figure.subplots(n_q, 2, squeeze=False, width_ratios=[2.2, 1], gridspec_kw={
        "left": 0.06, "right": 0.98, "bottom": 0.45 / height, "top": 1 - 0.7 / height, "hspace": 0.55,
        "wspace": 0.12})
    colours = [f"C{c % 10}" for c in range(chains)]
    edges = np.linspace(0, chains * n_draws, bins + 1)
    expected = n_draws / bins  # a chain's count per bin when all chains sample the same distribution
    offsets = 2.2 * expected * np.arange(chains)
    for q in range(n_q):
        trace, rank = axes[q]
        for c in range(chains):
            trace.plot(draws[c, :, q], color=colours[c], lw=0.6, alpha=0.8, label=f"chain {c}")
        trace.set_title(names[q], fontsize=9, loc="left")
        trace.set_xlim(0, n_draws - 1)
        trace.tick_params(labelsize=7)
        ranks = rankdata(draws[:, :, q].reshape(-1)).reshape(chains, n_draws)
        for c in range(chains):
            counts, _ = np.histogram(ranks[c], bins=edges)
            rank.bar(edges[:-1], counts, width=np.diff(edges), bottom=offsets[c], align="edge",
                     color=colours[c], alpha=0.75, edgecolor="white", linewidth=0.3)
            rank.hlines(offsets[c] + expected, edges[0], edges[-1], color="k", ls="--", lw=0.6)
        rank.set_yticks(offsets, [f"chain {c}" for c in range(chains)])
        rank.set_xlim(edges[0], edges[-1])
        rank.tick_params(labelsize=7)
        rank.set_title("rank histogram per chain (--- uniform)", fontsize=9, loc="left")
    axes[-1][0].set_xlabel("draw", fontsize=8)
    axes[-1][1].set_xlabel("rank among all draws", fontsize=8)
    if chains <= 10:
        handles, labels = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, fontsize=8, ncol=chains, loc="upper left", frameon=False)
    if title:
        figure.suptitle(title, fontsize=10, x=0.98, ha="right")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


__all__ = [
    "ChainLayout", "MIN_BULK_ESS", "PSEUDO_CHAINS", "Quantities", "RHAT_FRACTION_LIMIT", "RHAT_SEVERE",
    "RHAT_THRESHOLD", "arrange_chains", "chain_layout", "compute_quantities", "convergence_warning",
    "diagnose", "plot_diagnostics", "rank_diagnostics", "summarise", "summary_lines",
]
