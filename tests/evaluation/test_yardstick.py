"""The kept-samples yardstick (apd.evaluation.yardstick) on hand-made numbers and a tiny store."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apd.evaluation.protocol import EvaluationInputs, Judgement
from apd.evaluation.yardstick import (
    Reference,
    judge_rows,
    kept_curve,
    kept_for,
    kept_samples,
    kl_to_reference,
    margins_over_kept,
    mean_of,
    quality,
    reference_predictive,
    spread,
    std_of,
    summarise,
    worst_gap,
)
from apd.nets import ParamSpec, mlp, predict_probs
from apd.samplers.store import SampleStore

SPEC = ParamSpec.from_module(mlp([3, 5, 2]))


def test_worst_gap_is_the_largest_shortfall_and_undefined_with_a_missing_set():
    assert worst_gap({"a": 99.0, "b": 90.0}, {"a": 98.0, "b": 85.0}) == 5.0
    assert worst_gap({"a": 99.0, "b": 90.0}, {"a": 99.5, "b": 91.0}) == pytest.approx(-0.5)  # better everywhere
    assert worst_gap({"a": 99.0}, {"a": None}) is None


def test_kl_to_the_reference_by_hand():
    ref = Reference({}, {}, 0.0, torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64), 2)
    probs = torch.tensor([[0.25, 0.75], [0.9, 0.1]])
    expected = (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)) / 2  # second input: KL 0
    assert kl_to_reference(probs, ref) == pytest.approx(expected, rel=1e-6)
    assert kl_to_reference(ref.mean_probs, ref) == 0.0


def test_quality_and_summary_of_a_hand_made_judgement():
    ref = Reference({"noise": 99.0, "photos": 90.0}, {"noise": 95.0, "photos": 80.0}, 0.20,
                    torch.tensor([[0.5, 0.5]], dtype=torch.float64), 10)
    q = quality({"noise": 97.0, "photos": 89.5}, {"noise": 96.0, "photos": 70.0}, 0.25, 0.01, ref)
    assert q == pytest.approx({"bald_gap": 2.0, "max_prob_gap": 10.0, "nll_gap": 0.05, "kl": 0.01})
    detection = {"noise": {"bald": {"auroc": 0.97}, "max_prob": {"auroc": 0.96}},
                 "photos": {"bald": {"auroc": 0.895}, "max_prob": {"auroc": 0.70}}}
    judged = Judgement({"acc": 0.9, "nll": 0.25}, detection, torch.tensor([[0.5, 0.5]]), {}, {})
    summary = summarise(judged, ref)
    assert summary["bald_gap"] == pytest.approx(2.0) and summary["max_prob_gap"] == pytest.approx(10.0)
    assert summary["mean_bald_auroc"] == pytest.approx(93.25) and summary["kl"] == 0.0
    single = Judgement({"acc": 0.9, "nll": 0.25}, {name: {"bald": None, "max_prob": {"auroc": 0.9}}
                                                  for name in detection}, torch.tensor([[0.5, 0.5]]), {}, {})
    assert summarise(single, ref)["bald_gap"] is None and summarise(single, ref)["mean_bald_auroc"] is None


def test_margins_over_kept_samples_by_hand():
    # kept: evenly spaced 90 / 80 on BALD, 85 / 75 on max-prob, NLL 0.30; random subsets' mean and std
    even = {"nll": 0.30, "auroc": {"bald": {"a": 90.0, "b": 80.0}, "max_prob": {"a": 85.0, "b": 75.0}}}
    drawn = {"nll": {"mean": 0.28, "std": 0.01},
             "auroc": {"bald": {"a": {"mean": 91.0, "std": 0.5}, "b": {"mean": 79.0, "std": 2.0}},
                       "max_prob": {"a": {"mean": 86.0, "std": 1.0}, "b": {"mean": 74.0, "std": 0.0}}}}
    own = {"bald": {"a": 92.0, "b": 81.0}, "max_prob": {"a": 86.5, "b": 75.5}}
    found = margins_over_kept(own, 0.26, {"evenly_spaced": even, "random": drawn})
    a = found["auroc"]["bald"]["a"]
    assert a["over_kept"] == pytest.approx(2.0) and a["over_random"] == pytest.approx(1.0) and a["beats"]
    assert not found["auroc"]["bald"]["b"]["beats"]  # +1 and +2 over the kept, but the subsets' std is 2
    assert not found["auroc"]["max_prob"]["a"]["beats"]  # +0.5 over the random mean, std 1
    assert found["auroc"]["max_prob"]["b"]["beats"]  # std 0: both margins (+0.5, +1.5) strictly positive
    nll = found["nll"]  # lower is better: 0.30 − 0.26, 0.28 − 0.26
    assert nll["over_kept"] == pytest.approx(0.04) and nll["over_random"] == pytest.approx(0.02) and nll["beats"]
    assert (found["wins"], found["compared"]) == (3, 5)
    one = margins_over_kept({"bald": {"a": None, "b": None}, "max_prob": own["max_prob"]}, 0.26,
                            {"evenly_spaced": even, "random": drawn})
    assert one["auroc"]["bald"]["a"] is None and (one["wins"], one["compared"]) == (2, 3)  # no BALD: left out


@pytest.fixture
def store(tmp_path):
    """12 rows of a 3-5-2 net, two chains of 6."""
    g = torch.Generator().manual_seed(0)
    with SampleStore.create(tmp_path / "s.h5", SPEC, {}) as s:
        for chain in range(2):
            s.append_many(torch.randn(6, SPEC.numel, generator=g), steps=np.arange(6), chains=chain)
    with SampleStore.open(tmp_path / "s.h5") as s:
        yield s


def test_every_sample_kept_is_the_reference_itself(store):
    g = torch.Generator().manual_seed(1)
    inputs = EvaluationInputs(torch.randn(20, 3, generator=g), torch.randint(2, (20,), generator=g),
                              torch.randn(15, 3, generator=g), {"far": 4 * torch.randn(15, 3, generator=g)})
    mean_probs, n = reference_predictive(store, inputs.x_test, limit=100, chunk=5)
    assert n == 12
    torch.testing.assert_close(mean_probs, predict_probs(SPEC, store.read_all(), inputs.x_test).double().mean(0))
    # SGLD's own numbers as the reference: the whole store's judgement
    blank = Reference({}, {}, 0.0, mean_probs, n)
    whole = judge_rows(store, np.arange(12), inputs, "cpu", blank)
    from apd.evaluation.protocol import judge_probs

    judged = judge_probs(predict_probs(SPEC, store.read_all(), inputs.stacked("cpu")), inputs, ["bald", "max_prob"])
    ref = Reference({"far": 100 * judged.detection["far"]["bald"]["auroc"]},
                    {"far": 100 * judged.detection["far"]["max_prob"]["auroc"]}, whole["nll"], mean_probs, n)
    row = kept_samples(store, 12, inputs, ref, subsets=2, generator=torch.Generator().manual_seed(2))
    for summary in (row["evenly_spaced"], {k: v["mean"] for k, v in row["random"].items() if k != "auroc"}):
        assert summary["bald_gap"] == pytest.approx(0.0, abs=1e-9)
        assert summary["nll_gap"] == pytest.approx(0.0, abs=1e-6) and summary["kl"] == pytest.approx(0.0, abs=1e-7)
    assert row["random"]["kl"]["std"] == pytest.approx(0.0, abs=1e-7)
    curve = kept_curve(store, [5, 1, 2, 50, 2], inputs, ref, subsets=2, generator=torch.Generator().manual_seed(3))
    assert [r["k"] for r in curve] == [1, 2, 5]  # distinct, sorted, at most the store's size
    assert curve[0]["evenly_spaced"]["bald_gap"] is None  # one network: no BALD
    assert all(r["evenly_spaced"]["kl"] > 0 for r in curve)


def test_a_values_mean_and_std_are_its_spreads_or_itself_and_zero():
    keys = ("acc", "nll", "mean_bald_auroc", "max_prob_gap", "nll_gap", "kl")
    summaries = [{**dict.fromkeys(keys, 0.5), "bald_gap": 1.0, "auroc": {}},
                 {**dict.fromkeys(keys, 0.5), "bald_gap": 3.0, "auroc": {}}]
    drawn = spread(summaries)["bald_gap"]
    assert (mean_of(drawn), std_of(drawn)) == (2.0, 1.0)
    assert (mean_of(4.5), std_of(4.5)) == (4.5, 0.0)
    assert mean_of(None) is None


@pytest.mark.parametrize(("worth", "precision", "expected"), [
    (2.0, "float32", 2), (1.99, "float32", 2), (2.0000000001, "float32", 2),  # ⌈S⌉, forgiving rounding noise
    # D = 6,400: an int4 sample is 3,200 code bytes + 100 scales × 4 bytes = 3,600 of 25,600, 0.140625 samples;
    # 2 samples' worth buys 14.2 of them, so 15 reach it (14 would take 1.97, less than the method)
    (2.0, "int4", 15), (1.96875, "int4", 14),
    (2.0, "int8", 8), (4.0, "float16", 8),  # int8: 6,400 + 400 bytes, 0.265625 samples: 7.5 → 8
    (100.0, "int4", 50),  # at most the store's samples
])
def test_a_method_is_set_against_the_fewest_samples_at_its_precision_that_take_its_storage(worth, precision, expected):
    assert kept_for(worth, 6_400, precision, available=50) == expected
