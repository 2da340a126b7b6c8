"""Stein thinning (Riabiz, Chen, Cockayne, Swietach, Niederer, Mackey & Oates, "Optimal thinning of MCMC
output", JRSS B 2022; the ``stein-thinning`` package): choose k of n candidate samples greedily so that
the kernel Stein discrepancy (KSD) between the chosen points and the posterior is smallest.

The KSD needs the score ∇ log p(θ | D) at each candidate; here it is computed exactly on the FULL
training set (not a minibatch), for the posterior that SGLD samples (:class:`apd.samplers.sgld.SGLD`):

    ∇ log p(θ | D) = −(N·∇ mean_nll(θ) + θ / prior_var) / temperature,

where mean_nll is the mean cross-entropy over the N training examples, i.e. N·mean_nll = Σ_i nll_i.

Kernel (the package's default family): the inverse multiquadric k(x, y) = (1 + λ‖x − y‖²)^(−1/2)
after the package's standardisation (each coordinate divided by its mean absolute deviation over the
candidates, the score multiplied by it), with the package's isotropic preconditioners: ``"med"``
λ = 1/med², ``"sclmed"`` (default here) λ = log(min(n, 1000))/med², med the median pairwise distance of
(at most 1,000 evenly spaced) candidates; ``"id"`` λ = 1; or a number ℓ², λ = 1/ℓ². Its Stein kernel is

    k_p(x, y) = −3λ²r² / q^(5/2) + λ(d + (s_x − s_y)·(x − y)) / q^(3/2) + s_x·s_y / q^(1/2),

with r² = ‖x − y‖², q = 1 + λr², s the (standardised) score and d the dimension.

Why not call ``stein_thinning.thinning.thin`` (version 0.2.0) itself: it builds its preconditioner as a
dense d×d matrix and multiplies by it (and by its square) at every greedy step. At d = 7,510 (the digits
net) that is 451 MB and took 93 s for the first pick and 62 s for each further one (one CPU thread,
1,000 candidates: about 21 minutes for 20 picks); at d = 79,510 (fcNN1) the matrix alone is 50.6 GB.
The preconditioners ``med``/``sclmed``/``id`` are multiples of the identity, so :func:`stein_thin`
evaluates the same kernel from inner products, O(n·d) per pick and no d×d matrix; with
``repeats=True`` its picks equal the package's ``thin(…)`` exactly (tested). No lower-dimensional
projection is needed. 1,000 candidates → 20 picks took 6 s at d = 7,510 and 58 s at d = 79,510 (24 s
of it the median heuristic's 1,000 × 1,000 distances), on one thread of a shared 2-core machine
(``benchmarks/bench_stein.py``); the scores cost more: 7 s for the digits net, about 25 minutes for
fcNN1 on the full 50,000 training examples (1.2·10¹⁰ multiply-adds per candidate).

The package's greedy search may pick a point more than once; by default (``repeats=False``) an already
chosen candidate is not chosen again, so k distinct samples come back (greedy KSD minimisation over
sets without replacement), and :func:`stein_rows` returns them sorted.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from apd.nets import ParamSpec, gradient_blocks, predict_logits
from apd.posteriors.kept import evenly_spaced_rows
from apd.samplers.store import SampleStore, StoreRows

_MEDIAN_SUBSET = 1000  # the package's subset size for the median heuristic
_ROW_CHUNK_BYTES = 64 * 2**20  # float64 bytes of one block of rows in the kernel column


def log_posterior_gradients(spec: ParamSpec, weights: Tensor, x: Tensor, y: Tensor, prior_var: float,
                            temperature: float = 1.0, data_batch: int = 8192) -> Tensor:
    """∇ log p(θ_k | D) = −(N·∇ mean_nll(θ_k) + θ_k/prior_var)/temperature for each row of weights [K, D].

    The NLL is summed over the whole training set (x, y); blocks of networks × examples are sized by
    :func:`apd.nets.gradient_blocks` from ``data_batch`` examples of one network, so memory stays bounded
    for any K and N. Computes on ``weights.device``; returns float32 [K, D].
    """
    if prior_var <= 0 or temperature <= 0:
        raise ValueError("prior_var and temperature must be positive")
    if weights.dim() != 2 or weights.shape[1] != spec.numel:
        raise ValueError(f"weights must be [K, {spec.numel}], got {list(weights.shape)}")
    device = weights.device
    x = x.reshape(x.shape[0], -1).to(device)
    y = y.to(device)
    chunk, batch = gradient_blocks(spec, x.shape[1], len(weights), min(len(y), data_batch))
    out = torch.empty(weights.shape, dtype=torch.float32, device=device)
    for start in range(0, len(weights), chunk):
        block = weights[start:start + chunk].detach().float().requires_grad_(True)
        grad = torch.zeros_like(block)
        for a in range(0, len(y), batch):
            logits = predict_logits(spec, block, x[a:a + batch])  # [k, b, C]
            labels = y[a:a + batch].repeat(len(block))
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels, reduction="sum")
            grad += torch.autograd.grad(nll, block)[0]
        with torch.no_grad():
            out[start:start + chunk] = -(grad + block / prior_var) / temperature
    return out


def stein_thin(points: Tensor | np.ndarray, gradients: Tensor | np.ndarray, k: int,
               preconditioner: str | float = "sclmed", standardize: bool = True,
               repeats: bool = False) -> np.ndarray:
    """Greedy Stein thinning of n points [n, d] with scores ``gradients`` [n, d]: indices of k points in
    the order chosen (see the module docstring for the kernel). ``repeats=True`` is the package's
    algorithm (a point may come back); ``repeats=False`` gives k distinct points (needs k ≤ n).

    Works in float64 on the points' device, as the package does: the standardised, centred points and
    scores take 16·n·d bytes (1.3 GB for 1,000 fcNN1 candidates). The kernel needs only inner products,
    so each pick costs two [n, d] × [d, 2] products: O(n·d), no d×d matrix.
    """
    points = torch.as_tensor(points)
    gradients = torch.as_tensor(gradients, device=points.device)
    n, d = points.shape
    if gradients.shape != points.shape:
        raise ValueError(f"points {list(points.shape)} and gradients {list(gradients.shape)} differ in shape")
    if k < 1 or (not repeats and k > n):
        raise ValueError(f"cannot choose {k} {'' if repeats else 'distinct '}points out of {n}")
    if not (torch.isfinite(points).all() and torch.isfinite(gradients).all()):
        raise ValueError("points or gradients are not finite")
    block = max(1, _ROW_CHUNK_BYTES // (8 * d))
    loc = points.sum(0, dtype=torch.float64) / n
    scale = torch.ones(d, dtype=torch.float64, device=points.device)
    if standardize:  # the package's scale: each coordinate's mean absolute deviation over the points
        scale = torch.zeros_like(scale)
        for a in range(0, n, block):
            scale += (points[a:a + block].double() - loc).abs().sum(0)
        scale /= n
        if scale.min() <= 0:
            raise ValueError("a coordinate takes one value at every point: too few distinct samples")
    # The kernel depends on the points only through differences, so centring them changes nothing and
    # keeps the inner products below free of cancellation.
    x = torch.empty(n, d, dtype=torch.float64, device=points.device)
    s = torch.empty_like(x)
    for a in range(0, n, block):
        x[a:a + block] = (points[a:a + block].double() - loc) / scale
        s[a:a + block] = gradients[a:a + block].double() * scale
    lam = _precision(x, preconditioner)
    xx, sx, ss = (x * x).sum(1), (s * x).sum(1), (s * s).sum(1)

    def kernel_column(j: int) -> Tensor:
        """k_p(x_i, x_j) for every i (float64 [n])."""
        pair = torch.stack([x[j], s[j]], 1)  # [d, 2]
        x_dot, s_dot = x @ pair, s @ pair  # [n, 2]: x_i·x_j, x_i·s_j and s_i·x_j, s_i·s_j
        r2 = (xx + xx[j] - 2 * x_dot[:, 0]).clamp_min(0)
        r2[j] = 0
        cross = sx - s_dot[:, 0] - x_dot[:, 1] + sx[j]  # (s_i − s_j)·(x_i − x_j)
        q = 1 + lam * r2
        return -3 * lam**2 * r2 / q**2.5 + lam * (d + cross) / q**1.5 + s_dot[:, 1] / q.sqrt()

    objective = lam * d + ss  # k_p(x_i, x_i)
    chosen = np.empty(k, dtype=np.int64)
    taken = torch.zeros(n, dtype=torch.bool, device=points.device)
    for t in range(k):
        candidates = objective if repeats else objective.masked_fill(taken, math.inf)
        chosen[t] = int(torch.argmin(candidates))
        taken[chosen[t]] = True
        if t + 1 < k:
            objective += 2 * kernel_column(int(chosen[t]))
    return chosen


def stein_rows(store: SampleStore | StoreRows, k: int, x_train: Tensor, y_train: Tensor, prior_var: float,
               candidates: int = 1000, preconditioner: str | float = "sclmed", temperature: float = 1.0,
               device: torch.device | str = "cpu") -> np.ndarray:
    """k distinct rows of ``store`` (of the view, for a :class:`~apd.samplers.store.StoreRows`) chosen by
    Stein thinning, sorted ascending.

    The candidates are ``min(candidates, len(store))`` rows spread evenly over all of ``store``
    (:func:`apd.posteriors.kept.evenly_spaced_rows` without chains: each chain in proportion to its length,
    as the store holds the chains one after another); their scores are computed on the full
    training set (x_train, y_train) with :func:`log_posterior_gradients` — training data only, as SGLD.
    Cost: one full-data gradient per candidate plus O(candidates·D) per pick.
    """
    n = len(store)
    rows = evenly_spaced_rows(n, min(candidates, n))
    if not 1 <= k <= rows.size:
        raise ValueError(f"cannot choose {k} of {rows.size} candidate rows")
    points = store.read(rows).to(device)
    gradients = log_posterior_gradients(store.spec, points, x_train, y_train, prior_var, temperature)
    picks = stein_thin(points, gradients, k, preconditioner, repeats=False)
    return np.sort(rows[picks])


def _precision(points: Tensor, preconditioner: str | float) -> float:
    """λ of the isotropic preconditioner λ·I, computed as the package's ``make_precon`` does."""
    if preconditioner in ("med", "sclmed"):
        n = points.shape[0]
        sub = points[np.linspace(0, n - 1, _MEDIAN_SUBSET, dtype=int)] if n > _MEDIAN_SUBSET else points
        med2 = _median_pairwise_distance(sub) ** 2
        if med2 <= 0:
            raise ValueError("the candidates coincide: too few distinct samples")
        return (math.log(min(_MEDIAN_SUBSET, n)) if preconditioner == "sclmed" else 1.0) / med2
    if preconditioner == "id":
        return 1.0
    try:
        length2 = float(preconditioner)
    except ValueError:
        raise ValueError(f"preconditioner must be 'id', 'med', 'sclmed' or a squared length scale, "
                         f"got {preconditioner!r} (the package's 'smpcov' needs a d×d matrix)") from None
    if length2 <= 0:
        raise ValueError(f"the squared length scale must be positive, got {length2}")
    return 1.0 / length2


def _median_pairwise_distance(sub: Tensor) -> float:
    """Median Euclidean distance over pairs i < j (as ``np.median(scipy.spatial.distance.pdist(sub))``)."""
    sub = sub.double()
    sq = (sub * sub).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * sub @ sub.T).clamp_min(0)
    i, j = torch.triu_indices(len(sub), len(sub), offset=1, device=sub.device)
    return float(np.median(d2[i, j].sqrt().cpu().numpy()))
