"""Tests for apd.evaluation.attacks: budgets, closed forms on a linear model, strength on a trained MLP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apd.config import DataConfig
from apd.data import load_dataset
from apd.errors import ConfigError
from apd.evaluation.attacks import (
    craft,
    expected_predictive_fn,
    fgsm,
    fgsm_min_eps,
    module_fn,
    pgd,
    weight_sample_fn,
)
from apd.nets import ParamSpec, mlp

LO, HI = -1.0, 1.0


def random_batch(n: int = 64, features: int = 64, classes: int = 10, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, features, generator=g) * 2 - 1, torch.randint(classes, (n,), generator=g)


def random_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return mlp([64, 32, 10])


def per_example_loss(model_fn, x: Tensor, y: Tensor) -> Tensor:
    with torch.no_grad():
        return F.cross_entropy(model_fn(x), y, reduction="none")


def accuracy(model_fn, x: Tensor, y: Tensor) -> float:
    with torch.no_grad():
        return (model_fn(x).argmax(-1) == y).float().mean().item()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """These tensors are tiny: on a shared 2-core machine one thread is ~100× faster than two that spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained_digits() -> tuple[nn.Module, Tensor, Tensor]:
    """A 64-64-10 MLP trained with Adam on 1,000 digits; returns it with the 300 validation examples."""
    data = load_dataset(DataConfig(dataset="digits", train_size=1000, val_size=300), seed=0)
    torch.manual_seed(0)
    net = mlp([64, 64, 10])
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    order = torch.Generator().manual_seed(0)
    for _ in range(15):
        for idx in torch.randperm(len(data.y_train), generator=order).split(100):
            opt.zero_grad()
            F.cross_entropy(net(data.x_train[idx]), data.y_train[idx]).backward()
            opt.step()
    opt.zero_grad(set_to_none=True)
    return net.eval(), data.x_val, data.y_val


@pytest.mark.parametrize("eps", [0.1, torch.linspace(0.0, 0.4, 64)])
def test_fgsm_and_pgd_stay_in_eps_ball_and_valid_range(eps: float | Tensor) -> None:
    model_fn = module_fn(random_mlp())
    x, y = random_batch()
    eps_col = torch.as_tensor(eps).reshape(-1, 1)
    for x_adv in (fgsm(model_fn, x, y, eps, (LO, HI)),
                  pgd(model_fn, x, y, eps, steps=10, step_size=0.05, input_range=(LO, HI)),
                  pgd(model_fn, x, y, eps, steps=3, step_size=0.05, random_start=True,
                      generator=torch.Generator().manual_seed(1))):
        assert bool(((x_adv - x).abs() <= eps_col + 1e-6).all())
        assert x_adv.min().item() >= LO and x_adv.max().item() <= HI
    # Away from the box edges an FGSM coordinate moves by exactly ε (the gradient is almost surely non-zero).
    step = (fgsm(model_fn, x, y, eps, (LO, HI)) - x).abs()
    interior = ((x - eps_col) > LO) & ((x + eps_col) < HI)
    assert torch.allclose(step[interior], eps_col.expand_as(x)[interior], atol=1e-6)


def test_pgd_with_zero_steps_returns_input_or_random_start() -> None:
    model_fn = module_fn(random_mlp())
    x, y = random_batch()
    assert torch.equal(pgd(model_fn, x, y, 0.3, steps=0, step_size=0.02), x)
    start = pgd(model_fn, x, y, 0.3, steps=0, step_size=0.02, random_start=True,
                generator=torch.Generator().manual_seed(0))
    assert not torch.equal(start, x)
    assert (start - x).abs().max().item() <= 0.3 + 1e-6


def test_fgsm_on_linear_model_matches_closed_form_and_raises_every_loss() -> None:
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(5, 8, generator=g, dtype=torch.float64)
    bias = torch.randn(5, generator=g, dtype=torch.float64)
    x = torch.rand(40, 8, generator=g, dtype=torch.float64) * 1.6 - 0.8
    y = torch.randint(5, (40,), generator=g)

    def linear(inputs: Tensor) -> Tensor:
        return inputs @ weight.T + bias

    # ∂CE/∂x = Wᵀ(softmax(Wx + b) − onehot(y)), one row per example.
    grad = (torch.softmax(linear(x), -1) - F.one_hot(y, 5).double()) @ weight
    for eps in (0.05, 0.3):
        expected = (x + eps * grad.sign()).clamp(LO, HI)
        assert torch.allclose(fgsm(linear, x, y, eps, (LO, HI)), expected, atol=1e-12)
    # The loss is convex in x, so L(x + ε·sign g) ≥ L(x) + ε‖g‖₁ > L(x) for every example.
    gain = per_example_loss(linear, fgsm(linear, x, y, 0.05, (LO, HI)), y) - per_example_loss(linear, x, y)
    assert bool((gain >= 0.05 * grad.abs().sum(-1) - 1e-12).all())
    assert gain.min().item() > 0


def test_attacks_raise_loss_and_pgd_beats_fgsm_on_trained_mlp(trained_digits) -> None:
    net, x, y = trained_digits
    model_fn = module_fn(net)
    clean_acc = accuracy(model_fn, x, y)
    assert clean_acc >= 0.95
    clean_loss = per_example_loss(model_fn, x, y).mean()
    fgsm_loss = per_example_loss(model_fn, fgsm(model_fn, x, y, 0.1), y).mean()
    pgd_loss = per_example_loss(model_fn, pgd(model_fn, x, y, 0.1, steps=20, step_size=0.02), y).mean()
    assert 3 * clean_loss < fgsm_loss < pgd_loss
    # The paper's budget: ε 0.3 in [-1, 1] units, 40 steps of 0.02.
    assert accuracy(model_fn, pgd(model_fn, x, y, 0.3, steps=40, step_size=0.02), y) < 0.3


