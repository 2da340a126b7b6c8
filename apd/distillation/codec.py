"""The affine map between flat weight vectors θ ∈ R^D and the space a GAN is trained in.

Three codecs, all θ = μ + A·c (+ s ⊙ ε with ε ~ N(0, I)):

- ``identity``: c = θ (the paper: the GAN sees raw weight vectors);
- ``standardize``: A = diag(σ), c = (θ − μ)/σ per dimension;
- ``subspace``: A = U·diag(σ) with U ∈ R^{D×r} the top-r principal directions of the samples
  (orthonormal columns) and σ the samples' standard deviations along them, so that
  c = Uᵀ(θ − μ)/σ ∈ R^r has unit variance per coordinate; and an optional residual for the posterior's
  spread in the directions the GAN does not model: per dimension, s ⊙ ε with s_d = std of the part of
  the samples outside the subspace, or a Kronecker-factored Laplace draw projected off the subspace,
  (I − UUᵀ)·ρ (:mod:`apd.distillation.kronecker`, attached as ``kronecker``).

Parameters are buffers, so a codec is saved and loaded with the generator's state_dict.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from sklearn.utils.extmath import randomized_svd
from torch import Tensor, nn

from apd.distillation.kronecker import KroneckerResidual

CODECS = ("identity", "standardize", "subspace")


class WeightCodec(nn.Module):
    """θ = μ + A·c (+ s ⊙ ε); see the module docstring. Build with :func:`fit_codec` or :meth:`empty`."""

    def __init__(self, kind: str, dim: int, mean: Tensor | None = None, scale: Tensor | None = None,
                 basis: Tensor | None = None, residual: Tensor | None = None) -> None:
        super().__init__()
        if kind not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}, got {kind!r}")
        self.kind, self.dim = kind, dim
        empty = torch.empty(0)
        self.register_buffer("mean", empty if mean is None else mean.float())
        self.register_buffer("scale", empty if scale is None else scale.float())
        self.register_buffer("basis", empty if basis is None else basis.float())
        self.register_buffer("residual", empty if residual is None else residual.float())
        self.kronecker: KroneckerResidual | None = None

    @classmethod
    def empty(cls, kind: str, dim: int, rank: int, residual: bool) -> WeightCodec:
        """A codec of the right shapes to load a saved state_dict into."""
        zeros = torch.zeros(dim)
        if kind == "identity":
            return cls(kind, dim)
        if kind == "standardize":
            return cls(kind, dim, zeros, zeros.clone())
        return cls(kind, dim, zeros, torch.zeros(rank), torch.zeros(dim, rank), zeros.clone() if residual else None)

    @property
    def code_dim(self) -> int:
        """Size of the GAN's space: D, or r for the subspace codec."""
        return self.basis.shape[1] if self.kind == "subspace" else self.dim

    def encode(self, theta: Tensor) -> Tensor:
        """c for weight vectors θ [k, D]."""
        if self.kind == "identity":
            return theta
        centred = theta - self.mean
        return (centred if self.kind == "standardize" else centred @ self.basis) / self.scale

    @property
    def has_residual(self) -> bool:
        return bool(self.residual.numel()) or self.kronecker is not None

    def decode(self, code: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """θ = μ + A·c (+ the residual) for codes [k, code_dim]."""
        theta = self.decode_principal(code)
        if self.has_residual:
            theta.add_(self.residual_noise(len(code), generator))
        return theta

    def decode_principal(self, code: Tensor) -> Tensor:
        """μ + A·c for codes [k, code_dim]: the decoded vectors without the residual."""
        if self.kind == "identity":
            return code
        if self.kind == "standardize":
            return torch.addcmul(self.mean, code, self.scale)
        return torch.addmm(self.mean, code * self.scale, self.basis.t())

    def residual_noise(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k draws of the residual: s ⊙ ε with ε ~ N(0, I_D), or (I − UUᵀ)·ρ for Kronecker draws ρ."""
        if self.kronecker is not None:
            noise = self.kronecker.sample(k, generator)
            return noise - (noise @ self.basis) @ self.basis.t()
        if not self.residual.numel():
            raise ValueError("this codec has no residual")
        noise = torch.randn(k, self.dim, generator=generator, device=self.residual.device)
        return noise.mul_(self.residual)

    def scale_residual_(self, alpha: float) -> None:
        """Multiply the residual's draws by α from now on."""
        if self.kronecker is not None:
            self.kronecker.scale.mul_(alpha)
        else:
            self.residual.mul_(alpha)

    def stored_parameters(self) -> int:
        """Numbers the codec stores (counted in an artifact's size)."""
        return sum(b.numel() for b in self.buffers())


def fit_codec(kind: str, samples: Tensor, rank: int = 20, residual: bool = True, seed: int = 0) -> WeightCodec:
    """Fit a codec to samples [n, D] (float32, CPU).

    ``standardize``: per-dimension mean and std (a floor of 1e-8 keeps constant dimensions finite).
    ``subspace``: μ = sample mean; U = top-``rank`` right singular vectors of the centred samples by
    randomised SVD (Halko, Martinsson & Tropp, 2011, via scikit-learn); σ = std of Uᵀ(θ_i − μ); residual
    s_d = sqrt(mean_i ((θ_i − μ) − U Uᵀ(θ_i − μ))_d²).
    """
    n, dim = samples.shape
    if kind == "identity":
        return WeightCodec(kind, dim)
    mean = samples.mean(0)
    if kind == "standardize":
        return WeightCodec(kind, dim, mean, samples.std(0).clamp_min(1e-8))
    if not 1 <= rank <= min(n, dim):
        raise ValueError(f"subspace rank must be between 1 and min(samples, D) = {min(n, dim)}, got {rank}")
    centred = (samples - mean).numpy()
    _, _, vt = randomized_svd(centred, n_components=rank, n_iter=4, random_state=seed)
    basis = torch.from_numpy(np.ascontiguousarray(vt.T)).float()
    centred_t = torch.from_numpy(centred)
    coefficients = centred_t @ basis
    res = off_subspace_std(centred_t, coefficients, basis) if residual else None
    return WeightCodec(kind, dim, mean, coefficients.std(0).clamp_min(1e-8), basis, res)


def off_subspace_std(centred: Tensor, coefficients: Tensor, basis: Tensor, rows: int = 128) -> Tensor:
    """s_d = sqrt(mean_i ((θ_i − μ) − U c_i)_d²) for centred samples [n, D] with coefficients c = Uᵀ(θ − μ).

    Summed over blocks of ``rows`` samples in float64, so the residuals never take a second [n, D] array:
    at fcNN2's size (2,000 × 478,410) that array alone is 3.8 GB.
    """
    total = torch.zeros(centred.shape[1], dtype=torch.float64)
    for start in range(0, len(centred), rows):
        block = centred[start:start + rows] - coefficients[start:start + rows] @ basis.t()
        total += block.square_().sum(0, dtype=torch.float64)
    return total.div_(len(centred)).sqrt_().float()


def storage_in_samples(parameters: float, dim: int) -> float:
    """How many stored weight vectors of size D the same number of parameters would hold."""
    return parameters / dim if dim else math.nan
