"""The kept-samples yardstick (apd.evaluation.yardstick) on hand-made numbers and a tiny store."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apd.evaluation.kept_storage import kept_for
from apd.evaluation.protocol import EvaluationInputs, Judgement
from apd.evaluation.stability import reference_stability
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import (
    WIN_PERCENTILE,
    Reference,
    drawn_quality,
    function_gaps,
    judge_rows,
    kept_curve,
    kept_samples,
    kl_to_reference,
    margins_over_kept,
    percentile_rank,
    quality,
    ranks_over_kept,
    reference_predictive,
    reference_sums,
    spread,
    standing,
    summarise,
    wins_over_kept,
    worst_gap,
)
from apd.metrics import mean_of, nll, std_of
from apd.nets import ParamSpec, mlp, predict_probs
from apd.samplers.store import SampleStore
from apd.uncertainty import bald
from tests.helpers import RecordedBar

SPEC = ParamSpec.from_module(mlp([3, 5, 2]))


def test_worst_gap_is_two_sided_and_undefined_with_a_missing_set():
    assert worst_gap({"a": 99.0, "b": 90.0}, {"a": 98.0, "b": 85.0}) == 5.0
    assert worst_gap({"a": 99.0, "b": 90.0}, {"a": 99.5, "b": 91.0}) == pytest.approx(1.0)  # overshoot counts
    assert worst_gap({"a": 99.0, "b": 90.0}, {"a": 96.0, "b": 94.0}) == pytest.approx(4.0)  # above beats below
    assert worst_gap({"a": 99.0}, {"a": None}) is None


def test_kl_to_the_reference_by_hand():
    ref = torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64)
    probs = torch.tensor([[0.25, 0.75], [0.9, 0.1]])
    expected = (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)) / 2  # second input: KL 0
    assert kl_to_reference(probs, ref) == pytest.approx(expected, rel=1e-6)
    assert kl_to_reference(ref, ref) == 0.0


def test_function_gaps_on_the_test_and_the_ood_inputs_by_hand():
    half = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    ref = Reference({}, {}, 0.0, {"test": half, "far": half, "near": half},
                    {"test": torch.tensor([0.2], dtype=torch.float64), "far": torch.tensor([0.4], dtype=torch.float64),
                     "near": torch.tensor([0.0], dtype=torch.float64)}, 2)
    skewed = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    gaps = function_gaps({"test": half, "far": skewed, "near": half},
                         {"test": torch.tensor([0.5]), "far": torch.tensor([0.1]), "near": torch.tensor([0.1])}, ref)
    assert gaps["kl"] == 0.0 and gaps["kl_ood"] == pytest.approx(kl / 2)  # far: kl, near: 0, averaged
    assert gaps["input_bald_gap"] == pytest.approx(0.3)  # |0.5 − 0.2|
    assert gaps["input_bald_gap_ood"] == pytest.approx((0.3 + 0.1) / 2)  # |0.1 − 0.4|, |0.1 − 0|: two-sided


def test_percentile_rank_by_hand():
    # gaps of 4 subsets 1, 2, 3, 4; a method's gap 2: beats 3 and 4 (2 subsets), ties 2 (half): 2.5 of 4
    assert percentile_rank(2.0, [1.0, 2.0, 3.0, 4.0]) == 62.5
    assert percentile_rank(0.5, [1.0, 2.0, 3.0, 4.0]) == 100.0 and percentile_rank(5.0, [1.0, 2.0]) == 0.0
    assert percentile_rank(1.0, [1.0, 1.0]) == 50.0  # equal to every subset: the median
    # a method drawn like the subsets ranks above 95 in about 5 % of draws
    rng = np.random.default_rng(0)
    ranks = [percentile_rank(rng.normal(), rng.normal(size=200)) for _ in range(2000)]
    assert 0.03 < np.mean(np.asarray(ranks) >= WIN_PERCENTILE) < 0.07


def test_standing_needs_both_fixed_selections_and_the_95th_percentile():
    subsets = [float(v) for v in range(1, 201)]  # gaps 1 … 200
    won = standing(0.5, [2.0, 3.0], subsets)
    assert won["percentile"] == 100.0 and won["beats"] and won["band"] == pytest.approx([10.95, 190.05])
    assert not standing(0.5, [0.4, 3.0], subsets)["beats"]  # the evenly spaced samples do better
    ten = standing(10.0, [20.0, 30.0], subsets)  # beats 190 subsets, ties one: 190.5 / 200
    assert ten["percentile"] == 95.25 and ten["beats"]
    assert not standing(11.0, [20.0, 30.0], subsets)["beats"]  # 94.75
    assert standing(None, [1.0, 1.0], subsets) is None and standing(1.0, [None, 1.0], subsets) is None
    # a gap equal to every subset's, up to the 6 digits results keep (one network's BALD is 0 for all): a tie
    same = standing(0.98940123, [0.98940123, 0.98940123], [0.989401] * 200)
    assert same["percentile"] == 50.0 and not same["beats"]


def test_quality_and_summary_of_a_hand_made_judgement():
    half = {name: torch.tensor([[0.5, 0.5]], dtype=torch.float64) for name in ("test", "noise", "photos")}
    none = {name: torch.zeros(1, dtype=torch.float64) for name in half}
    ref = Reference({"noise": 99.0, "photos": 90.0}, {"noise": 95.0, "photos": 80.0}, 0.20, half, none, 10)
    function = {"kl": 0.01, "kl_ood": 0.02, "input_bald_gap": 0.03, "input_bald_gap_ood": 0.04}
    q = quality({"noise": 97.0, "photos": 89.5}, {"noise": 96.0, "photos": 70.0}, 0.25, function, ref)
    assert q == pytest.approx({"bald_gap": 2.0, "max_prob_gap": 10.0, "nll_gap": 0.05, **function})
    below = quality({"noise": 97.0, "photos": 89.5}, {"noise": 96.0, "photos": 70.0}, 0.15, function, ref)
    assert below["nll_gap"] == pytest.approx(0.05)  # two-sided: an NLL below SGLD's is as far from it
    detection = {"noise": {"bald": {"auroc": 0.97}, "max_prob": {"auroc": 0.96}},
                 "photos": {"bald": {"auroc": 0.895}, "max_prob": {"auroc": 0.70}}}
    judged = Judgement({"acc": 0.9, "nll": 0.25}, detection, torch.tensor([[0.5, 0.5]]), {}, {}, half, none)
    summary = summarise(judged, ref)
    assert summary["bald_gap"] == pytest.approx(2.0) and summary["max_prob_gap"] == pytest.approx(10.0)
    assert summary["mean_bald_auroc"] == pytest.approx(93.25) and summary["kl"] == 0.0 == summary["kl_ood"]
    assert summary["set_gaps"] == {"bald": pytest.approx({"noise": 2.0, "photos": 0.5}),
                                   "max_prob": pytest.approx({"noise": 1.0, "photos": 10.0})}
    single = Judgement({"acc": 0.9, "nll": 0.25}, {name: {"bald": None, "max_prob": {"auroc": 0.9}}
                                                  for name in detection}, torch.tensor([[0.5, 0.5]]), {}, {}, half,
                       none)
    assert summarise(single, ref)["bald_gap"] is None and summarise(single, ref)["mean_bald_auroc"] is None
    assert judged.set_aurocs("bald") == pytest.approx({"noise": 97.0, "photos": 89.5})
    assert judged.mean_auroc("bald") == pytest.approx(93.25) and math.isnan(single.mean_auroc("bald"))


def test_ranks_over_kept_samples_by_hand():
    # SGLD: BALD AUROC 85 on set a, NLL 0.25. Fixed selections: evenly spaced 83, last 88 (gaps 2, 3); NLL gaps
    # +0.02, +0.05. 200 random subsets: AUROCs 80 + i/16 (gaps |v − 85|), NLL gaps (i + 1)/1024, i = 0 … 199
    row = {"evenly_spaced": {"auroc": {"bald": {"a": 83.0}}, "nll_gap": 0.02},
           "last": {"auroc": {"bald": {"a": 88.0}}, "nll_gap": 0.05},
           "random": {"auroc": {"bald": {"a": {"values": [80.0 + i / 16 for i in range(200)]}}},
                      "nll_gap": {"values": [(i + 1) / 1024 for i in range(200)]}}}
    sgld, nll_gap = {"bald": {"a": 85.0}}, 2 / 1024
    found = ranks_over_kept({"bald": {"a": 0.25}}, nll_gap, row, sgld)
    a = found["auroc"]["bald"]["a"]  # gap 0.25: 7 subsets closer (i = 77 … 83), 2 as close (76, 84), 191 farther
    assert a["gap"] == 0.25 and a["fixed"] == [2.0, 3.0] and a["percentile"] == 96.0 and a["beats"]
    close = ranks_over_kept({"bald": {"a": 0.5}}, nll_gap, row, sgld)["auroc"]["bald"]["a"]
    assert close["percentile"] == 92.0 and not close["beats"]  # 15 closer, 2 as close: (183 + 1) / 200
    far = ranks_over_kept({"bald": {"a": 5.0}}, nll_gap, row, sgld)["auroc"]["bald"]["a"]
    assert far["gap"] == 5.0 and not far["beats"]  # farther than both fixed rows
    assert found["nll"]["percentile"] == 99.25 and found["nll"]["beats"]  # gap 2/1024: 1 smaller, 1 equal
    assert (found["wins"], found["compared"]) == (2, 2)
    own = {"set_gaps": {"bald": {"a": 0.25}}, "nll_gap": nll_gap}
    assert wins_over_kept(own, {"bald": {"a": 99.0}}, 0.3, row, sgld) == found  # gaps per draw: not of the mean
    # results written before gaps per draw: the gap of the runs' mean AUROC, the NLL gap as they stored it
    assert wins_over_kept({"nll_gap": nll_gap}, {"bald": {"a": 85.25}}, 0.3, row, sgld) == found


def test_a_methods_gaps_are_the_means_of_its_draws_gaps():
    # two draws with BALD AUROC 84 and 86 on set a against SGLD's 85, NLL 0.24 and 0.26 against 0.25: their
    # mean AUROC and NLL equal SGLD's, but each draw is 1 point and 0.01 nats away
    half = {"test": torch.tensor([[0.5, 0.5]], dtype=torch.float64)}
    ref = Reference({"a": 85.0}, {"a": 80.0}, 0.25, half, {"test": torch.zeros(1, dtype=torch.float64)}, 10)
    draws = [Judgement({"acc": 0.9, "nll": nll}, {"a": {"bald": {"auroc": auroc / 100}, "max_prob": {"auroc": 0.8}}},
                       torch.tensor([[0.5, 0.5]]), {}, {}, half, {"test": torch.zeros(1)})
             for auroc, nll in ((84.0, 0.24), (86.0, 0.26))]
    own = drawn_quality([summarise(d, ref) for d in draws])
    assert own["bald_gap"] == pytest.approx(1.0) and own["set_gaps"]["bald"]["a"] == pytest.approx(1.0)
    assert own["nll_gap"] == pytest.approx(0.01) and own["max_prob_gap"] == pytest.approx(0.0)


def test_margins_over_kept_samples_by_hand():  # the rule of results written before percentile ranks
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


def test_the_reference_taken_in_several_chunks_counts_its_samples_on_a_bar(store, monkeypatch):
    """Twelve samples five at a time move one bar to 12 (their own predictions, a block each, make none) and sum
    as they do without it; taken in one chunk they make no bar."""
    g = torch.Generator().manual_seed(1)
    inputs = EvaluationInputs(torch.randn(20, 3, generator=g), torch.randint(2, (20,), generator=g),
                              torch.randn(15, 3, generator=g), {"far": 4 * torch.randn(15, 3, generator=g)})
    monkeypatch.setattr(RecordedBar, "made", [])
    counted = reference_sums(StoredPredictions(store, inputs.stacked("cpu"), "cpu", progress=RecordedBar), inputs,
                             limit=100, chunk=5)
    assert [(bar.desc, bar.total, bar.n) for bar in RecordedBar.made] == [("SGLD's reference", 12, 12)]
    plain = reference_sums(StoredPredictions(store, inputs.stacked("cpu"), "cpu"), inputs, limit=100, chunk=5)
    assert all(torch.equal(counted.probs[name], plain.probs[name]) for name in plain.probs)
    reference_sums(StoredPredictions(store, inputs.stacked("cpu"), "cpu", progress=RecordedBar), inputs, limit=100,
                   chunk=20)
    assert len(RecordedBar.made) == 1


def test_every_sample_kept_is_the_reference_itself(store):
    g = torch.Generator().manual_seed(1)
    inputs = EvaluationInputs(torch.randn(20, 3, generator=g), torch.randint(2, (20,), generator=g),
                              torch.randn(15, 3, generator=g), {"far": 4 * torch.randn(15, 3, generator=g)})
    stored = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
    predictive, information, n = reference_predictive(reference_sums(stored, inputs, limit=100, chunk=5))
    assert n == 12 and set(predictive) == set(information) == {"test", "far"}
    for name, x in (("test", inputs.x_test), ("far", inputs.ood["far"])):
        probs = predict_probs(SPEC, store.read_all(), x).double()
        torch.testing.assert_close(predictive[name], probs.mean(0))
        torch.testing.assert_close(information[name], bald(probs))
    # SGLD's own numbers as the reference: the whole store's judgement
    blank = Reference({}, {}, 0.0, predictive, information, n)
    whole = judge_rows(stored, np.arange(12), inputs, blank)
    from apd.evaluation.protocol import judge_probs

    judged = judge_probs(predict_probs(SPEC, store.read_all(), inputs.stacked("cpu")), inputs, ["bald", "max_prob"])
    ref = Reference({"far": 100 * judged.detection["far"]["bald"]["auroc"]},
                    {"far": 100 * judged.detection["far"]["max_prob"]["auroc"]}, whole["nll"], predictive, information,
                    n)
    row = kept_samples(stored, 12, inputs, ref, subsets=2, generator=torch.Generator().manual_seed(2))
    drawn = {k: v["mean"] for k, v in row["random"].items() if k not in ("auroc", "set_gaps")}
    for summary in (row["evenly_spaced"], row["last"], drawn):
        assert summary["bald_gap"] == pytest.approx(0.0, abs=1e-9)
        assert summary["nll_gap"] == pytest.approx(0.0, abs=1e-6) and summary["kl"] == pytest.approx(0.0, abs=1e-7)
        for key in ("kl_ood", "input_bald_gap", "input_bald_gap_ood"):
            assert summary[key] == pytest.approx(0.0, abs=1e-6)
    assert row["random"]["kl"]["std"] == pytest.approx(0.0, abs=1e-7) and len(row["random"]["kl"]["values"]) == 2
    curve = kept_curve(stored, [5, 1, 2, 50, 2], inputs, ref, subsets=2, generator=torch.Generator().manual_seed(3))
    assert [r["k"] for r in curve] == [1, 2, 5]  # distinct, sorted, at most the store's size
    assert curve[0]["evenly_spaced"]["bald_gap"] is None  # one network: no BALD
    assert curve[0]["evenly_spaced"]["input_bald_gap"] > 0  # but SGLD disagrees where it has none
    assert all(r["evenly_spaced"]["kl"] > 0 and r["last"]["kl"] > 0 for r in curve)
    assert all(r["random"]["kl"]["p5"] <= r["random"]["kl"]["mean"] <= r["random"]["kl"]["p95"] for r in curve)


def test_a_values_mean_and_std_are_its_spreads_or_itself_and_zero():
    keys = ("acc", "nll", "mean_bald_auroc", "max_prob_gap", "nll_gap", "kl", "kl_ood", "input_bald_gap",
            "input_bald_gap_ood")
    summaries = [{**dict.fromkeys(keys, 0.5), "bald_gap": 1.0, "auroc": {}, "set_gaps": {}},
                 {**dict.fromkeys(keys, 0.5), "bald_gap": 3.0, "auroc": {}, "set_gaps": {}}]
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


def test_the_references_chain_sums_split_its_chains_into_halves_whose_numbers_are_their_own(store):
    """The yardstick's reference of a two-chain store: its predictive pools both chains' sums, and the
    stability's halves are one chain each, each half's NLL that of its own chain's samples."""
    g = torch.Generator().manual_seed(3)
    inputs = EvaluationInputs(torch.randn(20, 3, generator=g), torch.randint(2, (20,), generator=g),
                              torch.randn(15, 3, generator=g), {"far": 4 * torch.randn(15, 3, generator=g)})
    stored = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
    sums = reference_sums(stored, inputs, limit=100)
    assert sums.ids == [0, 1] and sums.counts.tolist() == [6, 6]
    assert {name: (where.start, where.stop) for name, where in inputs.parts().items()} == {
        "test": (0, 20), "in": (20, 35), "far": (35, 50)}
    stability = reference_stability(sums, inputs.y_test, seed=0)
    weights, chains = store.read_all(), store.chains
    for half, (chain,) in zip(stability["split_half"]["numbers"], stability["split_half"]["halves"], strict=True):
        probs = predict_probs(SPEC, weights[torch.as_tensor(chains == chain)], inputs.x_test).double().mean(0)
        # the stored predictions are of every set stacked in one batch, these of the test set alone: float32
        # rounding apart on some CPUs
        assert half["nll"] == pytest.approx(nll(probs, inputs.y_test), rel=1e-6)
    whole = predict_probs(SPEC, weights, inputs.x_test).double().mean(0)
    assert stability["numbers"]["nll"] == pytest.approx(nll(whole, inputs.y_test), rel=1e-6)
    assert stability["split_half"]["nll_gap"] == pytest.approx(
        abs(stability["split_half"]["numbers"][0]["nll"] - stability["split_half"]["numbers"][1]["nll"]))


