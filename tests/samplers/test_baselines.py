"""MC-dropout predictions of the baselines' validation: passes stacked into one call are passes."""

from __future__ import annotations

import pytest
import torch

from apd.nets import mlp, network
from apd.samplers.baselines import mc_dropout_probs, split_at_dropout


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
