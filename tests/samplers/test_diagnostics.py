"""Convergence diagnostics (apd.samplers.rank_stats, .quantities and .diagnostics) against known answers: i.i.d.
chains, shifted chains, AR(1) chains, R-hat computed by hand from its formulas, the chain layout, and diagnose()
on a small network."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import ndtri
from scipy.stats import rankdata

from apd.nets import ParamSpec, mlp
from apd.samplers import diagnostics as diag
from apd.samplers.quantities import arrange_chains, chain_layout, compute_quantities
from apd.samplers.rank_stats import rank_diagnostics, summarise
from apd.samplers.store import SampleStore


def _ar1(rng: np.random.Generator, rho: float, chains: int, n: int, q: int = 1) -> np.ndarray:
    """Stationary AR(1) chains x_t = ρ x_{t−1} + √(1−ρ²) ε_t with unit marginal variance: [chains, n, q]."""
    x = np.empty((chains, n, q))
    x[:, 0] = rng.standard_normal((chains, q))
    noise = rng.standard_normal((chains, n, q)) * np.sqrt(1 - rho**2)
    for t in range(1, n):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x


# ------------------------------------------------------------------------------------------ statistics


def test_iid_chains_have_rhat_one_and_full_ess():
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((4, 1000, 50))
    stats = rank_diagnostics(draws)
    assert stats["rhat"].shape == stats["ess_bulk"].shape == stats["ess_tail"].shape == (50,)
    assert np.mean(np.abs(stats["rhat"] - 1) < 0.01) >= 0.96
    assert stats["rhat"].max() < 1.02
    assert abs(np.median(stats["ess_bulk"]) / 4000 - 1) < 0.2
    assert abs(np.median(stats["ess_tail"]) / 4000 - 1) < 0.2


def test_chains_with_shifted_means_have_large_rhat():
    rng = np.random.default_rng(1)
    draws = rng.standard_normal((4, 500, 20)) + np.arange(4).reshape(4, 1, 1)  # 1 sd apart
    stats = rank_diagnostics(draws)
    assert stats["rhat"].min() > 1.1
    summary = summarise(draws, stats)
    assert summary["frac_rhat_above_1.01"] == 1.0
    assert summary["ess_bulk_median"] < 400


def test_chains_with_different_scales_are_caught_by_the_folded_rhat():
    rng = np.random.default_rng(2)
    draws = rng.standard_normal((4, 1000, 5)) * np.array([1, 1, 1, 3]).reshape(4, 1, 1)
    assert rank_diagnostics(draws)["rhat"].min() > 1.05


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_bulk_ess_of_ar1_chains(rho):
    rng = np.random.default_rng(3)
    draws = _ar1(rng, rho, chains=4, n=2000, q=4)
    expected = draws.shape[0] * draws.shape[1] * (1 - rho) / (1 + rho)
    ess = rank_diagnostics(draws)["ess_bulk"]
    assert np.all(np.abs(ess / expected - 1) < 0.25), (ess, expected)


def _rhat_by_hand(theta: np.ndarray) -> float:
    """Split R-hat of rank-normalised draws (Vehtari et al. 2021, eqs. 1–4 and §4.2), max of bulk and folded."""
    half = theta.shape[1] // 2
    split = np.concatenate([theta[:, :half], theta[:, theta.shape[1] - half:]])  # [2M, N']

    def rhat_of(values: np.ndarray) -> float:
        s = values.size
        z = ndtri((rankdata(values.reshape(-1)).reshape(values.shape) - 3 / 8) / (s + 1 / 4))
        m, n = z.shape
        means = z.mean(axis=1)
        b = n / (m - 1) * np.sum((means - means.mean()) ** 2)
        w = np.mean(np.sum((z - means[:, None]) ** 2, axis=1) / (n - 1))
        var_plus = (n - 1) / n * w + b / n
        return float(np.sqrt(var_plus / w))

    return max(rhat_of(split), rhat_of(np.abs(split - np.median(split))))


@pytest.mark.parametrize("n_draws", [10, 11])
def test_rhat_matches_a_hand_computation(n_draws):
    rng = np.random.default_rng(4)
    theta = rng.standard_normal((3, n_draws, 3)) * np.array([1.0, 1.0, 2.0]).reshape(3, 1, 1)
    theta[2, :, 1] += 1.5  # one quantity whose bulk R-hat dominates
    theta[1, :4, 0] = theta[1, 4, 0]  # ties
    got = rank_diagnostics(theta)["rhat"]
    for q in range(3):
        assert got[q] == pytest.approx(_rhat_by_hand(theta[:, :, q]), abs=1e-6)


def test_rhat_is_nan_for_a_constant_quantity_and_summary_skips_it():
    rng = np.random.default_rng(5)
    draws = rng.standard_normal((4, 100, 3))
    draws[:, :, 1] = 1.0
    summary = summarise(draws)
    assert summary["n_constant"] == 1
    assert summary["rhat_max"] is not None and np.isfinite(summary["rhat_max"])
    assert np.isnan(rank_diagnostics(draws)["rhat"][1])


# ------------------------------------------------------------------------------------------- layout


def test_chain_layout_truncates_to_the_shortest_chain_and_thins_evenly():
    ids = np.array([0] * 10 + [1] * 7 + [2] * 12)
    rng = np.random.default_rng(6)
    rng.shuffle(ids)  # interleaved chains keep their row order
    layout = chain_layout(ids)
    assert (layout.chains, layout.draws, layout.pseudo_chains) == (3, 7, False)
    for c in range(3):
        assert np.all(ids[layout.rows[c]] == c)
        assert np.array_equal(layout.rows[c], np.flatnonzero(ids == c)[:7])
    thinned = chain_layout(ids, max_draws=4)
    assert thinned.draws == 4
    assert np.array_equal(thinned.rows[:, [0, -1]], layout.rows[:, [0, -1]])  # first and last kept
    assert np.array_equal(thinned.rows, layout.rows[:, [0, 2, 4, 6]])

    draws = np.arange(len(ids) * 2).reshape(-1, 2)
    arranged = arrange_chains(ids, draws, max_draws=4)
    assert arranged.shape == (3, 4, 2)
    assert np.array_equal(arranged, draws[thinned.rows])


def test_one_chain_is_split_into_pseudo_chains():
    layout = chain_layout(np.zeros(103, dtype=np.int32))
    assert (layout.chains, layout.draws, layout.pseudo_chains) == (4, 25, True)
    assert np.array_equal(layout.rows.reshape(-1), np.arange(100))  # consecutive pieces
    arranged = arrange_chains(np.zeros(103), np.arange(103.0), max_draws=5)
    assert arranged.shape == (4, 5, 1)
    assert np.array_equal(arranged[1, :, 0], [25, 31, 37, 43, 49])


def test_too_few_draws_is_a_clear_error():
    with pytest.raises(ValueError, match="too few samples"):
        chain_layout(np.zeros(12))


# ---------------------------------------------------------------------------------------- diagnose


@pytest.fixture(scope="module")
def tiny_problem():
    torch.manual_seed(0)
    net = mlp([4, 5, 3])
    spec = ParamSpec.from_module(net)
    x = torch.randn(120, 4)
    y = net(x).argmax(1)
    flip = torch.rand(120) < 0.2
    y[flip] = torch.randint(0, 3, (int(flip.sum()),))
    return spec, spec.flatten(net), x[:60], y[:60], x[60:], y[60:]


def _draws(centre: torch.Tensor, n: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return centre + shift + 0.3 * torch.randn(n, len(centre), generator=gen)


def test_diagnose_same_distribution_chains(tiny_problem):
    spec, centre, x_val, y_val, x_train, y_train = tiny_problem
    weights = [_draws(centre, 400, 1), _draws(centre, 430, 2)]
    summary = diag.diagnose(spec, weights, x_val, y_val, x_train, y_train, max_draws=None)
    assert (summary["chains_used"], summary["draws_per_chain"], summary["pseudo_chains"]) == (2, 400, False)
    assert set(summary["families"]) == {"function", "log_lik", "weight_pcs"}
    function = summary["families"]["function"]
    assert function["quantities"] == 60
    assert function["rhat_median"] < 1.005
    assert function["frac_rhat_above_1.05"] == 0.0
    assert function["ess_bulk_median"] > 600
    assert summary["families"]["weight_pcs"]["quantities"] == 5
    assert summary["families"]["log_lik"]["rhat_max"] < 1.02
    assert summary["warning"] is None


def test_diagnose_shifted_chains_warns_and_names_rhat(tiny_problem, tmp_path):
    spec, centre, x_val, y_val, x_train, y_train = tiny_problem
    weights = torch.cat([_draws(centre, 300, 3), _draws(centre, 300, 4, shift=0.4)])
    chain_ids = np.repeat([0, 1], 300)
    figure = tmp_path / "diagnostics.png"
    summary = diag.diagnose(spec, weights, x_val, y_val, x_train, y_train, chain_ids=chain_ids,
                            max_draws=200, figure_path=figure)
    assert summary["draws_per_chain"] == 200
    assert summary["families"]["function"]["frac_rhat_above_1.01"] > 0.5
    assert summary["families"]["weight_pcs"]["rhat_max"] > 1.1
    assert summary["warning"] is not None and "R-hat > 1.01" in summary["warning"]
    assert figure.stat().st_size > 10_000


def test_diagnose_reads_a_single_chain_store_as_pseudo_chains(tiny_problem, tmp_path):
    spec, centre, x_val, y_val, x_train, y_train = tiny_problem
    rng = np.random.default_rng(7)
    weights = centre.numpy() + 0.3 * _ar1(rng, 0.9, 1, 400, len(centre))[0].astype(np.float32)
    with SampleStore.create(tmp_path / "samples.h5", spec, {}) as store:
        store.append_many(weights, steps=np.arange(400), chains=0)
    calls = []
    with SampleStore.open(tmp_path / "samples.h5") as store:
        def read_rows(rows):
            calls.append(len(rows))
            return store.read(rows)

        summary = diag.diagnose(spec, read_rows, x_val, y_val, x_train, y_train, chain_ids=store.chains,
                                max_draws=50, max_inputs=20)
        direct = diag.diagnose(spec, store, x_val, y_val, x_train, y_train, max_draws=50, max_inputs=20)
    assert sum(calls) == 200  # only the 4 × 50 draws are read
    assert (summary["chains_used"], summary["draws_per_chain"], summary["pseudo_chains"]) == (4, 50, True)
    assert summary["families"]["function"]["quantities"] == 20
    assert summary == direct
    # AR(1) with ρ = 0.9 thinned by 2: ESS ≈ 200 · (1 − 0.81)/(1 + 0.81) ≈ 21, far below 400
    assert summary["families"]["function"]["ess_bulk_median"] < 100
    assert "bulk ESS" in summary["warning"] and "pseudo-chains" in summary["warning"]


def test_streamed_pca_matches_the_cached_one_and_the_exact_components(tiny_problem):
    spec, centre, x_val, y_val, x_train, y_train = tiny_problem
    rng = np.random.default_rng(8)
    scales = np.r_[[3.0, 2.5, 2.0, 1.5, 1.2], np.full(len(centre) - 5, 0.1)]
    basis = np.linalg.qr(rng.standard_normal((len(centre), len(centre))))[0]
    weights = centre.numpy() + (rng.standard_normal((400, len(centre))) * scales) @ basis.T
    weights = torch.as_tensor(weights, dtype=torch.float32)
    ids = np.repeat([0, 1], 200)
    cached = compute_quantities(spec, weights, x_val, y_val, x_train, y_train, chain_ids=ids)
    streamed = compute_quantities(spec, weights, x_val, y_val, x_train, y_train, chain_ids=ids,
                                       cache_bytes=0)
    np.testing.assert_allclose(streamed.draws["weight_pcs"], cached.draws["weight_pcs"], rtol=1e-10, atol=1e-10)
    pcs = cached.draws["weight_pcs"].reshape(400, 5)
    centred = weights.double().numpy() - weights.double().numpy().mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    exact = u[:, :5] * s[:5]
    # the same components up to sign: |correlation| ≈ 1 column by column
    corr = np.abs(np.sum(pcs * exact, axis=0) / np.linalg.norm(pcs, axis=0) / np.linalg.norm(exact, axis=0))
    assert np.all(corr > 0.999), corr


def test_function_space_quantity_is_the_true_class_probability(tiny_problem):
    from apd.nets import predict_probs

    spec, centre, x_val, y_val, x_train, y_train = tiny_problem
    weights = _draws(centre, 16, 9)
    quantities = compute_quantities(spec, weights, x_val, y_val, x_train, y_train,
                                         chain_ids=np.repeat([0, 1], 8))
    probs = predict_probs(spec, weights, x_val)
    expected = probs[:, torch.arange(len(y_val)), y_val].double().numpy()
    np.testing.assert_allclose(quantities.draws["function"].reshape(16, -1), expected, rtol=1e-5)
    log_lik = torch.log(predict_probs(spec, weights, x_train)[:, torch.arange(len(y_train)), y_train]).mean(1)
    np.testing.assert_allclose(quantities.draws["log_lik"].reshape(16), log_lik.double().numpy(), rtol=1e-5)


def test_convergence_warning_thresholds():
    def summary(frac, ess):
        return {"pseudo_chains": False, "families": {"function": {
            "quantities": 100, "chains": 4, "draws": 500, "rhat_max": 1.2, "frac_rhat_above_1.01": frac,
            "ess_bulk_median": ess}}}

    assert diag.convergence_warning(summary(0.05, 400.0)) is None
    only_rhat = diag.convergence_warning(summary(0.06, 400.0))
    assert "6.0 %" in only_rhat and "ESS" not in only_rhat
    only_ess = diag.convergence_warning(summary(0.0, 399.0))
    assert "399" in only_ess and "R-hat >" not in only_ess
    both = diag.convergence_warning(summary(0.5, 50.0))
    assert "R-hat" in both and "ESS" in both and both.count(".") >= 1


def test_numpy_engine_agrees_with_arviz():
    rng = np.random.default_rng(10)
    cases = [rng.standard_normal((4, 101, 6)), _ar1(rng, 0.9, 2, 60, 4), _ar1(rng, -0.5, 1, 30, 3),
             rng.integers(0, 3, (3, 9, 5)).astype(float), (rng.standard_normal((4, 7, 4)) > 0).astype(float),
             rng.standard_normal((2, 5, 3)) + np.array([[[0.0, 0, 0]], [[4, 0, 0]]])]
    cases[0][:, :, 2] = 0.5  # constant
    cases[0][:2, :, 3] += 2.0  # shifted
    for draws in cases:
        arviz, fast = rank_diagnostics(draws), rank_diagnostics(draws, engine="numpy")
        for key in arviz:
            np.testing.assert_allclose(fast[key], arviz[key], rtol=1e-10, atol=1e-12, equal_nan=True,
                                       err_msg=f"{key} of draws {draws.shape}")