def test_pgd_random_start_is_reproducible_with_a_seeded_generator() -> None:
    model_fn = module_fn(random_mlp())
    x, y = random_batch()

    def run(seed: int) -> Tensor:
        return pgd(model_fn, x, y, 0.2, steps=5, step_size=0.05, random_start=True,
                   generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))


def test_fgsm_min_eps_hand_worked_one_feature_case() -> None:
    # logits [x, −x]: class 0 when x > 0. The loss gradient pushes x towards the other class, so FGSM
    # flips the label once ε exceeds |x|. Grid given unsorted on purpose.
    def model_fn(inputs: Tensor) -> Tensor:
        return torch.cat([inputs, -inputs], dim=1)

    x = torch.tensor([[0.35], [0.05], [0.9], [-0.25]])
    y = torch.tensor([0, 0, 0, 1])
    x_adv, eps_used, success = fgsm_min_eps(model_fn, x, y, [0.3, 0.1, 0.5, 0.2, 0.4], (LO, HI))
    assert success.tolist() == [True, True, False, True]
    assert torch.allclose(eps_used, torch.tensor([0.4, 0.1, 0.5, 0.3]))
    assert torch.allclose(x_adv, torch.tensor([[-0.05], [-0.05], [0.4], [0.05]]), atol=1e-6)


def test_fgsm_min_eps_finds_the_first_fooling_grid_value(trained_digits) -> None:
    net, x, y = trained_digits
    model_fn = module_fn(net)
    grid = torch.linspace(0.0, 0.5, 26)
    x_adv, eps_used, success = fgsm_min_eps(model_fn, x, y, grid, (LO, HI))
    assert success.float().mean().item() > 0.8
    assert bool(torch.isin(eps_used, grid).all())
    with torch.no_grad():
        assert bool((net(x_adv[success]).argmax(-1) != y[success]).all())
        assert bool((net(x_adv[~success]).argmax(-1) == y[~success]).all())
    index = torch.searchsorted(grid, eps_used)
    assert torch.allclose(x_adv, fgsm(model_fn, x, y, grid[index]))
    later = success & (index > 0)
    previous = fgsm(model_fn, x[later], y[later], grid[index[later] - 1])
    assert accuracy(model_fn, previous, y[later]) == 1.0


def test_model_function_helpers_agree_with_the_module_and_the_mixture_formula() -> None:
    net = random_mlp(1)
    spec = ParamSpec.from_module(net)
    w = spec.flatten(net)
    x, _ = random_batch()
    single = weight_sample_fn(spec, w)
    assert torch.allclose(single(x), net(x), atol=1e-5)
    same = expected_predictive_fn(spec, w.expand(4, -1))
    assert torch.allclose(same(x), torch.log_softmax(single(x), -1), atol=1e-5)
    other = random_mlp(2)
    mixture = expected_predictive_fn(spec, torch.stack([w, spec.flatten(other)]))
    expected = torch.log((torch.softmax(net(x), -1) + torch.softmax(other(x), -1)) / 2)
    assert torch.allclose(mixture(x), expected, atol=1e-5)


def test_attacks_leave_parameters_and_inputs_untouched() -> None:
    net = random_mlp()
    assert all(p.requires_grad for p in net.parameters())
    spec, w = ParamSpec.from_module(net), ParamSpec.from_module(net).flatten(net).requires_grad_(True)
    x, y = random_batch()
    x_before = x.clone()
    for model_fn in (module_fn(net), expected_predictive_fn(spec, w[None].expand(3, -1))):
        fgsm(model_fn, x, y, 0.1)
        pgd(model_fn, x, y, 0.1, steps=3, step_size=0.05)
        fgsm_min_eps(model_fn, x, y, [0.1, 0.2], (LO, HI))
        craft("pgd", model_fn, x, y, eps=0.1, steps=2, step_size=0.05, batch_size=16)
    assert all(p.grad is None for p in net.parameters())
    assert w.grad is None
    assert torch.equal(x, x_before)


def test_craft_batches_like_one_call_and_reports_success(trained_digits) -> None:
    """Success = classified correctly before the attack and wrongly after it."""
    net, x, y = trained_digits
    model_fn = module_fn(net)
    eps = torch.linspace(0.0, 0.3, len(y))
    crafted = craft("fgsm", model_fn, x, y, eps=eps, batch_size=37)
    assert torch.equal(crafted.x_adv, fgsm(model_fn, x, y, eps))
    assert torch.equal(crafted.eps_used, eps)
    with torch.no_grad():
        correct = net(x).argmax(-1) == y
        assert torch.equal(crafted.clean_correct, correct) and not bool(correct.all())
        assert torch.equal(crafted.success, correct & (net(crafted.x_adv).argmax(-1) != y))
    min_eps = craft("fgsm_min_eps", model_fn, x, y, eps_grid=[0.1, 0.2, 0.3], batch_size=64)
    x_adv, eps_used, success = fgsm_min_eps(model_fn, x, y, [0.1, 0.2, 0.3], (LO, HI))
    assert torch.equal(min_eps.x_adv, x_adv) and torch.equal(min_eps.eps_used, eps_used)
    assert torch.equal(min_eps.success, success & correct)
    with pytest.raises(ConfigError, match="unknown attack 'cw'"):
        craft("cw", model_fn, x, y)
