"""Assertions shared by several test modules."""

from __future__ import annotations

import numpy as np
import torch


def assert_gaussian_moments(
    samples: np.ndarray | torch.Tensor,
    mean: np.ndarray | torch.Tensor,
    cov: np.ndarray | torch.Tensor,
    mean_tol_sd: float = 0.15,
    cov_rel_tol: float = 0.2,
) -> None:
    """Assert that ``samples`` [S, d] have the first two moments of 𝒩(mean, cov).

    Mean: |m̂ᵢ − μᵢ| ≤ mean_tol_sd·√Σᵢᵢ for every coordinate i.
    Covariance, in every direction at once: with Σ = LLᵀ (Cholesky) and the whitened sample covariance
    W = L⁻¹ Σ̂ L⁻ᵀ, require ‖W − I‖₂ ≤ cov_rel_tol, i.e. for every direction v the sample variance
    vᵀΣ̂v is within a factor 1 ± cov_rel_tol of vᵀΣv (so small-variance directions count as much as
    large ones, unlike a Frobenius norm of Σ̂ − Σ).
    """
    x = np.asarray(samples, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    sigma = np.asarray(cov, dtype=np.float64)
    assert x.ndim == 2 and x.shape[1] == mu.shape[0] == sigma.shape[0] == sigma.shape[1], (
        f"shapes do not match: samples {x.shape}, mean {mu.shape}, cov {sigma.shape}")

    mean_error_sd = np.abs(x.mean(axis=0) - mu) / np.sqrt(np.diag(sigma))
    assert mean_error_sd.max() <= mean_tol_sd, (
        f"sample mean off by {np.array2string(mean_error_sd, precision=3)} sd (tolerance {mean_tol_sd})")

    chol = np.linalg.cholesky(sigma)
    half_whitened = np.linalg.solve(chol, np.cov(x, rowvar=False))
    whitened = np.linalg.solve(chol, half_whitened.T).T
    ratios = np.linalg.eigvalsh((whitened + whitened.T) / 2)
    assert np.abs(ratios - 1).max() <= cov_rel_tol, (
        f"sample/true variance ratios along the principal directions {np.array2string(ratios, precision=3)} "
        f"(tolerance 1 ± {cov_rel_tol})")
