"""One generator per chain: the split of a draw over the chains, and the chains' GANs trained as one batch
(against one trainer per chain, the reference), resumed and stored."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from apd.distillation.chain_generators import ChainGenerators, ChainTrainers, systematic_allocation
from apd.distillation.gan import Critic, GANTrainer, Generator
from apd.errors import ArtifactError, DataError, DivergenceError


def test_systematic_allocation_gives_each_part_its_share_to_within_one_in_order():
    shares = torch.tensor([0.25, 0.75])
    assert systematic_allocation(shares, 4).tolist() == [0, 1, 1, 1]
    assert systematic_allocation(shares, 3).tolist() == [0, 1, 1]  # positions 1/6, 1/2, 5/6
    counts = torch.bincount(systematic_allocation(torch.tensor([0.5, 0.3, 0.2]), 10), minlength=3)
    assert counts.tolist() == [5, 3, 2]
    rounded = torch.tensor([0.1, 0.2, 0.3, 0.4]) * 1.029  # shares read back rounded: their sum is not 1
    counts = torch.bincount(systematic_allocation(rounded, 10_000), minlength=4)
    assert counts.tolist() == [1000, 2000, 3000, 4000]


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


def _networks(seed: int, dim: int = 3, width: int = 8, dtype: torch.dtype = torch.float32
              ) -> tuple[Generator, Critic]:
    """A generator and a critic initialised from ``seed``, in ``dtype``."""
    torch.manual_seed(seed)
    return Generator(2, [width, width], dim).to(dtype), Critic(dim, [width, width]).to(dtype)


def _chain_trainers(seeds: list[int], loss: str = "wgan-gp", device: str = "cpu", cuda_graph: bool | None = None,
                    **sizes) -> ChainTrainers:
    """Chain j's generator and critic initialised from ``seeds[j]``, its stream seeded with it, trained as one."""
    generators, critics = zip(*(_networks(seed, **sizes) for seed in seeds), strict=True)
    return ChainTrainers([g.to(device) for g in generators], [c.to(device) for c in critics],
                         torch.full((len(seeds),), 1 / len(seeds), dtype=torch.float64, device=device), loss, lr=1e-3,
                         seeds=seeds, cuda_graph=cuda_graph)


def _sequential(seeds: list[int], loss: str = "wgan-gp", device: str = "cpu", **sizes) -> list[GANTrainer]:
    """The reference: one :class:`GANTrainer` per chain, of what :func:`_chain_trainers` stacks."""
    return [GANTrainer(*(net.to(device) for net in _networks(seed, **sizes)), loss, lr=1e-3, seed=seed)
            for seed in seeds]


def _batches(seeds: list[int], dim: int = 3, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Chain j's real codes, a stream of its own seeded with ``seeds[j]``, centred on 4·seed − 2."""
    rngs = {seed: torch.Generator().manual_seed(seed) for seed in seeds}
    return [lambda s=s: (torch.randn(16, dim, generator=rngs[s], dtype=dtype) + (4.0 * s - 2.0)).to(device)
            for s in seeds]


def _assert_same_networks(a: nn.Module, b: nn.Module, **tolerance) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, msg=name, **tolerance)


@pytest.mark.parametrize("loss", ["wgan-gp", "wgan", "gan"])
def test_chains_trained_as_one_follow_a_trainer_of_each_chain_alone(loss):
    """Batched, chain j draws its z, its interpolation weights and its real batches as the sequential
    trainer of chain j did, so 20 steps (100 critic updates) later both have the same generators and
    critics to float rounding, and the statistics are the chains' averaged by their shares. In float64: Adam
    turns rounding in a gradient that nearly cancels into a step of size lr, and in float32 two kernels'
    rounding (the batched and the single matmul's) part so within 20 steps on some CPUs and not on others."""
    seeds = [0, 1, 2]
    chains, alone = _chain_trainers(seeds, loss, dtype=torch.float64), _sequential(seeds, loss, dtype=torch.float64)
    together, apart = _batches(seeds, dtype=torch.float64), _batches(seeds, dtype=torch.float64)
    for _ in range(20):
        stats = chains.step(together, n_critic=5)
        parts = [trainer.step(batches, n_critic=5) for trainer, batches in zip(alone, apart, strict=True)]
    assert chains.generator_steps == 20 and chains.trainer.critic_steps == 100
    for j, trainer in enumerate(alone):
        _assert_same_networks(trainer.generator, chains.generator.generators[j], rtol=1e-8, atol=1e-10)
        for name, value in trainer.critic.state_dict().items():
            torch.testing.assert_close(chains.critic.state_dict()[name][j], value, rtol=1e-8, atol=1e-10, msg=name)
    assert set(stats) == set(parts[0])
    for name, value in stats.items():
        assert value == pytest.approx(sum(part[name] for part in parts) / 3, rel=1e-9, abs=1e-12), name
    by_chain = chains.step_by_chain(together, n_critic=5)
    parts = [trainer.step(batches, n_critic=5) for trainer, batches in zip(alone, apart, strict=True)]
    for name, values in by_chain.items():  # each chain's own statistics, and their average by other weights
        assert values.tolist() == pytest.approx([part[name] for part in parts], rel=1e-9, abs=1e-12), name
    weights = torch.tensor([0.5, 0.5, 0.0])
    assert chains.trainer.averaged(by_chain, weights) == pytest.approx(
        {name: (parts[0][name] + parts[1][name]) / 2 for name in by_chain}, rel=1e-9, abs=1e-12)


