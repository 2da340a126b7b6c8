"""Kept samples stored around their chain's mean (apd.evaluation.kept_storage): hand-worked storage and bytes,
and the shared predictions of samples stored so."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from apd.distillation.precision import round_trip
from apd.evaluation.kept_storage import AroundChainMeans, RoundedWhole, as_storage, kept_for, kept_worth, storage_key
from apd.evaluation.stored import StoredPredictions
from apd.nets import ParamSpec, mlp, predict_probs
from apd.samplers.store import SampleStore

SPEC = ParamSpec.from_module(mlp([16, 12, 3]))  # 243 weights


def steps_store(path) -> tuple[SampleStore, Tensor, Tensor]:
    """Two chains of four samples θ = μ_c ± d_j, the deviations whole multiples of 0.01 up to 0.07 in every
    block of 64, so that each chain's mean is μ_c and int4 (codes −7 … 7) stores each deviation exactly."""
    g = torch.Generator().manual_seed(0)
    means = torch.stack([torch.full((SPEC.numel,), 5.0), torch.full((SPEC.numel,), -3.0)])
    codes = torch.randint(-6, 7, (2, SPEC.numel), generator=g).double()
    codes[:, ::64] = 7  # each block's largest magnitude: its scale 0.07 / 7
    deviations = 0.01 * torch.cat([codes, -codes])  # ± each: the chain's mean is μ_c
    with SampleStore.create(path, SPEC, {}) as store:
        for chain in range(2):
            store.append_many((means[chain] + deviations).float(), steps=np.arange(4), chains=chain + 7)
    return SampleStore.open(path), means, deviations.float()


def test_each_sample_is_its_chains_mean_plus_its_deviation_rounded_apart(tmp_path):
    store, means, deviations = steps_store(tmp_path / "s.h5")
    with store:
        around = AroundChainMeans.of(store, "int4", "float32")
        assert around.ids.tolist() == [7, 8]
        torch.testing.assert_close(around.means, means.float())
        weights = store.read_all()
        stored = around.stored(weights, store.chains)
        torch.testing.assert_close(stored, weights, rtol=0, atol=1e-6)  # the codes hold each deviation
        whole = RoundedWhole("int4").stored(weights, store.chains)  # the block's scale spans the mean: 5.07 / 7
        assert (whole - weights).abs().max() > 0.1 > (stored - weights).abs().max()
        assert storage_key(around) == "int4 around chain means at float32" and storage_key("int8") == "int8"


def test_the_means_are_stored_at_their_own_precision(tmp_path):
    store, _, _ = steps_store(tmp_path / "s.h5")
    with store:
        around = AroundChainMeans.of(store, "int4", "int8")
        float32 = AroundChainMeans.of(store, "int4", "float32")
        torch.testing.assert_close(around.means, torch.stack([round_trip(m, "int8") for m in float32.means]))


# D = 243 weights in 4 blocks of 64: int4 122 code bytes + 16 of scales = 138, int8 243 + 16 = 259, of 972
@pytest.mark.parametrize(("k", "bytes_"), [(1, 138 + 259), (2, 2 * 138 + 2 * 259), (5, 5 * 138 + 2 * 259)])
def test_k_samples_take_their_deviations_and_the_means_of_the_chains_they_come_from(tmp_path, k, bytes_):
    store, _, _ = steps_store(tmp_path / "s.h5")
    with store:
        around = AroundChainMeans.of(store, "int4", "int8")
    assert kept_worth(k, SPEC.numel, around) == pytest.approx(bytes_ / 972)
    assert kept_worth(k, SPEC.numel, "int4") == pytest.approx(k * 138 / 972)


def test_a_precisions_name_is_the_samples_rounded_whole_at_it(tmp_path):
    store, _, _ = steps_store(tmp_path / "s.h5")
    with store:
        weights, chains = store.read_all(), store.chains
    assert as_storage("int4") == RoundedWhole("int4") and as_storage(RoundedWhole("int8")) == RoundedWhole("int8")
    assert RoundedWhole("float32").stored(weights, chains) is weights  # nothing to round
    torch.testing.assert_close(RoundedWhole("int4").stored(weights, chains),
                               torch.stack([round_trip(row, "int4") for row in weights]), rtol=0, atol=0)
    assert [RoundedWhole(p).worth(3, SPEC.numel) for p in ("float32", "int8", "int4")] == pytest.approx(
        [3.0, 3 * 259 / 972, 3 * 138 / 972])


@pytest.mark.parametrize(("worth", "expected"), [
    (397 / 972, 1), (398 / 972, 2), (794 / 972, 2),  # one sample with its mean; two with theirs
    (932 / 972, 3), (933 / 972, 4),  # 3: 414 + 518 = 932 bytes
    (10.0, 8),  # at most the store's samples
])
def test_a_method_is_set_against_the_fewest_samples_around_means_that_take_its_storage(tmp_path, worth, expected):
    store, _, _ = steps_store(tmp_path / "s.h5")
    with store:
        around = AroundChainMeans.of(store, "int4", "int8")
    assert kept_for(worth, SPEC.numel, around, available=8) == expected


def test_shared_predictions_keep_samples_around_means_apart_from_the_whole_rounded_ones(tmp_path):
    store, _, _ = steps_store(tmp_path / "s.h5")
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(1))
    with store:
        around = AroundChainMeans.of(store, "int4", "int8")
        shared, rows = StoredPredictions(store, x, "cpu"), np.array([6, 1, 5])
        whole = shared.probs(rows, "int4")
        expected = predict_probs(SPEC, around.stored(store.read(rows), store.chains[rows]), x)
        assert torch.equal(shared.probs(rows, around), expected)
        assert not torch.equal(whole, expected)
        assert torch.equal(shared.probs(rows, "int4"), whole)
