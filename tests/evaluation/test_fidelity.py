"""The fidelity of a weight-space method to SGLD: the BALD ratio on a hand-worked case, the weight-space part
on samples whose distances are known, and the predicting variant composed of the two."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apd.evaluation.fidelity import bald_ratio, fidelity, weight_fidelity
from apd.nets import ParamSpec, mlp
from apd.posteriors import KeptSamples, SGLDSamples
from apd.samplers.store import SampleStore
from apd.uncertainty import bald

SPEC = ParamSpec.from_module(mlp([4, 3, 2]))


def test_bald_ratio_is_the_quotient_of_the_mean_per_input_balds():
    # two members that disagree completely on an input: BALD = H(p̄) − mean H(p_m) = ln 2 − 0
    split = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])  # [M=2, N=2, C=2]
    agree_on_second = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]])
    method, sgld = bald(split.double()), bald(agree_on_second.double())
    assert method.tolist() == pytest.approx([math.log(2), math.log(2)])
    assert sgld.tolist() == pytest.approx([math.log(2), 0.0])
    assert bald_ratio(method, sgld) == pytest.approx(2.0)


@pytest.fixture
def store(tmp_path):
    g = torch.Generator().manual_seed(0)
    with SampleStore.create(tmp_path / "s.h5", SPEC, {}) as s:
        s.append_many(torch.randn(40, SPEC.numel, generator=g), steps=np.arange(40), chains=0)
    with SampleStore.open(tmp_path / "s.h5") as s:
        yield s


class Fixed:
    """A method whose draws are given weight vectors, whatever k and the generator."""

    def __init__(self, weights):
        self.weights = weights

    def sample_weights(self, k, generator):
        return self.weights


def test_a_method_that_draws_sglds_reference_half_has_its_spread_and_distance_zero(store):
    """SGLD's 2k draws are split into a reference half and a held-out half; a method whose k draws are the
    reference half itself has the same std in every weight (ratio 1) and each draw at distance 0 from its
    nearest reference sample; the held-out half is at the distance of independent draws."""
    sgld, k = SGLDSamples(store), 6
    drawn = sgld.sample_weights(2 * k, torch.Generator().manual_seed(1))
    found = weight_fidelity(Fixed(drawn[:k]), sgld, k, torch.Generator().manual_seed(1))
    assert found["weight_std_ratio"] == pytest.approx(1.0)
    assert found["nn_distance"] == 0.0 and found["nn_ratio"] == 0.0
    expected = torch.cdist(drawn[k:], drawn[:k]).min(1).values.mean().item()
    assert found["heldout_nn_distance"] == pytest.approx(expected)
    wider = weight_fidelity(Fixed(2 * drawn[:k]), sgld, k, torch.Generator().manual_seed(1))
    assert wider["weight_std_ratio"] == pytest.approx(2.0)


def test_fidelity_is_the_weight_part_then_the_bald_ratio_of_fresh_predictions(store):
    sgld, kept = SGLDSamples(store), KeptSamples.from_store(store, [2, 7, 13, 20])
    x = torch.randn(25, 4, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(5)
    expected = weight_fidelity(kept, sgld, 4, g)
    expected["bald_ratio"] = bald_ratio(bald(kept.predict_probs(x, 4, g)), bald(sgld.predict_probs(x, 4, g)))
    assert fidelity(kept, sgld, x, 4, torch.Generator().manual_seed(5)) == expected
