"""One generator conditioned on the chain: the chains a draw takes, the critic's gradient penalty on rows that
carry their chain, a known-answer fit of two separated chains, its storage and an exact resume."""

from __future__ import annotations

import io

import pytest
import torch

from apd.config import DistillConfig
from apd.distillation.conditioned import ConditionedGenerator, ConditionedTrainer, conditioned_critic, labelled
from apd.distillation.gan import Critic, scores_and_interpolate_grad_norm
from apd.distillation.generator import architecture, build_generator
from apd.distillation.precision import module_bytes, stored_bytes
from apd.distillation.training import make_conditioned_trainer

MEANS = torch.tensor([[-3.0, -3.0, 0.0], [3.0, 3.0, 1.0]])  # the two chains' means, in code space
SHARES = torch.tensor([0.25, 0.75])


def _trainer(seed: int = 0, embedding: int = 2) -> ConditionedTrainer:
    d = DistillConfig(z_dim=2, gen_hidden=[32, 32], critic_hidden=[32, 32], lr=1e-3, mode_embedding=embedding)
    return make_conditioned_trainer(d, 3, seed, SHARES, torch.device("cpu"))


def _batches(seed: int, size: int = 64):
    """Rows [codes, chain] of the two chains, chain j with probability w_j, codes 𝒩(μ_j, 0.3² I)."""
    rng = torch.Generator().manual_seed(seed)

    def batch() -> torch.Tensor:
        chains = torch.multinomial(SHARES, size, replacement=True, generator=rng)
        return labelled(MEANS[chains] + 0.3 * torch.randn(size, 3, generator=rng), chains)

    return batch


def test_a_draw_takes_the_chains_by_share_in_order_from_a_random_start():
    model = ConditionedGenerator(2, [4], 3, torch.tensor([0.5, 0.3, 0.2]), 2)
    chains = model.draw_chains(10, torch.Generator().manual_seed(0))
    assert torch.bincount(chains, minlength=3).tolist() == [5, 3, 2] and bool((chains.diff() >= 0).all())
    single = torch.stack([model.draw_chains(1, torch.Generator().manual_seed(s))[0] for s in range(400)])
    assert torch.bincount(single, minlength=3).tolist() == pytest.approx([200, 120, 80], abs=30)
    assert model.sample(7).shape == (7, 3)
    with pytest.raises(ValueError, match="at least one dimension"):
        ConditionedGenerator(2, [4], 3, SHARES, 0)


def test_the_gradient_penalty_on_rows_with_their_chain_is_the_gradient_in_the_codes_alone():
    """‖∇ₓD(x̂)‖ from the first layer's pre-activations equals autograd's on explicit interpolates of the codes,
    each row's chain held fixed."""
    torch.manual_seed(0)
    critic = conditioned_critic(3, [8, 8], 2)
    with torch.no_grad():
        critic.net[0].chain_bias.normal_()
    chains = torch.tensor([0, 1, 1, 0, 1])
    real, fake, alpha = labelled(torch.randn(5, 3), chains), labelled(torch.randn(5, 3), chains), torch.rand(5, 1)
    d_real, d_fake, norm = scores_and_interpolate_grad_norm(critic, real, fake, alpha)
    mix = torch.lerp(fake[:, :-1], real[:, :-1], alpha).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(labelled(mix, chains)).sum(), mix)
    torch.testing.assert_close(norm, grad.norm(dim=1))
    torch.testing.assert_close(d_real, critic(real).squeeze(-1))
    torch.testing.assert_close(d_fake, critic(fake).squeeze(-1))
    assert critic.in_dim == 4
    with pytest.raises(ValueError, match="label columns"):
        ConditionedTrainer(ConditionedGenerator(2, [4], 3, SHARES, 2), Critic(3, [4]))


def test_two_separated_chains_are_each_drawn_near_their_own_mean_and_move_with_their_embedding():
    """Known answer: trained on two chains 6√2 ≈ 8.5 apart, every code drawn for chain j is nearer μ_j than
    the other chain's mean and their mean is within 1.5 of μ_j (WGAN-GP at this size still wanders by about
    0.5); the same network given the other chain's embedding draws near the other mean; a draw of 400 takes
    100 codes from chain 0's mode and 300 from chain 1's."""
    trainer, batches = _trainer(), _batches(1)
    for _ in range(600):
        trainer.step(batches, n_critic=5)
    model = trainer.generator.eval()
    z = torch.randn(2000, 2, generator=torch.Generator().manual_seed(2))

    def drawn_for(chain: int) -> torch.Tensor:
        with torch.no_grad():
            return model(z, torch.full((2000,), chain))

    for j in (0, 1):
        codes = drawn_for(j)
        assert bool((torch.cdist(codes, MEANS).argmin(1) == j).all()), j
        assert float((codes.mean(0) - MEANS[j]).norm()) < 1.5, j
    with torch.no_grad():
        model.embedding.copy_(model.embedding.flip(0))
    assert bool((torch.cdist(drawn_for(0), MEANS).argmin(1) == 1).all())
    with torch.no_grad():
        model.embedding.copy_(model.embedding.flip(0))
        drawn = model.sample(400, torch.Generator().manual_seed(3))
    assert torch.bincount(torch.cdist(drawn, MEANS).argmin(1), minlength=2).tolist() == [100, 300]


def test_storage_counts_the_embeddings_and_shares_with_the_network_and_the_codec():
    """The stored numbers: the generator network, C·E embedding numbers, C shares and the codec; at int8 each
    tensor is counted in its own codes and scales. The architecture rebuilds the same shapes."""
    d = DistillConfig(generator="subspace", subspace_rank=5, z_dim=4, gen_hidden=[16], mode_embedding=3)
    arch = architecture(d, 50, [4, 10, 2], chains=7)
    assert (arch["chains"], arch["mode_embedding"]) == (7, 3)
    model = build_generator(arch)
    assert isinstance(model.generator, ConditionedGenerator) and model.generator.embedding.shape == (7, 3)
    network = (4 + 3) * 16 + 16 + 16 * 5 + 5
    assert model.stored_parameters() == network + 7 * 3 + 7 + model.codec.stored_parameters()
    embedding_bytes = stored_bytes(21, "int8") + stored_bytes(7, "int8")
    assert module_bytes(model.generator, "int8") == embedding_bytes + module_bytes(model.generator.net, "int8")
    plain = build_generator(architecture(DistillConfig(generator="subspace", subspace_rank=5, z_dim=4,
                                                       gen_hidden=[16]), 50, [4, 10, 2], chains=7))
    assert model.stored_parameters() - plain.stored_parameters() == 3 * 16 + 7 * 3 + 7


def test_a_resumed_trainer_repeats_the_uninterrupted_run_exactly_and_a_seed_its_networks():
    straight, batches = _trainer(3), _batches(4)
    for _ in range(4):
        straight.step(batches, n_critic=2)
    first, batches = _trainer(3), _batches(4)
    for _ in range(2):
        first.step(batches, n_critic=2)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = _trainer(99)  # other weights, embeddings and stream: the state replaces them
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for _ in range(2):
        resumed.step(batches, n_critic=2)
    for (name, a), b in zip(straight.generator.state_dict().items(), resumed.generator.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    for a, b in zip(_trainer(5).critic.state_dict().values(), _trainer(5).critic.state_dict().values(), strict=True):
        assert torch.equal(a, b)
