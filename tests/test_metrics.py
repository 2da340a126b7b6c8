from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apd.metrics import (
    NLL_EPS,
    Stat,
    accuracy,
    auroc,
    brier,
    detection,
    ece,
    mean_of,
    mean_std,
    nll,
    reliability,
    std_of,
)

# Three inputs, two classes, all labelled 0: predictions right, wrong, right.
HAND_PROBS = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]])
HAND_LABELS = torch.tensor([0, 0, 0])

# Six inputs, four classes. With 2 bins, bin 0 (conf ≤ 0.5) holds the last two rows: confidences 0.4
# (right) and 0.45 (wrong); bin 1 holds the first four: 0.9 (right), 0.8 (wrong), 0.7 (right), 0.6 (wrong).
ECE_PROBS = torch.tensor([
    [0.9, 0.1, 0.0, 0.0],
    [0.8, 0.2, 0.0, 0.0],
    [0.3, 0.7, 0.0, 0.0],
    [0.6, 0.4, 0.0, 0.0],
    [0.4, 0.3, 0.2, 0.1],
    [0.1, 0.45, 0.25, 0.2],
])
ECE_LABELS = torch.tensor([0, 1, 1, 1, 0, 0])


def random_member_probs(k: int = 5, n: int = 200, c: int = 4, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, c, generator=generator).mul(2.0).softmax(-1)


def test_accuracy_nll_brier_by_hand():
    assert accuracy(HAND_PROBS, HAND_LABELS) == pytest.approx(2 / 3)
    assert nll(HAND_PROBS, HAND_LABELS) == pytest.approx(-(math.log(0.7) + math.log(0.2) + math.log(0.6)) / 3)
    # per input: 2·0.3², 2·0.8², 2·0.4² = 0.18 + 1.28 + 0.32
    assert brier(HAND_PROBS, HAND_LABELS) == pytest.approx(1.78 / 3)


def test_nll_is_finite_for_a_zero_probability_label():
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    assert nll(probs, torch.tensor([1, 0])) == pytest.approx((-math.log(NLL_EPS) + math.log(2)) / 2)


def test_brier_extremes():
    perfect = torch.eye(3)
    assert brier(perfect, torch.arange(3)) == 0.0
    assert brier(perfect, torch.tensor([1, 2, 0])) == pytest.approx(2.0)


