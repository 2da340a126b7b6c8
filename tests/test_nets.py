from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils import vector_to_parameters

from apd import nets as nets_module
from apd.errors import ArtifactError
from apd.nets import (
    ParamSpec,
    conv_output_features,
    mlp,
    network,
    predict_logits,
    predict_probs,
    softmax_over_classes,
)
from apd.posteriors.mcdropout import MCDropout


def test_mlp_layout():
    net = mlp([784, 100, 10], dropout=0.5)
    assert ParamSpec.from_module(net).numel == 79_510
    assert ParamSpec.from_module(mlp([784, 400, 400, 10])).numel == 478_410
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "ReLU", "Dropout", "Linear"]  # no dropout on the input or the output
    assert [type(m).__name__ for m in mlp([5, 3])] == ["Linear"]
    with pytest.raises(ValueError, match="dropout"):
        mlp([5, 3], dropout=1.0)


def test_paramspec_round_trip():
    torch.manual_seed(0)
    net = mlp([6, 5, 4, 3])
    spec = ParamSpec.from_module(net)
    vec = spec.flatten(net)
    assert vec.shape == (spec.numel,)
    torch.testing.assert_close(vec, torch.nn.utils.parameters_to_vector(net.parameters()))
    views = spec.unflatten(vec)
    for name, param in net.named_parameters():
        assert torch.equal(views[name], param.detach())
    other = mlp([6, 5, 4, 3])
    spec.load_into(other, vec)
    assert torch.equal(spec.flatten(other), vec)
    assert ParamSpec.from_json(spec.to_json()) == spec
    assert spec.layer_sizes == [6, 5, 4, 3] and spec.describe() == "6-5-4-3"
    batch = torch.randn(7, spec.numel)
    assert spec.unflatten(batch)["0.weight"].shape == (7, 5, 6)
    with pytest.raises(ValueError, match="entries"):
        spec.unflatten(torch.zeros(spec.numel + 1))
    with pytest.raises(ArtifactError, match="malformed"):
        ParamSpec.from_json('{"names": ["a"]}')


def test_paramspec_skips_integer_buffers():
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    spec = ParamSpec.from_module(net)
    assert spec.numel == 3 * 2 + 2 + 2 + 2  # linear + batchnorm affine; no num_batches_tracked


def test_paramspec_rejects_non_mlp():
    spec = ParamSpec(("w", "b"), ((3, 4), (2,)))
    with pytest.raises(ValueError, match="not an MLP"):
        spec.linear_layers()
    chain = ParamSpec(("a.w", "a.b", "b.w", "b.b"), ((3, 4), (3,), (2, 5), (2,)))
    with pytest.raises(ValueError, match="takes 5 inputs"):
        chain.linear_layers()


def loop_reference(net: torch.nn.Module, weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-network loop: vector_to_parameters + forward, the obvious implementation."""
    out = []
    with torch.no_grad():
        for w in weights:
            vector_to_parameters(w, net.parameters())
            out.append(torch.softmax(net(x), dim=-1))
    return torch.stack(out)


@pytest.mark.parametrize("k", [1, 7, 100])
@pytest.mark.parametrize("chunk", [None, 1, 3, 64])
def test_predict_probs_matches_loop(k, chunk):
    torch.manual_seed(k)
    sizes = [64, 30, 20, 10]
    spec = ParamSpec.from_module(mlp(sizes))
    weights = torch.randn(k, spec.numel) * 0.3
    x = torch.randn(50, 64)
    probs = predict_probs(spec, weights, x, chunk=chunk)
    assert probs.shape == (k, 50, 10)
    torch.testing.assert_close(probs, loop_reference(mlp(sizes), weights, x), atol=1e-5, rtol=1e-4)


def test_softmax_over_classes_is_the_softmax():
    """A hand-worked case (exp 0 : exp log 3 = 1 : 3), torch's softmax on logits from ±1e4 to saturation,
    and the same gradient as torch's in float64."""
    torch.testing.assert_close(softmax_over_classes(torch.tensor([[0.0, math.log(3.0)]])),
                               torch.tensor([[0.25, 0.75]]))
    torch.manual_seed(0)
    logits = torch.randn(3, 50, 10) * torch.tensor([1.0, 30.0, 1e4]).view(3, 1, 1)
    probs = softmax_over_classes(logits)
    torch.testing.assert_close(probs, torch.softmax(logits, -1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 50))
    assert torch.equal(probs[2].amax(-1), torch.ones(50))  # saturated rows are exactly one-hot, as torch's
    z = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, 6, dtype=torch.float64)
    ours, = torch.autograd.grad((softmax_over_classes(z) * weights).sum(), z)
    theirs, = torch.autograd.grad((torch.softmax(z, -1) * weights).sum(), z)
    torch.testing.assert_close(ours, theirs)


