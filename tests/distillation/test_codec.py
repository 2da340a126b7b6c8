from __future__ import annotations

import pytest
import torch

from apd.distillation.codec import WeightCodec, fit_codec, off_subspace_std


def test_identity_and_standardize_round_trip():
    torch.manual_seed(0)
    samples = torch.randn(50, 30) * torch.linspace(0.1, 3, 30) + 2.0
    assert torch.equal(fit_codec("identity", samples).encode(samples), samples)
    codec = fit_codec("standardize", samples)
    codes = codec.encode(samples)
    torch.testing.assert_close(codes.mean(0), torch.zeros(30), atol=1e-5, rtol=0)
    torch.testing.assert_close(codes.std(0), torch.ones(30), atol=1e-5, rtol=0)
    torch.testing.assert_close(codec.decode(codes), samples, atol=1e-5, rtol=1e-5)


def test_full_rank_subspace_without_residual_reproduces_samples():
    torch.manual_seed(1)
    samples = torch.randn(12, 40)
    codec = fit_codec("subspace", samples, rank=11, residual=False)  # 12 centred samples span 11 dimensions
    assert codec.code_dim == 11
    torch.testing.assert_close(codec.decode(codec.encode(samples)), samples, atol=1e-4, rtol=1e-4)


def test_subspace_recovers_a_known_low_dimensional_structure():
    """Samples μ + U·diag(σ)·c + s ⊙ ε with orthonormal U: the fit finds μ, span(U), σ and s."""
    torch.manual_seed(2)
    n, dim, rank = 4000, 60, 3
    mean = torch.randn(dim)
    basis, _ = torch.linalg.qr(torch.randn(dim, rank))
    sigma = torch.tensor([5.0, 3.0, 2.0])
    residual = torch.rand(dim) * 0.1 + 0.05
    samples = mean + (torch.randn(n, rank) * sigma) @ basis.t() + torch.randn(n, dim) * residual
    codec = fit_codec("subspace", samples, rank=rank, residual=True)
    torch.testing.assert_close(codec.mean, mean, atol=0.15, rtol=0)
    # Same subspace: the projector onto the fitted basis equals the true one.
    projector_error = (codec.basis @ codec.basis.t() - basis @ basis.t()).norm() / basis.norm()
    assert projector_error < 0.05
    torch.testing.assert_close(codec.scale, sigma, atol=0.0, rtol=0.06)
    torch.testing.assert_close(codec.residual, residual, atol=0.0, rtol=0.15)
    codes = codec.encode(samples)
    torch.testing.assert_close(codes.std(0), torch.ones(rank), atol=1e-3, rtol=0)


def test_the_residual_std_summed_block_by_block_is_the_hand_worked_one():
    """U = e₁: the part off the subspace is the second coordinate, 2, −2, 0, 0 → s = (0, √(8/4)); blocks of
    3 rows do not divide the 4 samples."""
    centred = torch.tensor([[1.0, 2.0], [-1.0, -2.0], [3.0, 0.0], [-3.0, 0.0]])
    basis = torch.tensor([[1.0], [0.0]])
    std = off_subspace_std(centred, centred @ basis, basis, rows=3)
    torch.testing.assert_close(std, torch.tensor([0.0, 2.0 ** 0.5]))


def test_decode_is_the_principal_part_plus_the_residual_noise():
    torch.manual_seed(3)
    codec = fit_codec("subspace", torch.randn(40, 25) * torch.linspace(0.5, 2, 25), rank=3, residual=True)
    codes = torch.randn(6, 3)
    expected = codec.decode_principal(codes) + codec.residual_noise(6, torch.Generator().manual_seed(4))
    torch.testing.assert_close(codec.decode(codes, torch.Generator().manual_seed(4)), expected)
    noise = codec.residual_noise(20000, torch.Generator().manual_seed(5))
    torch.testing.assert_close(noise.std(0), codec.residual, atol=0.0, rtol=0.03)  # s ⊙ ε has std s


def test_empty_codec_loads_a_fitted_state():
    samples = torch.randn(30, 20)
    fitted = fit_codec("subspace", samples, rank=4, residual=True)
    fresh = WeightCodec.empty("subspace", 20, 4, True)
    fresh.load_state_dict(fitted.state_dict())
    codes = torch.randn(5, 4)
    generator = torch.Generator().manual_seed(0)
    expected = fitted.decode(codes, torch.Generator().manual_seed(0))
    torch.testing.assert_close(fresh.decode(codes, generator), expected)


def test_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        fit_codec("subspace", torch.randn(5, 10), rank=6)
