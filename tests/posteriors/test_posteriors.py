"""Every method behind one interface: members, capabilities, and MC dropout as weights."""

from __future__ import annotations

import pytest
import torch

from apd.distillation.alignment import permute
from apd.nets import ParamSpec, mlp, predict_probs
from apd.posteriors import MCDropout, PointEstimate, SGLDSamples
from apd.samplers.store import SampleStore


def test_an_mc_dropout_member_is_the_dropout_net_with_one_fixed_mask():
    """θ_m with the next layer's columns scaled by m/(1 − p) computes what the dropout net computes with
    mask m after each hidden ReLU, for every input."""
    torch.manual_seed(0)
    net, p = mlp([6, 9, 7, 4], dropout=0.5).eval(), 0.5
    posterior = MCDropout(net, p)
    member = posterior.sample_weights(1, torch.Generator().manual_seed(3))[0]
    # recover the masks from the member: a dropped unit zeroes its column in the next weight matrix
    layers = posterior.spec.linear_layers()
    masks = []
    for w_start, _, n_out, n_in in layers[1:]:
        scaled = member[w_start:w_start + n_out * n_in].view(n_out, n_in)
        original = posterior.weights[w_start:w_start + n_out * n_in].view(n_out, n_in)
        ratio = scaled.sum(0) / original.sum(0)
        assert torch.all(torch.isclose(ratio, torch.tensor(0.0)) | torch.isclose(ratio, torch.tensor(1 / (1 - p))))
        masks.append(ratio)
    x = torch.randn(11, 6)
    with torch.no_grad():
        h = torch.relu(net[0](x)) * masks[0]
        h = torch.relu(net[3](h)) * masks[1]
        expected = torch.softmax(net[6](h), -1)
    torch.testing.assert_close(predict_probs(posterior.spec, member[None], x)[0], expected)


def test_mc_dropout_keeps_each_unit_with_probability_one_minus_p():
    torch.manual_seed(1)
    net = mlp([5, 200, 3], dropout=0.3)
    posterior = MCDropout(net, 0.3)
    members = posterior.sample_weights(400, torch.Generator().manual_seed(0))
    w_start, _, n_out, n_in = posterior.spec.linear_layers()[1]
    kept = members[:, w_start:w_start + n_out * n_in].view(400, n_out, n_in)[:, 0, :] != 0
    assert kept.float().mean().item() == pytest.approx(0.7, abs=0.01)


def test_capabilities_replace_type_tests(tmp_path):
    net = mlp([4, 5, 3])
    spec = ParamSpec.from_module(net)
    point = PointEstimate(net)
    assert point.max_members() == 1 and point.ensemble_size(100) == 1
    assert point.members(100)(torch.zeros(2, 4)).shape == (1, 2, 3)
    dropout = MCDropout(mlp([4, 5, 3], dropout=0.5), 0.5)
    assert dropout.max_members() is None and dropout.ensemble_size(100) == 100
    with SampleStore.create(tmp_path / "s.h5", spec, {}) as store:
        for i in range(7):
            store.append(torch.full((spec.numel,), float(i)), step=i)
    with SampleStore.open(tmp_path / "s.h5") as store:
        sgld = SGLDSamples(store)
        assert sgld.max_members() == 7 and sgld.ensemble_size(100) == 7
        members = sgld.members(100, torch.Generator().manual_seed(0))
        assert members(torch.zeros(2, 4)).shape == (7, 2, 3)
        assert sgld.storage_in_samples() == 7


def test_fixed_members_are_shared_by_every_call():
    dropout = MCDropout(mlp([4, 16, 3], dropout=0.5), 0.5)
    members = dropout.members(5, torch.Generator().manual_seed(0))
    x = torch.randn(3, 4)
    torch.testing.assert_close(members(x), members(x), rtol=0, atol=0)
    assert not torch.equal(members(x)[0], members(x)[1])


def test_aligned_sgld_samples_permute_each_drawn_row_and_keep_its_function(tmp_path):
    """Row i drawn with ``perms`` is row i with its hidden units reordered by perms[i]: other weights,
    the same network."""
    spec = ParamSpec.from_module(mlp([4, 6, 3]))
    rows = torch.randn(5, spec.numel, generator=torch.Generator().manual_seed(0))
    perms = torch.stack([torch.randperm(6, generator=torch.Generator().manual_seed(i)) for i in range(5)])
    with SampleStore.create(tmp_path / "s.h5", spec, {}) as store:
        for i, row in enumerate(rows):
            store.append(row, step=i)
    with SampleStore.open(tmp_path / "s.h5") as store:
        plain = SGLDSamples(store).sample_weights(3, torch.Generator().manual_seed(1))
        aligned = SGLDSamples(store, perms=perms).sample_weights(3, torch.Generator().manual_seed(1))
    drawn = [int(torch.nonzero((rows == row).all(1))) for row in plain]
    torch.testing.assert_close(aligned, permute(plain, spec, perms[drawn]), rtol=0, atol=0)
    assert not torch.equal(aligned, plain)
    x = torch.randn(8, 4)
    torch.testing.assert_close(predict_probs(spec, aligned, x), predict_probs(spec, plain, x))


@pytest.mark.cuda
def test_a_generator_on_the_posteriors_card_is_used_as_it_is():
    """A posterior on "cuda" takes a generator on "cuda:0" (where that is the current card) as it is, and one on the
    CPU by a card generator seeded from it."""
    from apd.posteriors.kept import FixedEnsemble

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    net = mlp([3, 4, 2])
    spec = ParamSpec.from_module(net)
    post = FixedEnsemble(spec.flatten(net)[None], spec, torch.device("cuda"))
    on_card = torch.Generator(device="cuda")
    assert post.on_device(on_card) is on_card
    assert post.on_device(torch.Generator()).device.type == "cuda"