def test_predict_probs_leaves_module_untouched_and_accepts_images():
    net = mlp([16, 8, 3])
    before = ParamSpec.from_module(net).flatten(net)
    weights = torch.randn(4, before.numel())
    probs = predict_probs(net, weights, torch.randn(5, 4, 4))  # images are flattened
    assert probs.shape == (4, 5, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4, 5))
    assert torch.equal(ParamSpec.from_module(net).flatten(net), before)
    assert predict_probs(net, weights[0], torch.randn(5, 16)).shape == (1, 5, 3)


def test_predict_probs_shape_errors():
    spec = ParamSpec.from_module(mlp([16, 8, 3]))
    with pytest.raises(ValueError, match=r"weights must be \[K, 163\]"):
        predict_probs(spec, torch.zeros(2, 10), torch.zeros(1, 16))
    with pytest.raises(ValueError, match="inputs have 15 features"):
        predict_probs(spec, torch.zeros(2, 163), torch.zeros(1, 15))
    with pytest.raises(ValueError, match="chunk"):
        predict_probs(spec, torch.zeros(2, 163), torch.zeros(1, 16), chunk=0)


def test_predict_is_differentiable_in_inputs():
    spec = ParamSpec.from_module(mlp([8, 6, 3]))
    x = torch.randn(4, 8, requires_grad=True)
    predict_logits(spec, torch.randn(2, spec.numel), x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_bfloat16_compute_is_close():
    torch.manual_seed(0)
    spec = ParamSpec.from_module(mlp([64, 100, 10]))
    weights, x = torch.randn(20, spec.numel) * 0.1, torch.randn(200, 64)
    exact = predict_probs(spec, weights, x)
    fast = predict_probs(spec, weights, x, compute_dtype=torch.bfloat16)
    assert fast.dtype == torch.float32
    assert (fast - exact).abs().max() < 2e-2


@pytest.mark.cuda
def test_predict_probs_on_cuda_matches_cpu():
    torch.manual_seed(0)
    spec = ParamSpec.from_module(mlp([784, 100, 10]))
    weights, x = torch.randn(50, spec.numel) * 0.05, torch.randn(300, 784)
    cpu = predict_probs(spec, weights, x)
    gpu = predict_probs(spec, weights.cuda(), x.cuda())
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-3)


def test_lenet5_layout():
    net = network([784, 120, 84, 10], [6, 16], dropout=0.5)
    spec = ParamSpec.from_module(net)
    # LeNet-5: 6·25+6, 16·6·25+16 (the first layer padded, 28 → 28 → 14 → 10 → 5), 400·120+120, 120·84+84, 84·10+10
    assert spec.numel == 156 + 2_416 + 48_120 + 10_164 + 850 == 61_706
    assert spec.conv_layers() == [(0, 150, 6, 1), (156, 2_556, 16, 6)]
    assert spec.layer_sizes == [400, 120, 84, 10] and not spec.is_mlp
    assert spec.describe() == "conv6-conv16-400-120-84-10"
    assert ParamSpec.from_module(network([784, 100, 10])).is_mlp  # no conv: the MLP
    assert spec.activation_width(784) == 6 * 784
    assert [type(m).__name__ for m in net][-7:] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout",
                                                    "Linear"]  # dropout on the head's hidden units only
    assert net(torch.randn(3, 784)).shape == (3, 10)
    assert conv_output_features(64, [4]) == 4 * 4 * 4  # digits: 8 → 8 → 4


def test_network_rejects_images_it_cannot_take():
    with pytest.raises(ValueError, match="square"):
        network([780, 10], [6])
    with pytest.raises(ValueError, match="does not divide evenly"):
        network([64, 10], [6, 16])  # 8 → 8 → 4 → 0
    with pytest.raises(ValueError, match="positive"):
        network([784, 10], [0])