def test_ece_and_reliability_with_two_bins_by_hand():
    # bin 0: acc 1/2, conf 0.425; bin 1: acc 2/4, conf 0.75  →  (2·0.075 + 4·0.25) / 6
    assert ece(ECE_PROBS, ECE_LABELS, bins=2) == pytest.approx(1.15 / 6)
    diagram = reliability(ECE_PROBS, ECE_LABELS, bins=2)
    np.testing.assert_allclose(diagram.edges, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(diagram.counts, [2, 4])
    np.testing.assert_allclose(diagram.confidence, [0.425, 0.75])
    np.testing.assert_allclose(diagram.accuracy, [0.5, 0.5])


def test_ece_with_one_bin_is_the_gap_between_accuracy_and_mean_confidence():
    mean_confidence = (0.9 + 0.8 + 0.7 + 0.6 + 0.4 + 0.45) / 6
    assert ece(ECE_PROBS, ECE_LABELS, bins=1) == pytest.approx(abs(0.5 - mean_confidence))


def test_bins_are_closed_on_the_right_and_empty_bins_are_nan():
    diagram = reliability(torch.tensor([[0.5, 0.3, 0.2]]), torch.tensor([0]), bins=2)
    np.testing.assert_array_equal(diagram.counts, [1, 0])
    assert diagram.confidence[0] == pytest.approx(0.5)
    assert np.isnan(diagram.confidence[1]) and np.isnan(diagram.accuracy[1])


def test_ece_is_zero_when_calibrated():
    # 4 inputs at confidence 0.75 with 3 right, 8 inputs at confidence 0.625 with 5 right
    rows = [[0.75, 0.25]] * 4 + [[0.625, 0.375]] * 8
    labels = [0, 0, 0, 1] + [0] * 5 + [1] * 3
    assert ece(torch.tensor(rows), torch.tensor(labels)) == pytest.approx(0.0, abs=1e-12)


def test_ece_matches_a_loop_over_bins_on_random_data():
    probs = random_member_probs(k=1, n=500, seed=1)[0]
    labels = torch.randint(0, 4, (500,), generator=torch.Generator().manual_seed(1))
    confidence, predicted = probs.double().max(-1)
    correct = (predicted == labels).double()
    expected = 0.0
    for b in range(15):
        in_bin = (confidence > b / 15) & (confidence <= (b + 1) / 15)
        if in_bin.any():
            gap = (correct[in_bin].mean() - confidence[in_bin].mean()).abs().item()
            expected += in_bin.sum().item() / 500 * gap
    assert ece(probs, labels) == pytest.approx(expected, rel=1e-9)
    assert expected > 0.01


@pytest.mark.parametrize("metric", [accuracy, nll, brier, ece])
def test_member_probs_equal_their_average(metric):
    probs = random_member_probs(seed=2)
    labels = torch.randint(0, 4, (200,), generator=torch.Generator().manual_seed(2))
    assert metric(probs, labels) == pytest.approx(metric(probs.mean(0), labels), rel=1e-12)


def test_classification_inputs_are_validated():
    with pytest.raises(ValueError, match="labels must lie in"):
        accuracy(HAND_PROBS, torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="labels must be integer"):
        nll(HAND_PROBS, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="probs must be"):
        brier(torch.tensor([0.5, 0.5]), torch.tensor([0]))
    with pytest.raises(ValueError, match="bins"):
        ece(HAND_PROBS, HAND_LABELS, bins=0)


def test_detection_of_perfectly_separated_and_reversed_scores():
    separated = detection([0.1, 0.2, 0.3], [0.7, 0.8])
    assert separated["auroc"] == 1.0
    assert separated["aupr_in"] == 1.0
    assert separated["aupr_out"] == 1.0
    assert separated["fpr95"] == 0.0
    reversed_ = detection([0.7, 0.8], [0.1, 0.2, 0.3])
    assert reversed_["auroc"] == 0.0
    assert reversed_["fpr95"] == 1.0  # catching 95 % of OOD means flagging every input


def test_auroc_by_counting_pairs_with_ties_as_half():
    # out 0.8 beats all 3; out 0.35 beats 0.1, ties 0.35, loses to 0.4 (1.5); out 0.5 beats all 3
    result = detection([0.1, 0.4, 0.35], [0.8, 0.35, 0.5])
    assert result["auroc"] == pytest.approx(7.5 / 9)


def test_aupr_in_and_out_differ_on_an_asymmetric_case():
    # ranked by score: 0.9 out, 0.5 in, 0.3 out, 0.1 out
    result = detection([0.5], [0.9, 0.3, 0.1])
    # OOD positive: precision 1, 2/3, 3/4 at each recalled OOD input, each worth recall 1/3
    assert result["aupr_out"] == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)  # 29/36
    # in-distribution positive with the negated score: the one ID input comes third, precision 1/3
    assert result["aupr_in"] == pytest.approx(1 / 3)
    assert result["auroc"] == pytest.approx(1 / 3)


def test_fpr95_by_hand():
    scores_in = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    scores_out = [0.15, 0.35] + [2.0] * 18
    # 19 of 20 OOD inputs (95 %) need the threshold s ≥ 0.35, which flags the 7 ID inputs 0.4 … 1.0
    assert detection(scores_in, scores_out)["fpr95"] == pytest.approx(0.7)
    # an ID input tied with the threshold is flagged as well
    assert detection([*scores_in, 0.35], scores_out)["fpr95"] == pytest.approx(8 / 11)
    # with the two low OOD scores at 0.15 and 0.12, TPR 0.95 needs s ≥ 0.15: 9 of 10 ID inputs flagged
    assert detection(scores_in, [0.15, 0.12] + [2.0] * 18)["fpr95"] == pytest.approx(0.9)


