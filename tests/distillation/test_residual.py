"""Matching the residual's scale: the disagreement statistic on hand-worked ensembles, and the root found
where the answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from apd.distillation.codec import fit_codec
from apd.distillation.residual import MAX_SCALE, match_residual_scale, mean_mutual_information
from apd.nets import ParamSpec, mlp

LINEAR = ParamSpec.from_module(mlp([2, 2]))  # logits = W x + b; flat θ = (W row-major, b)


def _bias_only(*biases: tuple[float, float]) -> torch.Tensor:
    """Networks whose logits are their biases whatever the input (W = 0)."""
    return torch.tensor([[0.0, 0.0, 0.0, 0.0, *b] for b in biases])


def test_mean_mutual_information_hand_cases():
    x = torch.randn(5, 2)
    # Two networks sure of opposite classes: H[p̄] = log 2, each H[p_k] ≈ 0.
    assert mean_mutual_information(LINEAR, _bias_only((30.0, -30.0), (-30.0, 30.0)), x) == pytest.approx(
        math.log(2), abs=1e-6)
    # Identical networks never disagree.
    assert mean_mutual_information(LINEAR, _bias_only((1.0, 0.0), (1.0, 0.0)), x) == pytest.approx(0.0, abs=1e-6)
    # p₁ ≈ (1, 0), p₂ = (½, ½): p̄ = (¾, ¼), I = H(¾, ¼) − ½·log 2.
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) - 0.5 * math.log(2)
    assert mean_mutual_information(LINEAR, _bias_only((30.0, -30.0), (0.0, 0.0)), x) == pytest.approx(
        expected, abs=1e-6)


@pytest.fixture
def setting():
    """A subspace codec with residual for a 4-8-3 network, Gaussian codes, and inputs."""
    spec = ParamSpec.from_module(mlp([4, 8, 3]))
    torch.manual_seed(0)
    samples = torch.randn(60, spec.numel) * 0.8 + torch.randn(spec.numel)
    codec = fit_codec("subspace", samples, rank=5, residual=True)

    def sample_codes(k: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randn(k, 5, generator=generator)

    return spec, codec, sample_codes, torch.randn(200, 4) * 2


def _information_at(alpha, spec, codec, sample_codes, x, seed):
    """The statistic the matcher sees at ``alpha`` for the draws a generator seeded ``seed`` makes."""
    rng = torch.Generator().manual_seed(seed)
    principal = codec.decode_principal(sample_codes(40, rng))
    return mean_mutual_information(spec, principal + alpha * codec.residual_noise(40, rng), x)


@pytest.mark.parametrize("alpha", [0.3, 1.4])
def test_match_recovers_the_scale_a_target_came_from(setting, alpha):
    spec, codec, sample_codes, x = setting
    target = _information_at(alpha, spec, codec, sample_codes, x, seed=7)
    found = match_residual_scale(codec, sample_codes, spec, x, target, 40, torch.Generator().manual_seed(7),
                                 tolerance=1e-4)
    assert found == pytest.approx(alpha, abs=1e-3)


def test_match_stops_at_the_ends_of_the_range(setting):
    spec, codec, sample_codes, x = setting
    without_residual = _information_at(0.0, spec, codec, sample_codes, x, seed=7)
    draw = torch.Generator().manual_seed(7)
    assert match_residual_scale(codec, sample_codes, spec, x, 0.5 * without_residual, 40, draw) == 0.0
    draw = torch.Generator().manual_seed(7)
    assert match_residual_scale(codec, sample_codes, spec, x, math.log(3), 40, draw) == MAX_SCALE


def test_codec_without_residual_is_refused():
    codec = fit_codec("subspace", torch.randn(10, 6), rank=2, residual=False)
    with pytest.raises(ValueError, match="no residual"):
        codec.residual_noise(3)