@pytest.mark.parametrize("direct", [0, 4], ids=["patches", "direct"])
@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_predict_logits_of_cnns_matches_their_modules(chunk, direct, monkeypatch):
    """Both paths of a block: the first layer's patches, and (up to ``_CNN_DIRECT_NETWORKS``) the images
    convolved directly."""
    monkeypatch.setattr(nets_module, "_CNN_DIRECT_NETWORKS", direct)
    torch.manual_seed(0)
    nets = [network([784, 12, 10], [3, 4]) for _ in range(3)]
    spec = ParamSpec.from_module(nets[0])
    weights = torch.stack([spec.flatten(n) for n in nets])
    x = torch.randn(9, 784)
    with torch.no_grad():  # prediction pools by strided maxima, attacks (autograd) by F.max_pool2d
        torch.testing.assert_close(predict_logits(spec, weights, x, chunk=chunk), torch.stack([n(x) for n in nets]),
                                   atol=1e-5, rtol=1e-4)
    x.requires_grad_()
    logits = predict_logits(spec, weights, x, chunk=chunk)
    expected = torch.stack([n(x) for n in nets])
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-4)
    grad, = torch.autograd.grad(logits.square().sum(), x)  # differentiable in the inputs, as attacks need
    expected_grad, = torch.autograd.grad(expected.square().sum(), x)
    torch.testing.assert_close(grad, expected_grad, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="inputs have 144 pixels"):
        predict_logits(spec, weights, torch.zeros(2, 144))  # 12 → 12 → 6 → 2 → 1: 4 features, not 100


def test_a_cnn_predicted_in_blocks_of_networks_and_images_matches_its_modules(monkeypatch):
    """Blocks of 2 networks × 3 images through the patches (a quarter of the block's first-layer maps held
    to 2 · 3 · 3 · 784 / 4 floats), the last block of each ragged; ``chunk`` sets the networks per block."""
    torch.manual_seed(0)
    nets = [network([784, 12, 10], [3, 4]) for _ in range(5)]
    spec = ParamSpec.from_module(nets[0])
    weights, x = torch.stack([spec.flatten(n) for n in nets]), torch.randn(11, 784)
    monkeypatch.setattr(nets_module, "_CNN_DIRECT_NETWORKS", 0)
    calls, pooled_patches = [], nets_module._pooled_patches
    monkeypatch.setattr(nets_module, "_pooled_patches", lambda images, side: calls.append(len(images))
                        or pooled_patches(images, side))
    for budget in ("_CHUNK_ELEMENTS", "_CNN_CACHE_ELEMENTS"):
        monkeypatch.setattr(nets_module, budget, 2 * 3 * spec.activation_width(784) // nets_module.POOL**2)
    with torch.no_grad():
        expected = torch.stack([n(x) for n in nets])
        torch.testing.assert_close(predict_logits(spec, weights, x, chunk=2), expected, atol=1e-5, rtol=1e-4)
    assert calls == [3, 3, 3, 2]  # one set of patches per block of images, shared by the blocks of networks


def test_mc_dropout_members_of_a_cnn_drop_head_units_only():
    torch.manual_seed(0)
    net = network([64, 16, 10], [4], dropout=0.5)
    member = MCDropout(net, 0.5).sample_weights(1, torch.Generator().manual_seed(0))[0]
    base = ParamSpec.from_module(net).flatten(net)
    conv_and_first = ParamSpec.from_module(net).linear_layers()[1][0]  # where the head's second layer starts
    assert torch.equal(member[:conv_and_first], base[:conv_and_first])
    assert not torch.equal(member, base)


def test_trunk_and_tail_cut_after_the_first_linear_layer():
    spec = ParamSpec.from_module(network([144, 10, 8, 3], [2, 3]))
    trunk, tail = spec.trunk_and_tail()
    assert trunk.names + tail.names == spec.names and trunk.numel + tail.numel == spec.numel
    assert trunk.describe() == "conv2-conv3-3-10" and tail.describe() == "10-8-3"
    assert ParamSpec.from_module(mlp([5, 4, 3])).trunk_and_tail()[1].describe() == "4-3"
    with pytest.raises(ValueError, match="one linear layer"):
        ParamSpec.from_module(mlp([5, 3])).trunk_and_tail()


@pytest.mark.parametrize("net", [mlp([6, 9, 7, 4], dropout=0.5), network([144, 10, 8, 3], [2, 3], dropout=0.5)])
def test_mc_dropout_members_share_their_trunk_and_predict_as_their_weight_vectors(net):
    """The members' function with the trunk run once is the batched prediction of their k weight vectors."""
    posterior = MCDropout(net, 0.5)
    x = torch.randn(13, posterior.spec.layer_sizes[0] if posterior.spec.is_mlp else 144,
                    generator=torch.Generator().manual_seed(1))
    shared = posterior.members(6, torch.Generator().manual_seed(2))(x)
    weights = posterior.sample_weights(6, torch.Generator().manual_seed(2))
    assert len(torch.unique(weights, dim=0)) == 6  # six different masks
    torch.testing.assert_close(shared, predict_probs(posterior.spec, weights, x))
    assert shared.shape == (6, 13, posterior.spec.layer_sizes[-1])
