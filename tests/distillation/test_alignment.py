from __future__ import annotations

import pytest
import torch

from apd.distillation.alignment import (
    Alignment,
    align_set,
    hidden_activations,
    hidden_widths,
    identity,
    match,
    match_activations,
    permute,
)
from apd.nets import ParamSpec, mlp, predict_probs


def spec_and_net(sizes: list[int], seed: int) -> tuple[ParamSpec, torch.Tensor]:
    torch.manual_seed(seed)
    net = mlp(sizes)
    spec = ParamSpec.from_module(net)
    return spec, spec.flatten(net)


def random_perms(spec: ParamSpec, n: int, seed: int) -> torch.Tensor:
    rng = torch.Generator().manual_seed(seed)
    return torch.stack([torch.cat([torch.randperm(w, generator=rng) for w in hidden_widths(spec)])
                        for _ in range(n)])


@pytest.mark.parametrize("sizes", [[5, 7, 3], [5, 7, 6, 3], [4, 6, 5, 8, 2]])
def test_permuting_hidden_units_leaves_the_function_unchanged(sizes):
    spec, theta = spec_and_net(sizes, 0)
    x = torch.randn(40, sizes[0])
    perms = random_perms(spec, 3, 1)
    permuted = permute(theta.repeat(3, 1), spec, perms)
    assert not torch.equal(permuted[0], theta)
    torch.testing.assert_close(predict_probs(spec, permuted, x), predict_probs(spec, theta[None], x).expand(3, -1, -1),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(permute(theta, spec, identity(spec)[0]), theta, atol=0, rtol=0)
    assert torch.equal(permute(theta, spec, perms[0]), permuted[0])  # one vector, one permutation


@pytest.mark.parametrize("sizes", [[6, 20, 4], [6, 16, 12, 4]])
def test_matching_a_permuted_copy_recovers_it_exactly(sizes):
    spec, theta = spec_and_net(sizes, 2)
    perms = random_perms(spec, 5, 3)
    copies = permute(theta.repeat(5, 1), spec, perms)
    found = match(copies, theta, spec)
    assert torch.equal(permute(copies, spec, found), theta.repeat(5, 1))
    assert torch.equal(match(theta[None], theta, spec), identity(spec))


@pytest.mark.parametrize("sizes", [[6, 20, 4], [6, 16, 12, 4]])
def test_activation_matching_recovers_a_permuted_copy_exactly(sizes):
    spec, theta = spec_and_net(sizes, 2)
    x = torch.randn(300, sizes[0], generator=torch.Generator().manual_seed(3))
    copy = permute(theta, spec, random_perms(spec, 1, 4)[0])
    found = match_activations(copy, theta, spec, x)
    torch.testing.assert_close(permute(copy, spec, found), theta, atol=0, rtol=0)
    for h_ref, h in zip(hidden_activations(theta, spec, x), hidden_activations(permute(copy, spec, found), spec, x),
                        strict=True):
        torch.testing.assert_close(h, h_ref)  # every unit computes what the reference's unit computes


@pytest.mark.parametrize("sizes", [[6, 20, 4], [6, 16, 12, 4]])
def test_aligning_a_set_brings_it_closer_to_its_mean_and_keeps_every_function(sizes):
    spec, theta = spec_and_net(sizes, 4)
    n = 30
    noisy = theta + 0.05 * torch.randn(n, spec.numel, generator=torch.Generator().manual_seed(5))
    samples = permute(noisy, spec, random_perms(spec, n, 6))
    result = align_set(samples, spec)
    assert result.perms.shape == (n, sum(hidden_widths(spec))) and result.perms.dtype == torch.long
    assert result.distance_after <= result.distance_before
    assert result.distance_after < 0.5 * result.distance_before  # the copies were far apart before
    aligned = permute(samples, spec, result.perms)
    torch.testing.assert_close(aligned.mean(0), result.reference, atol=1e-5, rtol=0)
    x = torch.randn(25, sizes[0])
    torch.testing.assert_close(predict_probs(spec, aligned, x), predict_probs(spec, samples, x), atol=1e-6, rtol=0)
    # every aligned copy is its noisy original in one common order
    common = match(theta[None], result.reference, spec)
    torch.testing.assert_close(aligned, permute(noisy, spec, common[0]), atol=0, rtol=0)


def test_unrelated_samples_are_never_made_farther_from_their_mean():
    spec, _ = spec_and_net([3, 8, 2], 7)
    samples = torch.randn(40, spec.numel, generator=torch.Generator().manual_seed(8))
    result = align_set(samples, spec)
    assert result.distance_after <= result.distance_before


def test_a_refused_alignment_leaves_every_row_of_the_store_as_stored(tmp_path):
    from apd.distillation.training import store_permutations
    from apd.samplers.store import SampleStore

    spec, theta = spec_and_net([3, 8, 2], 9)
    rows = permute(theta.expand(6, -1), spec, random_perms(spec, 6, 10))  # permuted copies of one network
    with SampleStore.create(tmp_path / "s.h5", spec, {}) as store:
        store.append_many(rows, steps=list(range(6)))
    fit = align_set(rows[:2], spec)
    with SampleStore.open(tmp_path / "s.h5") as store:
        aligned = store_permutations(store, spec, [0, 1], fit)  # rows 2 … 5 matched to the fit's mean
        assert not fit.refused and not torch.equal(aligned, identity(spec, 6))
        refused = Alignment(identity(spec, 2), rows[:2].mean(0), 1, 1.0, 1.0, refused=True)
        assert torch.equal(store_permutations(store, spec, [0, 1], refused), identity(spec, 6))
