r"""The per-draw quantities whose convergence is diagnosed, from SGLD samples arranged in chains:
:func:`chain_layout` picks the draws of equal-length chains (a single chain is cut into :data:`PSEUDO_CHAINS`
consecutive pieces used as chains), and :func:`compute_quantities` reads them in blocks from a sample store,
a weight array or a callable and computes three families of scalars per draw θ_s: ``function``,
p(y_true | x, θ_s) on each validation input x; ``log_lik``, (1/n) Σᵢ log p(yᵢ | xᵢ, θ_s) on a fixed training
subset, from the weights; ``weight_pcs``, the projections of the centred weight vectors on their top-k
principal directions (randomised SVD, Halko, Martinsson & Tropp 2011, streamed over blocks of samples).
Only numpy and torch; nothing here knows of stages or artifact paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from apd.nets import ParamSpec, predict_logits
from apd.samplers.rank_stats import MIN_DRAWS

PSEUDO_CHAINS = 4  # pieces a single-chain store is split into
DEFAULT_MAX_DRAWS = 500  # draws per chain kept (evenly spaced) by diagnose
DEFAULT_MAX_INPUTS = 1000  # function-space inputs kept (evenly spaced) by diagnose
N_COMPONENTS = 5  # principal components of the weights
_BLOCK_ELEMENTS = 2**24  # floats of one block of weight vectors read at a time (64 MB as float32)
_MAX_BLOCK = 256
_DEFAULT_CACHE_BYTES = 1 << 30  # weight blocks are kept in memory for the SVD passes up to this size


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


def evenly_spaced(length: int, count: int | None) -> np.ndarray:
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
    rows = rows[:, evenly_spaced(length, max_draws)]
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
    keep = evenly_spaced(len(x_val), max_inputs)
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


__all__ = ["ChainLayout", "PSEUDO_CHAINS", "Quantities", "arrange_chains", "chain_layout", "compute_quantities"]
