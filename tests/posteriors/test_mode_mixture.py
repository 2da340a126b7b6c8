"""The mode mixture (apd.posteriors.modes): chain means, member allocation, draws, the matched scale."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apd.distillation.alignment import permute
from apd.distillation.kronecker import KroneckerResidual
from apd.distillation.residual import mean_mutual_information
from apd.nets import ParamSpec, mlp, predict_probs
from apd.posteriors.modes import ModeMixture, chain_means, prefer_aligned
from apd.samplers.store import SampleStore

SIZES = [4, 8, 3]
SPEC = ParamSpec.from_module(mlp(SIZES))
D = SPEC.numel


@pytest.fixture
def store(tmp_path):
    """Rows of two chains around two different centres, the second chain's rows first and interleaved."""
    g = torch.Generator().manual_seed(3)
    centres = torch.randn(2, D, generator=g)
    chains = np.array([1, 0, 1, 1, 0, 1, 0, 1, 1, 1])
    rows = centres[torch.from_numpy(chains)] + 0.1 * torch.randn(len(chains), D, generator=g)
    with SampleStore.create(tmp_path / "samples.h5", SPEC, {"test": True}) as s:
        s.append_many(rows, steps=np.arange(len(chains)), chains=chains)
    with SampleStore.open(tmp_path / "samples.h5") as s:
        yield s, rows, chains


def test_chain_means_are_each_chains_own_mean_and_share(store):
    s, rows, chains = store
    means, shares = chain_means(s)
    torch.testing.assert_close(means[0], rows[torch.from_numpy(chains == 0)].mean(0))
    torch.testing.assert_close(means[1], rows[torch.from_numpy(chains == 1)].mean(0))
    torch.testing.assert_close(shares, torch.tensor([0.3, 0.7]))


def test_chain_means_of_permuted_copies_undo_each_rows_permutation(tmp_path):
    """Rows of one chain are permuted copies of one network: the plain mean is no copy of it, the mean
    of the rows each permuted back (the inverse permutations) is the network itself."""
    g = torch.Generator().manual_seed(5)
    centre = torch.randn(D, generator=g)
    forward = torch.stack([torch.randperm(SIZES[1], generator=g) for _ in range(6)])
    rows = permute(centre.expand(6, D), SPEC, forward)
    with SampleStore.create(tmp_path / "samples.h5", SPEC, {"test": True}) as s:
        s.append_many(rows, steps=np.arange(6), chains=np.zeros(6, dtype=int))
    with SampleStore.open(tmp_path / "samples.h5") as s:
        plain, _ = chain_means(s)
        aligned, _ = chain_means(s, forward.argsort(dim=1))
    torch.testing.assert_close(aligned[0], centre)
    assert (plain[0] - centre).norm() > 0.3 * centre.norm()


def test_each_chain_keeps_the_mean_whose_network_has_the_lower_validation_nll():
    """Chain 0's aligned mean is a network that predicts the labels, its plain mean all zeros (uniform
    predictive, NLL log 3); chain 1 the other way round."""
    g = torch.Generator().manual_seed(6)
    good, x = torch.randn(D, generator=g), torch.randn(100, SIZES[0], generator=g)
    y = predict_probs(SPEC, good[None], x)[0].argmax(-1)  # the good network's own labels
    zeros = torch.zeros(D)
    use, losses = prefer_aligned(torch.stack([zeros, good]), torch.stack([good, zeros]), SPEC, x, y)
    assert use.tolist() == [True, False]
    assert losses["as_stored"][0] == pytest.approx(np.log(3)) == losses["aligned"][1]
    assert losses["aligned"][0] < np.log(3) and losses["as_stored"][1] == losses["aligned"][0]


def _spreads(n: int, seed: int = 0) -> list[KroneckerResidual]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, SIZES[0], generator=g)
    return [KroneckerResidual.fit(SIZES, 3, torch.randn(D, generator=g), x, 64.0, 1.0, g) for _ in range(n)]


def test_members_are_allocated_to_modes_in_proportion_to_their_shares():
    mixture = ModeMixture(torch.zeros(2, D), torch.tensor([0.25, 0.75]), _spreads(2), SPEC)
    assert mixture.modes_of(8).tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert mixture.modes_of(3).bincount(minlength=2).tolist() == [1, 2]


def test_draws_centre_on_each_modes_mean_and_vanish_at_scale_zero():
    means = torch.stack([torch.full((D,), -2.0), torch.full((D,), 3.0)])
    mixture = ModeMixture(means, torch.tensor([0.5, 0.5]), _spreads(2), SPEC)
    draws = mixture.sample_weights(4000, torch.Generator().manual_seed(1))
    modes = mixture.modes_of(4000)
    for m in (0, 1):
        spread = mixture.spreads[m].sample(4000, torch.Generator().manual_seed(2)).std(0)
        err = (draws[modes == m].mean(0) - means[m]).abs() / (spread / np.sqrt(2000))
        assert err.max() < 5  # every weight's mean within 5 standard errors
    for spread in mixture.spreads:
        spread.scale.fill_(0.0)
    torch.testing.assert_close(mixture.sample_weights(6), means[mixture.modes_of(6)])


def test_the_matched_scale_recovers_the_scale_that_set_the_target():
    g = torch.Generator().manual_seed(4)
    means = 0.5 * torch.randn(2, D, generator=g)
    mixture = ModeMixture(means, torch.tensor([0.5, 0.5]), _spreads(2, seed=5), SPEC)
    x = torch.randn(200, SIZES[0], generator=g)
    for spread in mixture.spreads:
        spread.scale.fill_(0.7)
    target = mean_mutual_information(SPEC, mixture.sample_weights(50, torch.Generator().manual_seed(9)), x)
    alpha = mixture.match_disagreement(x, target, 50, torch.Generator().manual_seed(9))
    assert alpha == pytest.approx(0.7, abs=2e-3)
    assert all(float(spread.scale) == pytest.approx(alpha, rel=1e-6) for spread in mixture.spreads)


def test_storage_counts_the_means_the_shares_and_every_factor(store):
    s, _, _ = store
    means, shares = chain_means(s)
    mixture = ModeMixture.fit(means, shares, SPEC, SIZES, 3, torch.randn(32, SIZES[0]), 32.0, 1.0,
                              torch.Generator().manual_seed(0))
    factors = sum(b.numel() for spread in mixture.spreads for b in spread.buffers())
    assert mixture.stored_parameters() == 2 * D + 2 + factors
    assert len(mixture.spreads) == 2


def test_means_and_spreads_must_agree_with_the_modes():
    with pytest.raises(ValueError, match="2 modes need means"):
        ModeMixture(torch.zeros(3, D), torch.tensor([0.5, 0.5]), _spreads(2), SPEC)
