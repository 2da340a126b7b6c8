"""MC-dropout predictions of the baselines' validation: passes stacked into one call are passes; the SGD step
the baselines and SWAG train with, as a plain loop and (on CUDA) replayed from its graph."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from apd.data import MinibatchOrder
from apd.nets import mlp, network
from apd.samplers.baselines import MinibatchSGD, mc_dropout_probs, split_at_dropout, trains_alike_in_either_mode


@pytest.mark.parametrize("batch", [4, 4096])  # one pass in pieces; many passes per call
def test_each_pass_draws_its_own_masks_and_matches_the_plain_net_without_dropout(batch):
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    net = mlp([5, 16, 3], dropout=0.5)
    dropout = next(m for m in net if isinstance(m, torch.nn.Dropout))
    dropout.p = 0.0  # no unit dropped: every pass is the plain network
    probs = mc_dropout_probs(net, x, passes=7, batch=batch)
    assert probs.shape == (7, 6, 3) and not net.training
    torch.testing.assert_close(probs, torch.softmax(net(x), -1).expand(7, -1, -1))
    dropout.p = 0.5
    probs = mc_dropout_probs(net, x, passes=7, batch=batch)
    assert probs.shape == (7, 6, 3)
    assert all(not torch.equal(probs[0], probs[t]) for t in range(1, 7))  # fresh masks in every pass
    torch.testing.assert_close(probs.sum(-1), torch.ones(7, 6))


@pytest.mark.parametrize("sizes, conv", [([16, 12, 8, 3], ()), ([144, 10, 3], (2, 3))])  # an MLP and a CNN
def test_layers_before_the_first_dropout_run_once_and_the_passes_are_whole_passes_bit_for_bit(sizes, conv):
    x = torch.randn(10, sizes[0], generator=torch.Generator().manual_seed(1))
    net = network(sizes, conv, dropout=0.5)
    unmasked, masked = split_at_dropout(net)
    assert not any(isinstance(m, torch.nn.Dropout) for m in unmasked) and isinstance(masked[0], torch.nn.Dropout)
    calls = []
    unmasked[0].register_forward_hook(lambda *_: calls.append(1))
    torch.manual_seed(3)
    probs = mc_dropout_probs(net, x, passes=5, batch=4)  # pieces of 4, 4 and 2 rows
    assert len(calls) == 3  # once a piece, not once a piece and pass
    torch.manual_seed(3)
    net.train()
    with torch.no_grad():
        whole = torch.stack([torch.cat([torch.softmax(net(x[i:i + 4]), -1) for i in range(0, 10, 4)])
                             for _ in range(5)])
    assert torch.equal(probs, whole)


def test_a_net_without_dropout_is_not_split():
    net = mlp([5, 4, 3])
    unmasked, masked = split_at_dropout(net)
    assert isinstance(unmasked, torch.nn.Identity) and masked is net


def _sgd_runs(device: str, steps: int, conv: tuple[int, ...] = (), **options
              ) -> tuple[torch.nn.Module, list[float], MinibatchSGD]:
    """``steps`` steps of :class:`MinibatchSGD` (momentum, weight decay) on an MLP (a CNN of ``conv`` channels
    on 28 × 28 images where given) and random data on ``device``."""
    features = 784 if conv else 5
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, features, generator=g).to(device), torch.randint(3, (60,), generator=g).to(device)
    torch.manual_seed(1)
    net = network([features, 16, 3], conv).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    order, sgd = MinibatchOrder(60, 10, 2, device), MinibatchSGD(net, optimizer, x, y, 10, **options)
    return net, [float(sgd(order.indices(t))) for t in range(steps)], sgd


def test_the_sgd_step_is_the_plain_loop_bit_for_bit():
    """On the CPU :class:`MinibatchSGD` makes the updates the plain loop (loss, zero_grad, backward, step) makes."""
    net, losses, sgd = _sgd_runs("cpu", 12)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 5, generator=g), torch.randint(3, (60,), generator=g)
    torch.manual_seed(1)
    plain = mlp([5, 16, 3])
    optimizer = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    order, expected = MinibatchOrder(60, 10, 2), []
    for t in range(12):
        idx = order.indices(t)
        loss = torch.nn.functional.cross_entropy(plain(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    assert losses == expected and sgd._recording is None  # on the CPU, never recorded
    for a, b in zip(net.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert trains_alike_in_either_mode(net) and not trains_alike_in_either_mode(mlp([5, 4, 3], dropout=0.5))


@pytest.mark.cuda
@pytest.mark.parametrize("conv", [(), (2, 3)], ids=["mlp", "cnn"])
def test_the_recorded_sgd_step_makes_the_updates_of_the_step_as_usual(conv):
    """On CUDA the step of a network without dropout is recorded (at its fourth call) and replayed: 30 steps give
    the losses and weights of 30 steps as usual, convolutions and max-pooling included. The recording (its
    graph and memory pool) goes with the step, no garbage collection needed."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    recorded_net, recorded, sgd = _sgd_runs("cuda", 30, conv)
    usual_net, usual, _ = _sgd_runs("cuda", 30, conv, cuda_graph=False)
    assert sgd._recording.recorded
    assert recorded == pytest.approx(usual, rel=1e-6, abs=1e-7)
    for a, b in zip(recorded_net.state_dict().values(), usual_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    recording = weakref.ref(sgd._recording)
    gc.disable()
    try:
        del sgd
        assert recording() is None
    finally:
        gc.enable()
