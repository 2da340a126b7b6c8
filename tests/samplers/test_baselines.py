"""MC-dropout predictions of the baselines' validation: passes stacked into one call are passes."""

from __future__ import annotations

import pytest
import torch

from apd.nets import mlp
from apd.samplers.baselines import mc_dropout_probs


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