def test_ensembles_stacked_into_reused_buffers_are_judged_as_in_fresh_memory(store):
    """Subsets judged one after another in one size's buffers give, to the bit, what each judged in memory of its
    own gives (each overwrites the one before: none of it lingers), at a precision's rows too; buffers of
    another size are refused."""
    g = torch.Generator().manual_seed(4)
    inputs = EvaluationInputs(torch.randn(20, 3, generator=g), torch.randint(2, (20,), generator=g),
                              torch.randn(15, 3, generator=g), {"far": 4 * torch.randn(15, 3, generator=g)})
    stored = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
    reference = Reference({"far": 70.0}, {"far": 60.0}, 0.5, *reference_predictive(
        reference_sums(stored, inputs, limit=100, chunk=5)))
    buffers = stored.member_buffers(4)
    for rows, storage in (([0, 3, 7, 9], "float32"), ([11, 2, 5, 2], "float32"), ([1, 6, 8, 10], "int8")):
        reused = judge_rows(stored, np.array(rows), inputs, reference, storage, buffers)
        assert reused == judge_rows(stored, np.array(rows), inputs, reference, storage)
        assert torch.equal(buffers.doubled, stored.probs(rows, storage).double())
    with pytest.raises(ValueError, match="buffers for 4 rows given 3"):
        judge_rows(stored, np.array([0, 1, 2]), inputs, reference, buffers=buffers)
