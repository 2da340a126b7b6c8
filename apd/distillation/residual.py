"""Scaling a subspace distiller's residual so that its networks disagree in distribution as SGLD's do.

A subspace codec generates θ = μ + U·diag(σ)·c + α·s ⊙ ε (:mod:`apd.distillation.codec`), where s_d is the
per-weight standard deviation of the samples outside the principal subspace and ε ~ N(0, I_D). With
α = 1 every weight keeps its marginal spread, but the independent noise moves each network's function
further than SGLD's correlated residual does (on Fashion-MNIST fcNN1, r = 18, the first layer's
pre-activation variance on training inputs is 1.6 times SGLD's), so generated ensembles disagree too much,
on in-distribution inputs as much as on others. With α = 0 they disagree too little away from the data.

:func:`match_residual_scale` picks α from in-distribution data alone: the root of

    m(α) = (1/N) Σ_n I[y; θ | x_n],  θ ~ q_α,   m(α) = m_SGLD,

on N validation inputs, where I is the mutual information between prediction and weights (BALD;
Houlsby et al., 2011) of a K-network ensemble and m_SGLD that of K SGLD samples. The codes c and noise ε
are drawn once (common random numbers), so m is a smooth, increasing function of α and Brent's method
finds its root. No out-of-distribution input is involved.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from scipy.optimize import brentq
from torch import Tensor

from apd.distillation.codec import WeightCodec
from apd.nets import ParamSpec, predict_probs
from apd.uncertainty import bald

MAX_SCALE = 2.0  # the largest α searched; past it the residual outweighs the posterior's own spread


def mean_mutual_information(spec: ParamSpec, weights: Tensor, x: Tensor) -> float:
    """(1/N) Σ_n I[y; θ | x_n] of the ensemble of networks ``weights`` [K, D] on inputs ``x`` [N, ...]."""
    return float(bald(predict_probs(spec, weights, x)).mean())


@torch.no_grad()
def matched_scale(principal: Tensor, noise: Tensor, spec: ParamSpec, x: Tensor, target: float,
                  tolerance: float = 1e-3) -> float:
    """α ∈ [0, :data:`MAX_SCALE`] at which the networks ``principal + α·noise`` [K, D] have mean mutual
    information ``target`` on ``x`` (module docstring); 0 when they disagree enough without the noise,
    :data:`MAX_SCALE` when even that is too little. ``principal`` and ``noise`` stay fixed (common random
    numbers), so the root is that of a smooth function of α."""

    def excess(alpha: float) -> float:
        return mean_mutual_information(spec, principal + alpha * noise, x) - target

    if excess(0.0) >= 0:
        return 0.0
    if excess(MAX_SCALE) <= 0:
        return MAX_SCALE
    return float(brentq(excess, 0.0, MAX_SCALE, xtol=tolerance))


@torch.no_grad()
def match_residual_scale(codec: WeightCodec, sample_codes: Callable[[int, torch.Generator], Tensor],
                         spec: ParamSpec, x: Tensor, target: float, networks: int, generator: torch.Generator,
                         tolerance: float = 1e-3) -> float:
    """:func:`matched_scale` for ``networks`` networks of ``codec``: principal parts decoded from codes that
    ``sample_codes(k, generator)`` draws, noise from the codec's residual."""
    principal = codec.decode_principal(sample_codes(networks, generator))
    return matched_scale(principal, codec.residual_noise(networks, generator), spec, x, target, tolerance)