def test_detection_agrees_with_direct_formulas_on_random_data():
    rng = np.random.default_rng(3)
    scores_in = rng.normal(0.0, 1.0, 300)
    scores_out = rng.normal(1.0, 1.0, 120)
    result = detection(torch.tensor(scores_in, dtype=torch.float64), scores_out)

    pair_wins = (scores_out[:, None] > scores_in[None, :]).mean()
    assert result["auroc"] == pytest.approx(pair_wins, rel=1e-12)

    def average_precision(positive: np.ndarray, negative: np.ndarray) -> float:
        ranked_is_positive = np.concatenate([np.ones(positive.size), np.zeros(negative.size)])[
            np.argsort(-np.concatenate([positive, negative]), kind="stable")]
        hits = np.cumsum(ranked_is_positive)
        precision_at_hits = hits[ranked_is_positive == 1] / (np.flatnonzero(ranked_is_positive) + 1)
        return precision_at_hits.mean()

    assert result["aupr_out"] == pytest.approx(average_precision(scores_out, scores_in), rel=1e-12)
    assert result["aupr_in"] == pytest.approx(average_precision(-scores_in, -scores_out), rel=1e-12)

    threshold = np.sort(scores_out)[::-1][math.ceil(0.95 * scores_out.size) - 1]
    assert result["fpr95"] == pytest.approx((scores_in >= threshold).mean(), rel=1e-12)
    assert 0.3 < result["fpr95"] < 0.95


def test_detection_records_the_class_ratio():
    result = detection([0.1, 0.2, 0.3], [0.7, 0.8])
    assert (result["n_in"], result["n_out"]) == (3, 2)
    assert result["ratio_in_out"] == pytest.approx(1.5)


def test_detection_inputs_are_validated():
    with pytest.raises(ValueError, match="scores_in must be a non-empty"):
        detection([], [0.5])
    with pytest.raises(ValueError, match="scores_out has 1 non-finite"):
        detection([0.1, 0.2], [0.5, float("nan")])
    with pytest.raises(ValueError, match="scores_in must be a non-empty 1-D"):
        detection(torch.zeros(2, 2), [0.5])


def test_mean_std_uses_the_population_std():
    assert mean_std([1.0, 2.0, 3.0, 4.0]) == pytest.approx({"mean": 2.5, "std": math.sqrt(1.25)})
    assert mean_std([0.97]) == {"mean": 0.97, "std": 0.0}
    with pytest.raises(ValueError, match="non-empty"):
        mean_std([])


def test_auroc_alone_is_detections_area_ties_included():
    rng = np.random.default_rng(0)
    scores_in, scores_out = rng.integers(0, 6, 300).astype(float), rng.integers(2, 9, 200).astype(float)
    assert auroc(scores_in, scores_out)["auroc"] == pytest.approx(detection(scores_in, scores_out)["auroc"], abs=1e-12)
    assert auroc([0.0, 1.0], [1.0, 2.0])["auroc"] == 0.875  # pairs: 1 > 0, 1 = 1 (½), 2 > 0, 2 > 1


def test_a_stored_value_reads_back_as_a_stat():
    assert Stat.of(mean_std([1.0, 3.0])) == Stat(2.0, 1.0)
    assert Stat.of(4.5) == Stat(4.5) and Stat.of(4.5).spread == 0.0
    band = Stat.of({"mean": 2.0, "std": 1.0, "p5": 0.5, "p95": 3.5, "values": [1.0, 3.0]})
    assert band == Stat(2.0, 1.0, (0.5, 3.5))
    assert Stat.of(None) is None and Stat.of(band) is band
    assert (mean_of(band), std_of(band), mean_of(None), std_of(None)) == (2.0, 1.0, None, 0.0)
    with pytest.raises(TypeError, match="mean 'high' is not a number"):
        Stat.of({"mean": "high", "std": 0.1})
