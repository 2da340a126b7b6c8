"""SGLD against a Gaussian posterior known in closed form, its schedules, determinism and validation."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from apd.config import SGLDConfig
from apd.nets import mlp
from apd.samplers.sgld import SGLD, prefetch_pays
from apd.schedules import (
    ConstantSchedule,
    CyclicalSchedule,
    PolynomialSchedule,
    StepSchedule,
    is_thinned_sample,
    make_schedule,
    thinned_count,
)
from tests.helpers import assert_gaussian_moments


@dataclass(frozen=True)
class LinearRegression:
    """y = Xw + 𝒩(0, noise_std²) with prior w ~ 𝒩(0, prior_std²·I); the posterior is Gaussian with
    Σ = (XᵀX/σ² + I/prior_std²)⁻¹ and mean Σ·Xᵀy/σ² (Bishop, PRML 2006, eq. 3.53–3.54)."""

    x: Tensor
    y: Tensor
    noise_std: float
    prior_std: float

    @property
    def precision(self) -> np.ndarray:
        x = self.x.numpy()
        return x.T @ x / self.noise_std**2 + np.eye(x.shape[1]) / self.prior_std**2

    @property
    def posterior_cov(self) -> np.ndarray:
        return np.linalg.inv(self.precision)

    @property
    def posterior_mean(self) -> np.ndarray:
        return self.posterior_cov @ self.x.numpy().T @ self.y.numpy() / self.noise_std**2

    def lr_for(self, eps_times_max_curvature: float) -> float:
        """The SGLD lr giving ε·λ_max(precision) = the argument (its discretisation bias ≈ a quarter)."""
        return eps_times_max_curvature / np.linalg.eigvalsh(self.precision).max() * len(self.y)


@pytest.fixture(scope="module")
def regression() -> LinearRegression:
    """50 points, 3 features with pairwise correlation 0.7, so the posterior is strongly correlated."""
    gen = torch.Generator().manual_seed(0)
    corr = torch.full((3, 3), 0.7, dtype=torch.float64).fill_diagonal_(1.0)
    x = torch.randn(50, 3, generator=gen, dtype=torch.float64) @ torch.linalg.cholesky(corr).T
    w_true = torch.tensor([1.0, -0.5, 0.8], dtype=torch.float64)
    noise_std = 1.0
    y = x @ w_true + noise_std * torch.randn(50, generator=gen, dtype=torch.float64)
    return LinearRegression(x, y, noise_std, prior_std=0.5)


def run_chains(
    problem: LinearRegression,
    lr: float,
    *,
    chains: int = 400,
    burn_in: int = 1000,
    steps: int = 3000,
    thin: int = 10,
    temperature: float = 1.0,
    batch_size: int | None = None,
    schedule: StepSchedule | None = None,
) -> np.ndarray:
    """Run ``chains`` independent SGLD chains as one [chains, d] parameter; return the thinned
    post-burn-in states of all chains, [chains·kept, d]. The loss is each chain's mean Gaussian NLL over
    its own minibatch (all data when ``batch_size`` is None), summed over chains, so every chain gets
    exactly its own mean-NLL gradient."""
    n, d = problem.x.shape
    gen = torch.Generator().manual_seed(1)
    w = nn.Parameter(problem.prior_std * torch.randn(chains, d, generator=gen, dtype=torch.float64))
    opt = SGLD([w], lr, num_data=n, prior_std=problem.prior_std, temperature=temperature, seed=2)
    kept = []
    for t in range(steps):
        if schedule is not None:
            schedule.apply(opt, t, temperature)
        if batch_size is None:
            residual = problem.x @ w.T - problem.y[:, None]  # [n, chains]
            mean_nll = (residual**2).mean(dim=0) / (2 * problem.noise_std**2)
        else:
            idx = torch.randint(0, n, (chains, batch_size), generator=gen)
            residual = (problem.x[idx] * w[:, None, :]).sum(dim=2) - problem.y[idx]  # [chains, batch]
            mean_nll = (residual**2).mean(dim=1) / (2 * problem.noise_std**2)
        opt.zero_grad()
        mean_nll.sum().backward()
        opt.step()
        if t >= burn_in and (t - burn_in) % thin == 0:
            kept.append(w.detach().clone())
    return torch.cat(kept).numpy()


# ---------------------------------------------------------------------------------------------- posterior


def test_full_batch_sgld_matches_gaussian_posterior(regression: LinearRegression) -> None:
    samples = run_chains(regression, regression.lr_for(0.1))
    assert_gaussian_moments(samples, regression.posterior_mean, regression.posterior_cov)


def test_temperature_scales_posterior_covariance(regression: LinearRegression) -> None:
    samples = run_chains(regression, regression.lr_for(0.1), temperature=0.25)
    assert_gaussian_moments(samples, regression.posterior_mean, 0.25 * regression.posterior_cov)


def test_minibatch_sgld_recovers_posterior_mean(regression: LinearRegression) -> None:
    samples = run_chains(regression, regression.lr_for(0.1), batch_size=10)
    assert_gaussian_moments(samples, regression.posterior_mean, regression.posterior_cov, cov_rel_tol=np.inf)


def test_polynomial_schedule_recovers_posterior_mean(regression: LinearRegression) -> None:
    b, gamma = 500.0, 0.55
    schedule = PolynomialSchedule(a=regression.lr_for(0.1) * b**gamma, b=b, gamma=gamma)  # lr_0 as above
    assert schedule.lr(3000) == pytest.approx(schedule.lr(0) * (500 / 3500) ** 0.55)
    samples = run_chains(regression, schedule.lr(0), burn_in=1500, steps=4000, schedule=schedule)
    assert_gaussian_moments(samples, regression.posterior_mean, regression.posterior_cov, cov_rel_tol=np.inf)


def test_zero_temperature_is_sgd_with_half_lr_and_prior_weight_decay() -> None:
    """T = 0: θ ← θ − (lr/2)·(∇mean_nll + θ/(N·prior_std²)) is SGD with lr/2 and that weight decay."""
    lr, num_data, prior_std = 0.2, 1000, 0.3
    x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 3
    torch.manual_seed(0)
    net_sgld = mlp([8, 5, 3])
    net_sgd = mlp([8, 5, 3])
    net_sgd.load_state_dict(net_sgld.state_dict())
    sgld = SGLD(net_sgld.parameters(), lr, num_data, prior_std, temperature=0.0, seed=0)
    sgd = torch.optim.SGD(net_sgd.parameters(), lr=lr / 2, weight_decay=1 / (num_data * prior_std**2))
    for net, opt in ((net_sgld, sgld), (net_sgd, sgd)):
        for _ in range(5):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    for p_sgld, p_sgd in zip(net_sgld.parameters(), net_sgd.parameters(), strict=True):
        torch.testing.assert_close(p_sgld, p_sgd, rtol=1e-6, atol=1e-7)


def test_noise_variance_per_step_is_lr_times_temperature_over_n() -> None:
    """With zero gradient and a huge prior the step is pure noise: Var(Δθ) = ε·T = lr·T/N."""
    theta = nn.Parameter(torch.zeros(200_000, dtype=torch.float64))
    opt = SGLD([theta], lr=0.5, num_data=20, prior_std=1e9, temperature=0.3, seed=0)
    theta.grad = torch.zeros_like(theta)
    opt.step()
    assert theta.detach().var().item() == pytest.approx(0.5 * 0.3 / 20, rel=0.02)
    assert abs(theta.detach().mean().item()) < 4 * math.sqrt(0.5 * 0.3 / 20 / 200_000)


# ---------------------------------------------------------------------------------------------- schedules


def test_constant_schedule() -> None:
    schedule = ConstantSchedule(0.05)
    assert [schedule.lr(t) for t in (0, 1, 10_000)] == [0.05, 0.05, 0.05]
    assert schedule.is_sampling(0) and schedule.noise_on(12345)


@pytest.mark.parametrize(
    ("a", "b", "gamma", "lr_at_0", "lr_at_10"),
    [(0.1, 1.0, 0.5, 0.1, 0.1 / math.sqrt(11)), (0.6, 4.0, 1.0, 0.15, 0.6 / 14),
     (0.05, 2.0, 0.0, 0.05, 0.05)],
)
def test_polynomial_schedule_values(a: float, b: float, gamma: float, lr_at_0: float, lr_at_10: float,
                                    ) -> None:
    schedule = PolynomialSchedule(a, b, gamma)
    assert schedule.lr(0) == pytest.approx(lr_at_0, rel=1e-12)
    assert schedule.lr(10) == pytest.approx(lr_at_10, rel=1e-12)
    assert schedule.is_sampling(10) and schedule.noise_on(10)


def test_cyclical_schedule_values_and_phases() -> None:
    schedule = CyclicalSchedule(lr0=0.1, total_iterations=100, cycles=5, explore_fraction=0.8)
    assert schedule.cycle_length == 20
    assert schedule.lr(0) == pytest.approx(0.1)  # start of a cycle: cos 0 = 1
    assert schedule.lr(10) == pytest.approx(0.05)  # middle: cos(π/2) = 0
    assert schedule.lr(19) == pytest.approx(0.05 * (1 - math.cos(math.pi / 20)))  # last step of the cycle
    assert schedule.lr(20) == pytest.approx(0.1) and schedule.lr(50) == pytest.approx(0.05)  # restarts
    noisy = [t for t in range(100) if schedule.noise_on(t)]
    assert noisy == [t for t in range(100) if t % 20 >= 16]  # the last 20 % of every cycle's updates
    sampling = [t for t in range(101) if schedule.is_sampling(t)]
    assert sampling == [t + 1 for t in noisy]  # the iterates those updates make: 17 … 20, 37 … 40, …
    assert not schedule.is_sampling(16) and schedule.is_sampling(20) and not schedule.is_sampling(21)
    assert CyclicalSchedule(0.1, total_iterations=101, cycles=5, explore_fraction=0.5).cycle_length == 21
    assert CyclicalSchedule(0.1, 100, cycles=4, explore_fraction=0.7).is_sampling(int(0.7 * 25) + 2)
    assert not CyclicalSchedule(0.1, 100, cycles=4, explore_fraction=0.0).is_sampling(0)  # θ_0: no update


def test_schedule_apply_sets_lr_and_switches_noise_off_while_exploring() -> None:
    groups = [{"params": [nn.Parameter(torch.zeros(3))]}, {"params": [nn.Parameter(torch.zeros(2))]}]
    opt = SGLD(groups, lr=1.0, num_data=10, seed=0)
    schedule = CyclicalSchedule(lr0=0.1, total_iterations=100, cycles=5, explore_fraction=0.8)
    schedule.apply(opt, 10, temperature=0.5)
    assert [(g["lr"], g["temperature"]) for g in opt.param_groups] == [(pytest.approx(0.05), 0.0)] * 2
    schedule.apply(opt, 16, temperature=0.5)
    assert [g["temperature"] for g in opt.param_groups] == [0.5, 0.5]


def test_make_schedule_builds_the_configured_one() -> None:
    assert make_schedule(SGLDConfig(lr=0.02)) == ConstantSchedule(0.02)
    poly = make_schedule(SGLDConfig(lr=0.3, schedule="polynomial", poly_b=4.0, poly_gamma=0.5))
    assert poly == PolynomialSchedule(0.3, 4.0, 0.5) and poly.lr(0) == pytest.approx(0.15)
    cyc = make_schedule(SGLDConfig(lr=0.1, schedule="cyclical", iterations=1000, cycles=4,
                                   explore_fraction=0.9))
    assert cyc == CyclicalSchedule(0.1, 1000, 4, 0.9) and cyc.cycle_length == 250 and cyc.is_sampling(250)


@pytest.mark.parametrize("schedule", ["constant", "polynomial", "cyclical"])
def test_thinned_count_in_closed_form_counts_the_kept_iterates(schedule: str) -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        iterations = int(rng.integers(1, 400))
        s = SGLDConfig(iterations=iterations, burn_in=int(rng.integers(0, iterations)), thin=int(rng.integers(1, 50)),
                       schedule=schedule, cycles=int(rng.integers(1, min(iterations, 20) + 1)),
                       explore_fraction=float(rng.choice([0.0, 0.1, 1 / 3, 0.8, 0.99, rng.random()])))
        kept = make_schedule(s)
        assert thinned_count(s) == sum(is_thinned_sample(s, kept, t) for t in range(s.burn_in, s.iterations)), s
    assert thinned_count(SGLDConfig(iterations=10**18, burn_in=0, thin=10)) == 10**17  # no loop over them


@pytest.mark.parametrize(
    "build",
    [lambda: ConstantSchedule(0.0), lambda: PolynomialSchedule(0.1, 0.0, 0.5),
     lambda: PolynomialSchedule(0.1, 1.0, 1.5), lambda: CyclicalSchedule(0.1, 10, 0, 0.5),
     lambda: CyclicalSchedule(0.1, 10, 11, 0.5), lambda: CyclicalSchedule(0.1, 10, 2, 1.0)],
)
def test_schedule_rejects_bad_parameters(build) -> None:
    with pytest.raises(ValueError, match="schedule needs"):
        build()


# ------------------------------------------------------------------------------------ determinism, resume


def _small_problem() -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    return mlp([16, 12, 4]), torch.randn(64, 16, generator=gen), torch.randint(0, 4, (64,), generator=gen)


def _train(net: nn.Module, opt: SGLD, x: Tensor, y: Tensor, steps: range) -> None:
    """Minibatches of 16 chosen by step number, cyclical schedule (so noise switches on and off)."""
    schedule = CyclicalSchedule(lr0=0.05, total_iterations=40, cycles=4, explore_fraction=0.5)
    for t in steps:
        schedule.apply(opt, t)
        rows = slice(16 * (t % 4), 16 * (t % 4 + 1))
        opt.zero_grad(set_to_none=False)  # a parameter outside the loss keeps a zero gradient
        nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
        opt.step()


def _flat(net: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.mark.parametrize(("device", "threads", "cores", "processes", "expected"), [
    ("cpu", 1, 2, 1, True), ("cpu", 2, 2, 1, False), ("cpu", 1, 1, 1, False), ("cpu", 4, 16, 1, True),
    ("cuda", 1, 2, 1, False), ("cpu", 1, 2, 2, False), ("cpu", 1, 4, 2, True), ("cpu", 1, 16, 9, False)])
def test_prefetch_pays_only_on_cpu_with_a_free_core(monkeypatch: pytest.MonkeyPatch, device: str, threads: int,
                                                    cores: int, processes: int, expected: bool) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setattr("apd.samplers.sgld._usable_cores", lambda: cores)
    assert prefetch_pays(torch.device(device), processes) is expected


def test_prefetch_gives_the_same_trajectory() -> None:
    finals = []
    for prefetch in (False, True):
        net, x, y = _small_problem()
        opt = SGLD(net.parameters(), lr=0.05, num_data=64, prior_std=0.5, seed=7, prefetch_noise=prefetch)
        _train(net, opt, x, y, range(40))
        finals.append((_flat(net), opt.state_dict()["sgld_noise_generator"]))
    assert torch.equal(finals[0][0], finals[1][0])
    assert torch.equal(finals[0][1], finals[1][1])  # the checkpointed generator state agrees too
    net, x, y = _small_problem()
    assert not torch.equal(finals[0][0], _flat(net))


@pytest.mark.parametrize(("prefetch_before", "prefetch_after"), [(False, False), (True, True), (True, False),
                                                                 (False, True)])
def test_checkpoint_resume_is_bit_identical(prefetch_before: bool, prefetch_after: bool) -> None:
    net, x, y = _small_problem()
    opt = SGLD(net.parameters(), lr=0.05, num_data=64, seed=3, prefetch_noise=prefetch_before)
    _train(net, opt, x, y, range(40))
    uninterrupted = _flat(net)

    net, x, y = _small_problem()
    opt = SGLD(net.parameters(), lr=0.05, num_data=64, seed=3, prefetch_noise=prefetch_before)
    _train(net, opt, x, y, range(17))  # stops mid-cycle, while noise is on, with a draw prefetched
    buffer = io.BytesIO()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict()}, buffer)
    _train(net, opt, x, y, range(17, 20))  # the interrupted run went on a little before dying

    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    resumed_net, _, _ = _small_problem()
    resumed_net.load_state_dict(checkpoint["net"])
    resumed = SGLD(resumed_net.parameters(), lr=1.0, num_data=1, seed=99, prefetch_noise=prefetch_after)
    resumed.load_state_dict(checkpoint["opt"])
    assert resumed.param_groups[0]["num_data"] == 64
    _train(resumed_net, resumed, x, y, range(17, 40))
    assert torch.equal(_flat(resumed_net), uninterrupted)


def test_seed_and_generator_fix_the_noise() -> None:
    def run(**kwargs) -> Tensor:
        net, x, y = _small_problem()
        _train(net, SGLD(net.parameters(), lr=0.05, num_data=64, **kwargs), x, y, range(20))
        return _flat(net)

    assert torch.equal(run(seed=5), run(generator=torch.Generator().manual_seed(5)))
    assert not torch.equal(run(seed=5), run(seed=6))
    # Without either, the seed is drawn from torch's global generator, which _small_problem reseeds.
    assert torch.equal(run(), run())


@pytest.mark.parametrize("prefetch", [False, True])
def test_param_group_added_mid_run_gets_noise(prefetch: bool) -> None:
    net, x, y = _small_problem()
    extra = nn.Parameter(torch.zeros(5))
    opt = SGLD(net.parameters(), lr=0.05, num_data=64, seed=1, prefetch_noise=prefetch)
    _train(net, opt, x, y, range(30, 33))  # noise on (sampling phase of the cycle)
    opt.add_param_group({"params": [extra], "lr": 0.1})
    extra.grad = torch.zeros(5)  # only the prior and the noise move it
    _train(net, opt, x, y, range(33, 36))
    assert torch.all(extra.detach() != 0)
    assert opt.param_groups[1]["num_data"] == 64


def test_prefetch_modes_agree_across_add_param_group() -> None:
    finals = []
    for prefetch in (False, True):
        net, x, y = _small_problem()
        extra = nn.Parameter(torch.zeros(5))
        opt = SGLD(net.parameters(), lr=0.05, num_data=64, seed=1, prefetch_noise=prefetch)
        _train(net, opt, x, y, range(30, 33))
        opt.add_param_group({"params": [extra]})
        extra.grad = torch.ones(5)
        _train(net, opt, x, y, range(33, 36))
        finals.append(torch.cat([_flat(net), extra.detach()]))
    assert torch.equal(finals[0], finals[1])


def _steps_by_closure(given: bool) -> tuple[Tensor, list[float]]:
    """Five SGLD steps on one minibatch, the closure handed to ``step`` or called before it: the weights after
    them and the losses."""
    net, x, y = _small_problem()
    opt = SGLD(net.parameters(), lr=0.05, num_data=64, seed=2)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[:16]), y[:16])
        loss.backward()
        return loss

    losses = []
    for _ in range(5):
        if given:
            losses.append(opt.step(closure).item())
        else:
            losses.append(closure().item())
            assert opt.step() is None
    return _flat(net), losses


def test_a_step_given_a_closure_is_the_step_after_its_backward_and_returns_its_loss() -> None:
    """torch.optim's closure convention: ``step(closure)`` evaluates the closure with gradients on, then
    updates, as calling it first and then ``step()`` does."""
    (after_call, called), (after_given, given) = _steps_by_closure(False), _steps_by_closure(True)
    assert torch.equal(after_call, after_given) and called == given and len(set(given)) == 5


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_state_loaded_into_an_optimizer_that_stepped_on_repeats_the_steps_after_it(prefetch: bool) -> None:
    """Loading a state dict into the optimizer that made it, after further steps (a draw prefetched, or
    not), rewinds its noise to that state: the same steps again make the same updates."""
    net, x, y = _small_problem()
    opt = SGLD(net.parameters(), lr=0.05, num_data=64, seed=4, prefetch_noise=prefetch)
    _train(net, opt, x, y, range(30, 33))  # noise on
    saved = io.BytesIO()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict()}, saved)
    _train(net, opt, x, y, range(33, 36))
    first = _flat(net)
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=True)
    net.load_state_dict(checkpoint["net"])
    opt.load_state_dict(checkpoint["opt"])
    _train(net, opt, x, y, range(33, 36))
    assert torch.equal(_flat(net), first)


def test_a_parameter_group_without_gradients_is_left_as_it_is() -> None:
    net, x, y = _small_problem()
    frozen = nn.Parameter(torch.ones(5))
    opt = SGLD([{"params": list(net.parameters())}, {"params": [frozen]}], lr=0.05, num_data=64, seed=1)
    _train(net, opt, x, y, range(30, 33))  # noise on: a group with gradients moves, one without stays
    assert frozen.grad is None and torch.equal(frozen.detach(), torch.ones(5))
    assert not torch.equal(_flat(net), _flat(_small_problem()[0]))


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"lr": 0.0}, "lr must be positive"), ({"lr": -1.0}, "lr must be positive"),
     ({"lr": float("nan")}, "lr must be positive"), ({"num_data": 0}, "num_data must be at least 1"),
     ({"prior_std": 0.0}, "prior_std must be positive"), ({"temperature": -0.1}, "temperature must be"),
     ({"seed": 1, "generator": torch.Generator()}, "either a seed or a generator")],
)
def test_rejects_bad_parameters(kwargs: dict, message: str) -> None:
    args = {"lr": 0.1, "num_data": 10} | kwargs
    with pytest.raises(ValueError, match=message):
        SGLD([nn.Parameter(torch.zeros(3))], **args)


def test_rejects_bad_lr_set_by_a_schedule_and_mixed_dtypes_and_foreign_state() -> None:
    p = nn.Parameter(torch.zeros(3))
    opt = SGLD([p], lr=0.1, num_data=10, seed=0)
    opt.param_groups[0]["lr"] = 0.0
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match="lr must be positive"):
        opt.step()
    with pytest.raises(ValueError, match="one device and dtype"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(2, dtype=torch.float64))]})
    assert len(opt.param_groups) == 1  # the rejected group was not kept
    with pytest.raises(ValueError, match="not an SGLD state_dict"):
        opt.load_state_dict(torch.optim.SGD([p], lr=0.1).state_dict())
