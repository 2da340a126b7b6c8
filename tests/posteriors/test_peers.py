"""Kept samples, Stein thinning, SWAG and deep ensembles (apd.posteriors) on tiny nets and stores."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from apd.config import BaselineConfig
from apd.errors import DivergenceError
from apd.nets import ParamSpec, gradient_blocks, mlp, network, predict_probs
from apd.posteriors import SGLDSamples
from apd.posteriors.ensemble import DeepEnsemble, train_deep_ensemble
from apd.posteriors.kept import KeptSamples, chain_shares, evenly_spaced_rows, last_rows, random_rows
from apd.posteriors.stein import log_posterior_gradients, stein_rows, stein_thin
from apd.posteriors.swag import SWAGPosterior, choose_swag_lr, collect_swag_moments, fit_swag, swag_iterates
from apd.samplers.store import SampleStore
from tests.helpers import assert_gaussian_moments

SIZES = [4, 8, 3]
SPEC = ParamSpec.from_module(mlp(SIZES))
D = SPEC.numel  # 67


def toy_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs [n, 4] and labels from a fixed linear rule with 3 classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    rule = torch.tensor([[1.0, -1.0, 0.5], [0.5, 1.0, -1.0], [-1.0, 0.3, 1.0], [0.2, -0.4, 0.1]])
    return x, (x @ rule).argmax(1)


@pytest.fixture
def store(tmp_path):
    """30 rows of 67 weights from 3 chains of unequal length (12, 10, 8 rows), chain by chain."""
    g = torch.Generator().manual_seed(1)
    lengths = [12, 10, 8]
    with SampleStore.create(tmp_path / "samples.h5", SPEC, {"test": True}) as s:
        for chain, length in enumerate(lengths):
            s.append_many(0.3 * torch.randn(length, D, generator=g), steps=np.arange(length), chains=chain)
    with SampleStore.open(tmp_path / "samples.h5") as s:
        yield s


def assert_probs(probs: torch.Tensor, k: int, n: int) -> None:
    assert probs.shape == (k, n, SIZES[-1])
    torch.testing.assert_close(probs.sum(-1), torch.ones(k, n))


# ----------------------------------------------------------------------------------------- kept samples


def test_evenly_spaced_rows_are_the_centres_of_equal_parts():
    # p_i = ⌊(i + ½)·n/k⌋: 10 rows in 4 parts of 2.5, centres 1.25, 3.75, 6.25, 8.75
    assert evenly_spaced_rows(10, 4).tolist() == [1, 3, 6, 8]
    assert evenly_spaced_rows(5, 5).tolist() == [0, 1, 2, 3, 4]
    assert evenly_spaced_rows(9, 1).tolist() == [4] and evenly_spaced_rows(2, 1).tolist() == [1]
    assert evenly_spaced_rows(1, 1).tolist() == [0]  # the first stored sample only when it is the only one
    assert evenly_spaced_rows(3, 2).tolist() == [0, 2]  # or when more than half the chain is kept
    with pytest.raises(ValueError):
        evenly_spaced_rows(5, 6)


def test_evenly_spaced_rows_take_the_same_number_from_each_chain(store):
    chains = store.chains  # rows 0–11, 12–21, 22–29
    rows = evenly_spaced_rows(len(store), 9, chains)
    # chain of 12, 3 parts of 4: positions 2, 6, 10; of 10: 1, 5, 8; of 8: 1, 4, 6
    assert rows.tolist() == [2, 6, 10, 13, 17, 20, 23, 26, 28]
    assert evenly_spaced_rows(len(store), 3, chains).tolist() == [6, 17, 26]  # each chain's middle sample
    assert np.bincount(chains[evenly_spaced_rows(len(store), 7, chains)]).tolist() == [3, 2, 2]


def test_last_rows_are_each_chains_last_samples(store):
    chains = store.chains
    assert last_rows(len(store), 3, chains).tolist() == [11, 21, 29]
    assert last_rows(len(store), 7, chains).tolist() == [9, 10, 11, 20, 21, 28, 29]
    assert last_rows(10, 2).tolist() == [8, 9]


def test_random_rows_are_stratified_by_chain_distinct_and_seeded(store):
    chains, n = store.chains, len(store)
    draws = [random_rows(n, 7, torch.Generator().manual_seed(seed), chains) for seed in range(60)]
    for rows in draws:
        assert rows.tolist() == sorted(set(rows.tolist())) and rows.size == 7
        assert sorted(np.bincount(chains[rows], minlength=3).tolist()) == [2, 2, 3]  # ⌊7/3⌋ each, one extra
    extra = {int(np.argmax(np.bincount(chains[rows], minlength=3))) for rows in draws}
    assert extra == {0, 1, 2}  # the extra row's chain is drawn, not always the first
    assert len({tuple(rows) for rows in draws}) == len(draws)  # the subsets differ
    again = random_rows(n, 7, torch.Generator().manual_seed(5), chains)
    assert again.tolist() == draws[5].tolist()  # reproducible from the seed
    two = [random_rows(n, 2, torch.Generator().manual_seed(seed), chains) for seed in range(60)]
    assert all(np.bincount(chains[rows], minlength=3).max() == 1 for rows in two)  # never two of one chain
    pair = np.repeat([0, 1], 5)  # two chains (two modes): every 2-sample subset holds one of each
    assert all(np.bincount(pair[random_rows(10, 2, torch.Generator().manual_seed(seed), pair)]).tolist() == [1, 1]
               for seed in range(20))
    plain = random_rows(100, 20, torch.Generator().manual_seed(3))
    assert plain.tolist() == sorted(set(plain.tolist())) and plain.max() < 100


def test_chain_shares_follow_the_evenly_spaced_rule_and_refuse_short_chains():
    assert chain_shares(7, [12, 10, 8]) == [3, 2, 2]
    assert chain_shares(2, [1, 5, 5]) == [1, 1, 0]
    assert chain_shares(4, [1, 5, 5]) == [1, 2, 1]  # the extra skips a chain without a further row
    with pytest.raises(ValueError):
        chain_shares(7, [2, 2, 2])


def test_kept_samples_of_all_rows_are_the_store(store):
    n = len(store)
    kept = KeptSamples.from_store(store, evenly_spaced_rows(n, n))
    everything = store.read_all()
    torch.testing.assert_close(kept.vectors, everything, rtol=0, atol=0)
    assert kept.stored_parameters() == n * D == SGLDSamples(store).stored_parameters()
    x, _ = toy_data(25, 0)
    probs = kept.predict_probs(x, n)
    torch.testing.assert_close(probs, predict_probs(SPEC, everything, x), rtol=0, atol=0)
    sgld = SGLDSamples(store).predict_probs(x, n, torch.Generator().manual_seed(0))  # same rows, other order
    torch.testing.assert_close(probs.mean(0), sgld.mean(0))


def test_kept_samples_draws(store):
    rows = np.array([2, 7, 13, 20, 28])
    kept = KeptSamples.from_store(store, rows[::-1])
    assert kept.rows.tolist() == rows.tolist() and len(kept) == 5
    assert kept.stored_parameters() == 5 * D
    torch.testing.assert_close(kept.sample_weights(5), store.read(rows))
    torch.testing.assert_close(kept.sample_weights(50), store.read(rows))  # more asked: all 5, no repeats
    x, _ = toy_data(11, 0)
    assert_probs(kept.predict_probs(x, 50), 5, 11)
    subset = kept.sample_weights(3, torch.Generator().manual_seed(0))
    assert subset.shape == (3, D)
    matches = (subset[:, None, :] == kept.vectors[None]).all(-1)
    assert matches.sum(1).tolist() == [1, 1, 1] and matches.any(0).sum() == 3  # 3 distinct members
    with pytest.raises(ValueError):
        KeptSamples.from_store(store, [1, 1, 2])


# ------------------------------------------------------------------------------------------ Stein thinning


@pytest.mark.parametrize("preconditioner", ["med", "sclmed", "id", "2.5"])
def test_stein_thin_equals_the_package(preconditioner):
    """Every isotropic preconditioner the package has: the medians, the identity and a squared length scale."""
    thinning = pytest.importorskip("stein_thinning.thinning")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((80, 4)) * [1.0, 2.0, 0.5, 1.0] + 0.3
    gradient = -(x - 0.3) / np.array([1.0, 4.0, 0.25, 1.0])
    ours = stein_thin(x, gradient, 25, preconditioner, repeats=True)
    theirs = thinning.thin(x, gradient, 25, preconditioner=preconditioner)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize(("preconditioner", "message"), [
    ("smpcov", "the package's 'smpcov' needs a d×d matrix"), ("0", "must be positive, got 0.0")])
def test_stein_thin_refuses_a_preconditioner_it_does_not_have(preconditioner, message):
    x = np.random.default_rng(0).standard_normal((20, 3))
    with pytest.raises(ValueError, match=re.escape(message)):
        stein_thin(x, -x, 5, preconditioner)


def test_stein_thin_leaves_out_far_outliers():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(150, 3, generator=g, dtype=torch.float64)
    outliers = torch.tensor([[6.0, 0, 0], [-6.0, 0, 0], [0, 6.0, 0], [0, 0, -6.0], [5.0, 5.0, 0]],
                            dtype=torch.float64)
    points = torch.cat([target, outliers])
    picks = stein_thin(points, -points, 20)  # score of N(0, I)
    assert len(set(picks.tolist())) == 20
    assert picks.max() < 150


@pytest.mark.parametrize("conv, n_networks", [([], 3), ([3, 4], 25)])
def test_log_posterior_gradients_match_autograd(conv, n_networks):
    """Each row is the module's own gradient, for an MLP and for a CNN whose 25 networks fill two blocks of
    networks × images (``gradient_blocks``: 20 networks × 2 images from ``data_batch`` = 40); to float32
    rounding of sums over 30 images (the CNN's, each over 784 pixels, to 1e-4 relative)."""
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(2)  # the network's initial weights: the same whichever tests ran before
    if conv:
        net = network([784, 12, 3], conv)
        x = torch.rand(30, 784, generator=g)
        y = torch.randint(3, (30,), generator=g)
    else:
        net = mlp(SIZES)
        x, y = toy_data(40, 1)
    spec = ParamSpec.from_module(net)
    assert gradient_blocks(spec, x.shape[1], n_networks, 40) == ((20, 2) if conv else (1, 40))
    weights = spec.flatten(net) + 0.2 * torch.randn(n_networks, spec.numel, generator=g)
    prior_var = 0.1
    got = log_posterior_gradients(spec, weights, x, y, prior_var, data_batch=40)
    for k in range(n_networks):
        spec.load_into(net, weights[k])
        net.zero_grad()
        (len(y) * F.cross_entropy(net(x), y)).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
        torch.testing.assert_close(got[k], -grad - weights[k] / prior_var, rtol=1e-4 if conv else 1e-5, atol=1e-5)


def test_stein_rows_are_distinct_sorted_store_rows(store):
    x, y = toy_data(50, 2)
    rows = stein_rows(store, 6, x, y, prior_var=0.1, candidates=20)
    assert len(rows) == 6 and rows.tolist() == sorted(set(rows.tolist()))
    candidates = evenly_spaced_rows(len(store), 20)
    assert set(rows.tolist()) <= set(candidates.tolist())
    assert_probs(KeptSamples.from_store(store, rows).predict_probs(x, 6), 6, 50)


# -------------------------------------------------------------------------------------------------- SWAG


def test_swag_collector_recovers_a_known_gaussian():
    """Iterates drawn i.i.d. from N(m, Σ), Σ = diag(δ) + LLᵀ: the SWA mean is m, the diagonal is diag Σ,
    the low-rank part from the last K deviations (K large) is Σ, so SWAG's covariance is ½(diag Σ + Σ);
    and draws (K = 20) have the covariance s·(Σ_diag + D̂D̂ᵀ/(K − 1)) of the formula."""
    g = torch.Generator().manual_seed(0)
    d, t, rank = 5, 10_000, 2_500
    m = torch.linspace(-1, 1, d, dtype=torch.float64)
    low = torch.randn(d, 2, generator=g, dtype=torch.float64)
    sigma = torch.diag(torch.linspace(0.2, 1.0, d, dtype=torch.float64)) + low @ low.T
    iterates = m + torch.randn(t, d, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(sigma).T
    moments = collect_swag_moments(iter(iterates), rank=rank)
    assert moments.n == t and moments.deviations.shape == (rank, d)
    assert ((moments.mean - m).abs() / sigma.diag().sqrt()).max() < 4 / t**0.5
    torch.testing.assert_close(moments.variance, sigma.diag(), rtol=0.06, atol=0)
    torch.testing.assert_close(moments.sq_mean - moments.mean**2, moments.variance)

    spec = ParamSpec(("w",), ((d,),))
    swag = SWAGPosterior.from_moments(spec, moments)  # scale 0.5
    expected = 0.5 * (torch.diag(sigma.diag()) + sigma)
    whitened = torch.linalg.solve(torch.linalg.cholesky(expected), swag.covariance())
    whitened = torch.linalg.solve(torch.linalg.cholesky(expected), whitened.T)
    assert (torch.linalg.eigvalsh((whitened + whitened.T) / 2) - 1).abs().max() < 0.08

    # draws: those of the default rank K = 20 (the last 20 deviations: what collect_swag_moments(…, 20) keeps)
    swag20 = SWAGPosterior(spec, moments.mean, moments.variance, moments.deviations[-20:])
    draws = swag20.sample_weights(40_000, torch.Generator().manual_seed(1))
    assert draws.shape == (40_000, d)
    assert_gaussian_moments(draws, swag20.mean, swag20.covariance(), mean_tol_sd=0.03, cov_rel_tol=0.05)


def test_swag_deviations_are_the_last_k_from_the_running_mean():
    iterates = torch.randn(7, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    moments = collect_swag_moments(iterates, rank=3)
    running_means = iterates.cumsum(0) / torch.arange(1, 8, dtype=torch.float64)[:, None]
    torch.testing.assert_close(moments.deviations, (iterates - running_means)[-3:])
    torch.testing.assert_close(moments.mean, iterates.mean(0))
    torch.testing.assert_close(moments.variance, iterates.var(0, correction=0))


def test_swag_sampling_formula():
    """θ = θ̄ + √s·σ z₁ + √(s/(K−1))·D̂ z₂, with the same z as the generator gives."""
    spec = ParamSpec(("w",), ((6,),))
    g = torch.Generator().manual_seed(0)
    mean, var, dev = torch.randn(6, generator=g), torch.rand(6, generator=g), torch.randn(3, 6, generator=g)
    swag = SWAGPosterior(spec, mean, var, dev, scale=0.5)
    draws = swag.sample_weights(4, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    z1, z2 = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    torch.testing.assert_close(draws, mean + 0.5**0.5 * var.sqrt() * z1 + (0.5 / 2) ** 0.5 * z2 @ dev)
    assert swag.stored_parameters() == (2 + 3) * 6


def test_swag_at_zero_learning_rate_sits_at_the_sgd_weights():
    x, y = toy_data(60, 0)
    torch.manual_seed(0)
    net = mlp(SIZES)
    start = SPEC.flatten(net)
    swag = fit_swag(net, x, y, lr=0.0, epochs=4, rank=3, batch_size=10)
    torch.testing.assert_close(swag.mean, start, rtol=0, atol=1e-7)
    assert swag.std.max() < 1e-6 and swag.deviations.abs().max() < 1e-6
    torch.testing.assert_close(SPEC.flatten(net), start, rtol=0, atol=0)  # the caller's net is not touched


def test_swag_draws_and_predictions():
    x, y = toy_data(60, 0)
    torch.manual_seed(0)
    net = mlp(SIZES)
    iterates = list(swag_iterates(net, x, y, lr=0.1, epochs=3, batch_size=10, snapshots_per_epoch=2))
    assert len(iterates) == 6 and all(v.shape == (D,) for v in iterates)
    swag = fit_swag(net, x, y, lr=0.1, epochs=3, rank=20, batch_size=10, snapshots_per_epoch=2)
    assert swag.rank == 6 and swag.stored_parameters() == 8 * D
    torch.testing.assert_close(swag.mean, torch.stack(iterates).mean(0))
    assert swag.sample_weights(7).shape == (7, D)
    assert_probs(swag.predict_probs(x, 7, torch.Generator().manual_seed(0)), 7, 60)


def _swag_choice_problem() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A network to continue, its training data and validation data."""
    torch.manual_seed(0)
    return mlp(SIZES), *toy_data(60, 0), *toy_data(30, 1)


def test_choose_swag_lr_picks_the_lowest_validation_nll():
    net, x, y, x_val, y_val = _swag_choice_problem()
    choice = choose_swag_lr(net, x, y, x_val, y_val, [0.01, 0.3], epochs=3, rank=3, samples=10, batch_size=10)
    assert set(choice.val_nll) == {0.01, 0.3} and all(np.isfinite(list(choice.val_nll.values())))
    assert choice.lr == min(choice.val_nll, key=choice.val_nll.get)
    assert isinstance(choice.posterior, SWAGPosterior)


def test_a_diverging_swag_learning_rate_counts_as_infinite_nll_and_all_diverging_is_one_error():
    net, x, y, x_val, y_val = _swag_choice_problem()
    choice = choose_swag_lr(net, x, y, x_val, y_val, [0.01, 1e30], epochs=3, rank=3, samples=10, batch_size=10)
    assert choice.lr == 0.01 and choice.val_nll[1e30] == math.inf and math.isfinite(choice.val_nll[0.01])
    with pytest.raises(DivergenceError, match=re.escape("diverged at every learning rate in [1e+30, 1e+35]")):
        choose_swag_lr(net, x, y, x_val, y_val, [1e30, 1e35], epochs=3, rank=3, samples=10, batch_size=10)


# ------------------------------------------------------------------------------------------ deep ensemble


def test_deep_ensemble():
    x, y = toy_data(60, 0)
    x_val, y_val = toy_data(30, 1)
    cfg = BaselineConfig(epochs=2, batch_size=10, lr=0.1)
    seeds = [(4, 40), (5, 50), (6, 60)]
    vectors = train_deep_ensemble(SIZES, cfg, x, y, x_val, y_val, seeds)
    assert len(vectors) == 3 and all(v.shape == (D,) for v in vectors)
    assert not torch.equal(vectors[0], vectors[1])  # different seeds, different members
    again = train_deep_ensemble(SIZES, cfg, x, y, x_val, y_val, seeds)
    torch.testing.assert_close(torch.stack(again), torch.stack(vectors), rtol=0, atol=0)
    ensemble = DeepEnsemble(vectors, SPEC)
    assert len(ensemble) == 3 and ensemble.stored_parameters() == 3 * D
    torch.testing.assert_close(ensemble.sample_weights(10), torch.stack(vectors))  # more asked: all 3
    assert ensemble.sample_weights(2, torch.Generator().manual_seed(0)).shape == (2, D)
    assert_probs(ensemble.predict_probs(x_val, 3), 3, 30)
