"""The GLM (linearised) predictive of a Laplace approximation: logit moments and their draws.

Linearising the network at θ̂, f(x; θ) ≈ f(x; θ̂) + J(x)(θ − θ̂), turns θ ~ N(θ̂, P⁻¹) into logits
f ~ N(f̄, Σ_f) with Σ_f = J P⁻¹ Jᵀ (Immer, Korzepa & Bauer 2021; Daxberger et al. 2021). Used by
:mod:`apd.posteriors.laplace` for ``laplace-glm``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from apd.nets import ParamSpec


def probit_predictive(f_mu: Tensor, f_var: Tensor) -> Tensor:
    """The probit approximation of E softmax(f), f ~ N(f̄, Σ_f): softmax(f̄ / √(1 + π/8 · diag Σ_f))
    (MacKay 1992; Daxberger et al. 2021, eq. for the GLM predictive)."""
    kappa = torch.rsqrt(1.0 + math.pi / 8.0 * f_var.diagonal(dim1=1, dim2=2))
    return torch.softmax(kappa * f_mu, dim=-1)


def glm_draws(f_mu: Tensor, f_var: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    """softmax(f̄ + L ε), L Lᵀ = Σ_f, ε ~ N(0, I) from ``generator``: [k, N, C]."""
    chol = torch.linalg.cholesky(f_var)
    eps = torch.randn(k, *f_mu.shape, generator=generator, device=f_mu.device, dtype=f_mu.dtype)
    return torch.softmax(f_mu + torch.einsum("ncd,knd->knc", chol, eps), dim=-1)


def kfac_glm_moments(spec: ParamSpec, theta: Tensor, precision, x: Tensor) -> tuple[Tensor, Tensor]:
    """Logits and J P⁻¹ Jᵀ of an :func:`apd.nets.mlp` under a KFAC posterior precision P, without J.

    A Linear layer's weight block of P is (Q_B ⊗ Q_A)(λ_B λ_Aᵀ + δ)(Q_B ⊗ Q_A)ᵀ (laplace-torch's
    ``KronDecomposed``), and the Jacobian of logit c with respect to that weight is g_c ⊗ a (g_c the
    gradient of f_c at the layer's output, a its input), so with g̃ = Q_Bᵀ g and ã = Q_Aᵀ a the block
    contributes Σ_ij g̃_ci g̃_di ã_j² / (λ_Bi λ_Aj + δ) to Cov(f_c, f_d); a bias block contributes
    Σ_i g̃_ci g̃_di / (λ_i + δ).
    """
    if precision.damping:
        raise ValueError("damped KFAC is not supported")
    weights = spec.unflatten(theta)
    layers = [(weights[w], weights[b]) for w, b in zip(spec.names[::2], spec.names[1::2], strict=True)]
    inputs, pre = [], []
    h = x
    for i, (w, b) in enumerate(layers):
        inputs.append(h)
        z = torch.addmm(b, h, w.t())
        pre.append(z)
        h = z.relu() if i < len(layers) - 1 else z
    f_mu = h
    n, c = f_mu.shape
    grad = torch.eye(c, dtype=x.dtype, device=x.device).expand(n, c, c)  # ∂f/∂z of the last layer
    f_var = torch.zeros(n, c, c, dtype=x.dtype, device=x.device)
    deltas = precision.deltas.expand(len(precision.eigenvalues))
    for i in reversed(range(len(layers))):
        (q_out, q_in), (l_out, l_in) = precision.eigenvectors[2 * i], precision.eigenvalues[2 * i]
        g = grad @ q_out
        a2 = (inputs[i] @ q_in).square()
        weight_var = a2 @ (torch.outer(l_out, l_in) + deltas[2 * i]).reciprocal().t()  # [N, out]
        f_var += torch.einsum("nci,ndi,ni->ncd", g, g, weight_var)
        (q_bias,), (l_bias,) = precision.eigenvectors[2 * i + 1], precision.eigenvalues[2 * i + 1]
        g = grad @ q_bias
        f_var += torch.einsum("nci,ndi,i->ncd", g, g, (l_bias + deltas[2 * i + 1]).reciprocal())
        if i:
            grad = (grad @ layers[i][0]) * (pre[i - 1] > 0).unsqueeze(1).to(x.dtype)
    return f_mu.detach(), f_var.detach()