def test_a_chain_trains_alike_alone_and_among_others():
    """Chain 1's generator after 10 steps is the same whether it trains alone or with chains 0 and 2."""
    with_others, alone = _chain_trainers([0, 1, 2]), _chain_trainers([1])
    batches_with, batches_alone = _batches([0, 1, 2]), _batches([1])
    for _ in range(10):
        with_others.step(batches_with, n_critic=3)
        alone.step(batches_alone, n_critic=3)
    _assert_same_networks(with_others.generator.generators[1], alone.generator.generators[0])


def test_the_trained_generators_are_views_of_the_stack_and_store_as_separate_generators():
    """The chains' generators see every update of the stack; their state_dict has the names and shapes of a
    :class:`ChainGenerators` of separate generators, which loads it and draws the same codes."""
    chains = _chain_trainers([0, 1])
    chains.step(_batches([0, 1]), n_critic=1)
    stack = chains.trainer.generator.net[0].weight
    for j, generator in enumerate(chains.generator.generators):
        assert torch.equal(generator.net[0].weight, stack[j])
    saved = chains.generator.state_dict()
    fresh = ChainGenerators([Generator(2, [8, 8], 3) for _ in range(2)], torch.ones(2) / 2)
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in fresh.state_dict().items()}
    fresh.load_state_dict(saved)
    draw = torch.Generator().manual_seed(5)
    expected = chains.generator.sample(6, generator=draw)
    torch.testing.assert_close(fresh.sample(6, generator=draw.manual_seed(5)), expected, rtol=0, atol=0)


def test_chain_trainers_resume_from_their_state_to_the_same_generators():
    straight, batches = _chain_trainers([3, 4]), _batches([3, 4])
    for _ in range(3):
        straight.step(batches, n_critic=1)
    first, batches = _chain_trainers([3, 4]), _batches([3, 4])
    first.step(batches, n_critic=1)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = _chain_trainers([98, 99])  # other initial weights and streams: the state replaces them
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for _ in range(2):
        resumed.step(batches, n_critic=1)
    _assert_same_networks(straight.generator, resumed.generator, rtol=0, atol=0)
    with pytest.raises(ArtifactError, match="does not fit"):
        _chain_trainers([1, 2, 3]).load_state_dict(first.state_dict())
    with pytest.raises(ArtifactError, match="one by one"):
        resumed.load_state_dict({"chains": [{}, {}]})


def test_a_diverging_chain_is_named():
    chains = _chain_trainers([0, 1])
    real = torch.randn(2, 16, 3)
    real[1, 0, 0] = float("nan")
    with pytest.raises(DivergenceError, match=r"critic_loss is nan at critic step 1 \(chain 1\)"):
        chains.trainer.critic_step(real)
    with pytest.raises(DataError, match=r"shape \[16, 3\]; expected \[2, batch, 3\]"):
        chains.trainer.critic_step(real[0])


@pytest.mark.cuda
def test_chains_trained_as_one_on_cuda_follow_a_trainer_of_each_chain_alone():
    """On CUDA every tensor of the stacked trainer, its streams included, is on the device, and the chains
    trained as one follow the sequential trainers there to float rounding."""
    seeds = [0, 1, 2]
    chains, alone = _chain_trainers(seeds, device="cuda"), _sequential(seeds, device="cuda")
    together, apart = _batches(seeds, device="cuda"), _batches(seeds, device="cuda")
    for _ in range(10):
        chains.step(together, n_critic=5)
        for trainer, batches in zip(alone, apart, strict=True):
            trainer.step(batches, n_critic=5)
    assert all(rng.device.type == "cuda" for rng in chains.trainer.rng)
    assert all(t.is_cuda for t in chains.state_dict()["generator"].values())
    for j, trainer in enumerate(alone):
        _assert_same_networks(trainer.generator, chains.generator.generators[j], rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("loss", ["wgan-gp", "wgan", "gan"])
def test_the_recorded_cuda_graph_trains_the_chains_as_the_steps_as_usual_do(loss):
    """Replayed from its CUDA graph (recorded at the fourth step), a step draws from every chain's stream what
    the step as usual draws and makes the same updates: after 12 steps both trainers have the same networks
    and leave the streams in the same place; resumed from the graphed trainer's state, a fresh trainer
    (recording again) continues as it does."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    seeds = [0, 1, 2]
    eager, graphed = (_chain_trainers(seeds, loss, device="cuda", cuda_graph=graph) for graph in (False, True))
    for_eager, for_graphed = _batches(seeds, device="cuda"), _batches(seeds, device="cuda")
    for _ in range(12):
        expected = eager.step(for_eager, n_critic=5)
        stats = graphed.step(for_graphed, n_critic=5)
        assert stats == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert graphed.trainer.graph_recorded and not eager.trainer.graph_recorded
    assert graphed.trainer.critic_steps == 60 and graphed.generator_steps == 12
    _assert_same_networks(eager.generator, graphed.generator, rtol=1e-5, atol=1e-6)
    _assert_same_networks(eager.critic, graphed.critic, rtol=1e-5, atol=1e-6)
    for a, b in zip(eager.trainer.rng, graphed.trainer.rng, strict=True):
        assert torch.equal(a.get_state(), b.get_state())
    resumed = _chain_trainers([7, 8, 9], loss, device="cuda", cuda_graph=True)
    resumed.load_state_dict(graphed.state_dict())
    for_resumed, for_continued = _batches(seeds, device="cuda"), _batches(seeds, device="cuda")
    for _ in range(12):
        resumed.step(for_resumed, n_critic=5)
        graphed.step(for_continued, n_critic=5)
    assert resumed.trainer.graph_recorded
    _assert_same_networks(graphed.generator, resumed.generator, rtol=1e-5, atol=1e-6)
