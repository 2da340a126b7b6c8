"""The Kronecker-factored Laplace residual: draws against the covariance they stand for, the Fisher
factors of a model simple enough to write them down, and the codec that carries them."""

from __future__ import annotations

import pytest
import torch

from apd.distillation.codec import fit_codec
from apd.distillation.kronecker import KroneckerResidual, fisher_factors
from apd.nets import ParamSpec, mlp
from tests.helpers import assert_gaussian_moments


def _spd(n: int, seed: int) -> torch.Tensor:
    m = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return m @ m.t() / n + 0.1 * torch.eye(n, dtype=torch.float64)


def _flat_order(n_in: int, n_out: int) -> list[int]:
    """Position in θ (weights row-major, then biases) of each entry of the layer matrix [out, in + 1]
    read row-major."""
    return [o * n_in + a if a < n_in else n_out * n_in + o for o in range(n_out) for a in range(n_in + 1)]


@pytest.mark.parametrize("rank", [3, 1])
def test_draws_have_the_kronecker_laplace_covariance(rank):
    """One 2 → 2 layer: vec(W) has covariance (N·G ⊗ A′ + λI)⁻¹, where A′ is A with every eigenvalue
    past the top ``rank`` replaced by their mean."""
    n_in, n_out, data_size, prior_precision = 2, 2, 10.0, 2.0
    a, g = _spd(n_in + 1, 0), _spd(n_out, 1)
    model = KroneckerResidual.from_factors([n_in, n_out], rank, [(a.float(), g.float())], data_size, prior_precision)
    eigenvalues, basis = torch.linalg.eigh(a)
    eigenvalues, basis = eigenvalues.flip(0), basis.flip(1)
    eigenvalues[rank:] = eigenvalues[rank:].mean()
    a_kept = basis @ torch.diag(eigenvalues) @ basis.t()
    precision = data_size * torch.kron(g, a_kept) + prior_precision * torch.eye(6, dtype=torch.float64)
    covariance = torch.linalg.inv(precision)
    order = _flat_order(n_in, n_out)
    expected = torch.empty_like(covariance)
    expected[torch.tensor(order)[:, None], torch.tensor(order)[None, :]] = covariance
    draws = model.sample(100_000, torch.Generator().manual_seed(2))
    assert_gaussian_moments(draws, torch.zeros(6), expected, mean_tol_sd=0.02, cov_rel_tol=0.03)


def test_fisher_factors_of_a_softmax_regression():
    """For logits W x + b: A = E[x̃ x̃ᵀ] exactly, and G = E_x[diag(p) − p pᵀ], the expectation of
    (p − e_y)(p − e_y)ᵀ over y ~ p (one label per input, so up to Monte-Carlo error)."""
    net = mlp([3, 4])
    spec = ParamSpec.from_module(net)
    theta = torch.randn(spec.numel, generator=torch.Generator().manual_seed(0))
    x = torch.randn(40_000, 3, generator=torch.Generator().manual_seed(1))
    [(a, g)] = fisher_factors([3, 4], theta, x, torch.Generator().manual_seed(2))
    augmented = torch.cat([x, torch.ones(len(x), 1)], 1)
    torch.testing.assert_close(a, augmented.t() @ augmented / len(x))
    spec.load_into(net, theta)
    with torch.no_grad():
        p = torch.softmax(net(x), -1)
    expected = (torch.diag_embed(p) - p[:, :, None] * p[:, None, :]).mean(0)
    torch.testing.assert_close(g, expected, atol=0.006, rtol=0)


def test_codec_carries_the_kronecker_residual_off_the_subspace():
    sizes = [5, 4, 3]
    spec = ParamSpec.from_module(mlp(sizes))
    samples = torch.randn(30, spec.numel, generator=torch.Generator().manual_seed(0))
    codec = fit_codec("subspace", samples, rank=3, residual=False)
    codec.kronecker = KroneckerResidual.fit(sizes, 2, codec.mean, torch.randn(200, 5), 200, 5.0,
                                            torch.Generator().manual_seed(1))
    noise = codec.residual_noise(50, torch.Generator().manual_seed(3))
    assert noise.shape == (50, spec.numel)
    torch.testing.assert_close(noise @ codec.basis, torch.zeros(50, 3), atol=1e-5, rtol=0)
    codec.scale_residual_(0.5)
    half = codec.residual_noise(50, torch.Generator().manual_seed(3))
    torch.testing.assert_close(half, 0.5 * noise)
    fresh = fit_codec("subspace", samples, rank=3, residual=False)
    fresh.kronecker = KroneckerResidual(sizes, 2)
    fresh.load_state_dict(codec.state_dict())
    torch.testing.assert_close(fresh.residual_noise(50, torch.Generator().manual_seed(3)), half)


def test_deeper_networks_get_one_factor_pair_per_layer():
    sizes = [6, 5, 4, 3]
    spec = ParamSpec.from_module(mlp(sizes))
    theta = torch.randn(spec.numel, generator=torch.Generator().manual_seed(0))
    factors = fisher_factors(sizes, theta, torch.randn(100, 6), torch.Generator().manual_seed(1))
    assert [(a.shape, g.shape) for a, g in factors] == [((7, 7), (5, 5)), ((6, 6), (4, 4)), ((5, 5), (3, 3))]
    model = KroneckerResidual.from_factors(sizes, 3, factors, 100, 1.0)
    draws = model.sample(4000, torch.Generator().manual_seed(2))
    assert draws.shape == (4000, spec.numel)
    # Every weight varies, and at most by the prior's variance 1/λ.
    variances = draws.var(0)
    assert bool((variances > 0).all()) and float(variances.max()) < 1.1
