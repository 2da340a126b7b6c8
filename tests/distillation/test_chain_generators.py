"""One generator per chain: the split of a draw over the chains, and trainers stepped and resumed together."""

from __future__ import annotations

import pytest
import torch

from apd.distillation.chain_generators import ChainGenerators, ChainTrainers, systematic_allocation
from apd.distillation.gan import Critic, GANTrainer, Generator
from apd.errors import ArtifactError


def test_systematic_allocation_gives_each_part_its_share_to_within_one_in_order():
    shares = torch.tensor([0.25, 0.75])
    assert systematic_allocation(shares, 4).tolist() == [0, 1, 1, 1]
    assert systematic_allocation(shares, 3).tolist() == [0, 1, 1]  # positions 1/6, 1/2, 5/6
    counts = torch.bincount(systematic_allocation(torch.tensor([0.5, 0.3, 0.2]), 10), minlength=3)
    assert counts.tolist() == [5, 3, 2]


def _constant_generator(value: float) -> Generator:
    """A generator whose every code is ``value`` in each coordinate."""
    g = Generator(2, [4], 3)
    with torch.no_grad():
        g.net[-1].weight.zero_()
        g.net[-1].bias.fill_(value)
    return g


def test_a_draw_takes_each_chains_share_from_that_chains_generator_grouped_by_chain():
    model = ChainGenerators([_constant_generator(0.0), _constant_generator(1.0)], torch.tensor([0.25, 0.75]))
    codes = model.sample(8, generator=torch.Generator().manual_seed(0))
    assert codes.shape == (8, 3)
    assert codes[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert model.sample(1).shape == (1, 3)  # a part with no members draws nothing
    with pytest.raises(ValueError, match="2 generators for 3 chain shares"):
        ChainGenerators([_constant_generator(0.0), _constant_generator(1.0)], torch.ones(3) / 3)


def _trainers(seed: int) -> ChainTrainers:
    trainers = []
    for chain in range(2):
        torch.manual_seed(seed + chain)
        trainers.append(GANTrainer(Generator(2, [8], 3), Critic(3, [8]), lr=1e-3, seed=seed + chain))
    return ChainTrainers(trainers, torch.tensor([0.5, 0.5]))


def _batches(seed: int):
    """Chain 0's real codes near −2, chain 1's near +2."""
    rngs = [torch.Generator().manual_seed(seed + c) for c in range(2)]
    return [lambda c=c: torch.randn(16, 3, generator=rngs[c]) + (4.0 * c - 2.0) for c in range(2)]


def test_chain_trainers_step_every_chain_and_average_its_statistics_by_share():
    chains = _trainers(0)
    batches = _batches(0)
    stats = chains.step(batches, n_critic=2)
    assert chains.generator_steps == 1 and all(t.generator_steps == 1 for t in chains.trainers)
    assert set(stats) >= {"wasserstein", "generator_loss"}
    alone = _trainers(0)  # the same two trainers stepped one by one
    parts = [t.step(b, n_critic=2) for t, b in zip(alone.trainers, _batches(0), strict=True)]
    assert stats["wasserstein"] == pytest.approx(0.5 * parts[0]["wasserstein"] + 0.5 * parts[1]["wasserstein"])


def test_chain_trainers_resume_from_their_state_to_the_same_generators():
    straight, batches = _trainers(3), _batches(3)
    for _ in range(3):
        straight.step(batches, n_critic=1)
    first, batches = _trainers(3), _batches(3)
    first.step(batches, n_critic=1)
    state = first.state_dict()
    resumed = _trainers(99)  # other initial weights: the state replaces them
    resumed.load_state_dict(state)
    for _ in range(2):
        resumed.step(batches, n_critic=1)
    for key, value in straight.generator.state_dict().items():
        torch.testing.assert_close(resumed.generator.state_dict()[key], value, msg=key)
    with pytest.raises(ArtifactError, match="holds 1 chains' trainers, this run has 2"):
        resumed.load_state_dict({"chains": state["chains"][:1]})
