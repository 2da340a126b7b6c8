from __future__ import annotations

import math

import pytest
import torch

from apd.uncertainty import ENSEMBLE_SCORES, SCORE_FUNCTIONS, bald, member_entropies, scores

KEYS = {"entropy", "variation_ratio", "max_prob", "bald", "model_variance"}


def binary_entropy(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def random_member_probs(k: int = 7, n: int = 50, c: int = 5, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, c, generator=generator).mul(2.0).softmax(-1)


def test_keys_and_single_functions_match_scores():
    probs = random_member_probs()
    result = scores(probs)
    assert set(result) == KEYS == set(SCORE_FUNCTIONS)
    for name, fn in SCORE_FUNCTIONS.items():
        torch.testing.assert_close(fn(probs), result[name], rtol=0, atol=0)
        assert result[name].shape == (50,)
        assert result[name].dtype == torch.float64


def test_named_scores_are_those_of_all_and_only_they_are_computed(monkeypatch):
    probs = random_member_probs()
    every = scores(probs)
    called = []
    monkeypatch.setattr("apd.uncertainty.model_variance", lambda p: called.append("model_variance"))
    monkeypatch.setattr("apd.uncertainty.variation_ratio", lambda p: called.append("variation_ratio"))
    named = scores(probs, ["max_prob", "bald"])
    assert list(named) == ["max_prob", "bald"]  # in SCORE_FUNCTIONS' order
    assert all(torch.equal(named[name], every[name]) for name in named)
    assert called == []
    with pytest.raises(ValueError, match="unknown score.*'bald_ood'"):
        scores(probs, ["bald_ood"])


def test_two_members_two_classes_by_hand():
    # member 1 says [0.8, 0.2], member 2 says [0.4, 0.6]; predictive p̄ = [0.6, 0.4]
    probs = torch.tensor([[[0.8, 0.2]], [[0.4, 0.6]]])
    result = {name: value.item() for name, value in scores(probs).items()}
    assert result["entropy"] == pytest.approx(binary_entropy(0.6), rel=1e-6)  # 0.6730
    # members vote class 0 and class 1: modal count 1 of 2
    assert result["variation_ratio"] == pytest.approx(0.5)
    assert result["max_prob"] == pytest.approx(0.4)
    # H[p̄] − ½(H[0.8, 0.2] + H[0.4, 0.6]) = ½(H(0.6) − H(0.8)) since H[0.4, 0.6] = H[p̄]
    assert result["bald"] == pytest.approx(0.5 * (binary_entropy(0.6) - binary_entropy(0.8)), rel=1e-5)
    assert result["bald"] == pytest.approx(0.0863, abs=1e-4)
    # per class: values {0.8, 0.4} and {0.2, 0.6}, each with population variance 0.2² = 0.04
    assert result["model_variance"] == pytest.approx(0.04, rel=1e-5)


def test_members_agreeing_on_the_class_but_not_the_probability():
    probs = torch.tensor([[[0.9, 0.1]], [[0.7, 0.3]]])  # p̄ = [0.8, 0.2]
    result = {name: value.item() for name, value in scores(probs).items()}
    assert result["variation_ratio"] == 0.0
    assert result["max_prob"] == pytest.approx(0.2)
    expected_bald = binary_entropy(0.8) - 0.5 * (binary_entropy(0.9) + binary_entropy(0.7))
    assert result["bald"] == pytest.approx(expected_bald, rel=1e-4)
    assert result["model_variance"] == pytest.approx(0.01, rel=1e-5)  # (0.1)² for both classes


def test_identical_members_have_no_epistemic_uncertainty():
    member = random_member_probs(k=1, n=20, c=4, seed=1)[0]
    result = scores(member.expand(6, -1, -1))
    assert torch.equal(result["variation_ratio"], torch.zeros(20, dtype=torch.float64))
    assert torch.equal(result["model_variance"], torch.zeros(20, dtype=torch.float64))
    torch.testing.assert_close(result["bald"], torch.zeros(20, dtype=torch.float64), rtol=0, atol=1e-12)
    # the aleatoric part remains
    assert (result["entropy"] > 0.1).all()


def test_uniform_predictive_has_entropy_log_c():
    probs = torch.full((3, 5, 10), 0.1)
    result = scores(probs)
    torch.testing.assert_close(result["entropy"], torch.full((5,), math.log(10), dtype=torch.float64), rtol=1e-6,
                               atol=1e-7)
    torch.testing.assert_close(result["max_prob"], torch.full((5,), 0.9, dtype=torch.float64), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("votes", "expected"),
    [([0, 0, 0, 1], 0.25), ([2, 2, 0, 2], 0.25), ([0, 1, 0, 1], 0.5), ([0, 1, 2, 2], 0.5),
     ([1, 1, 1, 1], 0.0)],
)
def test_variation_ratio_of_four_votes(votes, expected):
    # member k puts 0.6 on its vote, 0.2 on the two other classes
    probs = torch.full((4, 1, 3), 0.2)
    for member, vote in enumerate(votes):
        probs[member, 0, vote] = 0.6
    assert scores(probs)["variation_ratio"].item() == pytest.approx(expected)
    assert SCORE_FUNCTIONS["variation_ratio"](probs).item() == pytest.approx(expected)


def test_variation_ratio_is_not_one_minus_max_predictive():
    # 3 of 4 members lean mildly to class 0, one is sure of class 1: p̄ = [0.45, 0.55]
    probs = torch.tensor([[[0.6, 0.4]], [[0.6, 0.4]], [[0.6, 0.4]], [[0.0, 1.0]]])
    result = scores(probs)
    assert result["variation_ratio"].item() == pytest.approx(0.25)
    assert result["max_prob"].item() == pytest.approx(0.45)


def test_one_hot_members_are_finite():
    probs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])  # disagree, agree
    result = scores(probs)
    for value in result.values():
        assert torch.isfinite(value).all()
    torch.testing.assert_close(result["entropy"], torch.tensor([math.log(2), 0.0], dtype=torch.float64))
    torch.testing.assert_close(result["bald"], torch.tensor([math.log(2), 0.0], dtype=torch.float64))
    torch.testing.assert_close(result["variation_ratio"], torch.tensor([0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(result["max_prob"], torch.tensor([0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(result["model_variance"], torch.tensor([0.25, 0.0], dtype=torch.float64))


def test_bald_is_entropy_minus_mean_member_entropy_on_random_data():
    probs = random_member_probs(seed=2).double()
    member_entropy = -(probs * probs.log()).sum(-1).mean(0)
    mean_probs = probs.mean(0)
    predictive_entropy = -(mean_probs * mean_probs.log()).sum(-1)
    result = scores(probs)
    torch.testing.assert_close(result["entropy"], predictive_entropy)
    torch.testing.assert_close(result["bald"], predictive_entropy - member_entropy)


def test_bald_of_given_member_entropies_is_bald_and_they_must_match_the_members():
    """The members' entropies by hand (H[0.8, 0.2] and H[0.4, 0.6]); BALD from them is the one computed
    from the members alone, to the bit; entropies of other members are refused."""
    probs = torch.tensor([[[0.8, 0.2]], [[0.4, 0.6]]])
    entropies = member_entropies(probs)
    torch.testing.assert_close(entropies, torch.tensor([[binary_entropy(0.8)], [binary_entropy(0.6)]],
                                                       dtype=torch.float64))
    random = random_member_probs(seed=4)
    assert torch.equal(bald(random, member_entropies(random)), bald(random))
    with pytest.raises(ValueError, match="member entropies"):
        bald(random, member_entropies(random)[1:])


def test_scores_of_a_given_predictive_and_member_entropies_are_those_computed_and_must_match():
    """Scores from a p̄ and member entropies computed beforehand equal those computed from the members
    alone, to the bit; a predictive or entropies of other inputs are refused."""
    probs = random_member_probs(seed=5)
    given = scores(probs, mean_probs=probs.double().mean(0), member_entropy=member_entropies(probs))
    for name, value in scores(probs).items():
        assert torch.equal(given[name], value), name
    with pytest.raises(ValueError, match="predictive"):
        scores(probs, mean_probs=probs.double().mean(0)[1:])
    with pytest.raises(ValueError, match="member entropies"):
        scores(probs, member_entropy=member_entropies(probs)[:, 1:])


def test_model_variance_matches_a_direct_computation():
    probs = random_member_probs(seed=3).double()
    deviations = probs - probs.mean(0, keepdim=True)
    expected = deviations.square().mean(0).mean(-1)
    torch.testing.assert_close(scores(probs)["model_variance"], expected)


def test_scores_are_non_negative_and_bounded_on_random_data():
    k, c = 7, 5
    probs = random_member_probs(k=k, c=c, seed=4)
    result = scores(probs)
    for value in result.values():
        assert (value >= 0).all()
    assert (result["entropy"] <= math.log(c) + 1e-6).all()
    assert (result["bald"] <= result["entropy"] + 1e-6).all()
    assert (result["max_prob"] <= 1 - 1 / c + 1e-6).all()
    assert (result["variation_ratio"] <= 1 - math.ceil(k / c) / k + 1e-6).all()
    assert (result["variation_ratio"] > 0).any()  # the random members do disagree somewhere


def test_rejects_probabilities_without_a_member_axis():
    with pytest.raises(ValueError, match=r"\[K, N, C\]"):
        scores(torch.full((5, 3), 1 / 3))


@pytest.mark.cuda
def test_scores_on_cuda_match_cpu():
    probs = random_member_probs(seed=5)
    on_cpu = scores(probs)
    on_gpu = scores(probs.cuda())
    for name, value in on_gpu.items():
        assert value.device.type == "cuda"
        torch.testing.assert_close(value.cpu(), on_cpu[name], rtol=1e-5, atol=1e-6)


def test_members_closer_than_float32_resolves_still_disagree():
    """Two members whose probabilities differ by 2δ = 2e-6: their BALD, ≈ 2δ² = 2e-12, is far below what
    a float32 entropy difference resolves (≈ 4e-8 near log 2), yet computed in float64 it matches the
    closed form, as does the model variance.

    For p₁ = (½ + δ, ½ − δ), p₂ = (½ − δ, ½ + δ): model variance = δ², BALD = log 2 − H(½ + δ) ≈ 2δ²."""
    delta = 1e-6
    probs = torch.tensor([[[0.5 + delta, 0.5 - delta]], [[0.5 - delta, 0.5 + delta]]], dtype=torch.float64)
    result = scores(probs)
    assert result["model_variance"].item() == pytest.approx(delta**2, rel=1e-6)
    assert result["bald"].item() == pytest.approx(2 * delta**2, rel=1e-3)


def test_a_single_network_has_no_ensemble_scores():
    """One member has no disagreement to measure: scores gives NaN (n/a) for them, not a 0 that would read as
    certainty; entropy and max_prob are the network's own."""
    probs = random_member_probs(k=1, seed=6)
    result = scores(probs)
    assert list(result) == list(SCORE_FUNCTIONS)
    for name in ENSEMBLE_SCORES:
        assert result[name].shape == (50,) and result[name].dtype == torch.float64
        assert torch.isnan(result[name]).all(), name
    for name in ("entropy", "max_prob"):
        torch.testing.assert_close(result[name], SCORE_FUNCTIONS[name](probs), rtol=0, atol=0)
        assert torch.isfinite(result[name]).all()
