"""L∞ adversarial attacks (FGSM, PGD, smallest-ε FGSM) against any differentiable classifier.

Every attack takes a *model function* ``model_fn: x [N, F] → scores [N, C]`` whose scores are logits or
log-probabilities: the loss is ``F.cross_entropy``, which applies log-softmax first, and log-softmax
leaves log-probabilities unchanged, so both kinds give the same loss. A model function can be one
weight sample (:func:`weight_sample_fn`, the gray-box attack of Wang et al. 2018), the expected
predictive of K samples (:func:`expected_predictive_fn`, white-box / expectation over transformation,
Athalye et al. 2018) or a module (:func:`module_fn`, e.g. an MC-dropout net in train mode).

Inputs live in a box ``input_range = (lo, hi)`` (:data:`apd.data.INPUT_RANGE`, [-1, 1]); every result
is clipped into it. Attacks never modify ``x`` and differentiate with ``torch.autograd.grad`` with
respect to the input only, so no gradient reaches a parameter's ``.grad``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apd.data import INPUT_RANGE
from apd.errors import ConfigError
from apd.nets import ParamSpec, predict_logits

ModelFn = Callable[[Tensor], Tensor]
Epsilon = float | Tensor
ATTACKS = ("fgsm", "fgsm_min_eps", "pgd")


class Crafted(NamedTuple):
    """Output of :func:`craft`: adversarial inputs [N, F], whether each succeeded [N] (bool: the model
    classified the clean input correctly and misclassifies the adversarial one), the ε each was made
    with [N], and whether the model classified the clean input correctly [N]."""

    x_adv: Tensor
    success: Tensor
    eps_used: Tensor
    clean_correct: Tensor


def weight_sample_fn(spec: ParamSpec, weights: Tensor) -> ModelFn:
    """Model function of one weight vector θ [D]: x ↦ f(x; θ), the logits of the MLP ``spec``."""
    if weights.dim() != 1:
        raise ValueError(f"weight_sample_fn takes one weight vector [D], got shape {list(weights.shape)}")

    def model_fn(x: Tensor) -> Tensor:
        return predict_logits(spec, weights[None], x)[0]

    return model_fn


def expected_predictive_fn(spec: ParamSpec, weights: Tensor) -> ModelFn:
    """Model function of the expected predictive of K weight vectors θ_k [K, D] (log-probabilities):

    log p(y | x) = log (1/K) Σ_k softmax(f(x; θ_k))_y = logsumexp_k log_softmax(f(x; θ_k))_y − log K,

    the Bayesian model average that a white-box (EOT) attacker differentiates (Athalye et al. 2018).
    """
    if weights.dim() != 2 or weights.shape[0] < 1:
        raise ValueError(f"expected_predictive_fn takes weights [K, D] with K ≥ 1, got {list(weights.shape)}")
    log_k = math.log(weights.shape[0])

    def model_fn(x: Tensor) -> Tensor:
        log_probs = torch.log_softmax(predict_logits(spec, weights, x), dim=-1)
        return torch.logsumexp(log_probs, dim=0) - log_k

    return model_fn


def module_fn(module: nn.Module) -> ModelFn:
    """Model function x ↦ module(x). The module is used as it is: in train mode an MC-dropout net draws
    a fresh dropout mask on every call (each attack step, each success check)."""

    def model_fn(x: Tensor) -> Tensor:
        return module(x)

    return model_fn


def fgsm(
    model_fn: ModelFn, x: Tensor, y: Tensor, eps: Epsilon, input_range: tuple[float, float] = INPUT_RANGE
) -> Tensor:
    """Fast gradient sign method (Goodfellow, Shlens & Szegedy 2015):

    x_adv = clip_[lo, hi](x + ε · sign(∇ₓ L(model_fn(x), y))),  L the summed cross-entropy.

    ``eps`` is a float or a per-example tensor [N].
    """
    lo, hi = _checked_range(input_range)
    return (x.detach() + _eps_column(eps, x) * _loss_gradient_sign(model_fn, x, y)).clamp(lo, hi)


def pgd(
    model_fn: ModelFn,
    x: Tensor,
    y: Tensor,
    eps: Epsilon,
    steps: int,
    step_size: float,
    input_range: tuple[float, float] = INPUT_RANGE,
    random_start: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """L∞ projected gradient descent on the loss (Madry et al. 2018), ``steps`` iterations of

    x ← clip_[lo, hi](Π_{‖x − x₀‖∞ ≤ ε}(x + α · sign(∇ₓ L(model_fn(x), y)))),  α = ``step_size``,

    from x₀, or with ``random_start`` from clip(x₀ + U[−ε, ε]) drawn with ``generator``. Zero steps
    return the start point. ``eps`` is a float or a per-example tensor [N].
    """
    if steps < 0 or step_size <= 0:
        raise ValueError(f"pgd needs steps ≥ 0 and step_size > 0, got {steps} and {step_size}")
    lo, hi = _checked_range(input_range)
    x0 = x.detach()
    eps_col = _eps_column(eps, x)
    lower, upper = (x0 - eps_col).clamp(lo, hi), (x0 + eps_col).clamp(lo, hi)
    if random_start:
        noise = torch.rand(x0.shape, generator=generator, dtype=x0.dtype, device=x0.device)
        x_adv = (x0 + (2 * noise - 1) * eps_col).clamp(lo, hi)
    else:
        x_adv = x0.clone()
    for _ in range(steps):
        x_adv = x_adv + step_size * _loss_gradient_sign(model_fn, x_adv, y)
        x_adv = torch.clamp(x_adv, lower, upper)
    return x_adv


def fgsm_min_eps(
    model_fn: ModelFn,
    x: Tensor,
    y: Tensor,
    eps_grid: Sequence[float] | Tensor,
    input_range: tuple[float, float] = INPUT_RANGE,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per example, the smallest ε on ``eps_grid`` whose FGSM example fools the model (the search of
    the APD reference code, Wang et al. 2018): ε* = min{ε ∈ grid : argmax model_fn(x_adv(ε)) ≠ y}.

    The FGSM direction sign(∇ₓ L) does not depend on ε, so one gradient is taken and every grid value
    is evaluated in one batched forward pass. Returns (x_adv [N, F], eps_used [N], success [N]); an
    example no grid value fools has success False and the largest-ε attempt as x_adv and eps_used.
    """
    lo, hi = _checked_range(input_range)
    grid = torch.as_tensor(eps_grid, dtype=x.dtype, device=x.device).flatten()
    if grid.numel() == 0 or bool((grid < 0).any()):
        raise ValueError(f"eps_grid must be a non-empty list of ε ≥ 0, got {grid.tolist()}")
    grid = grid.sort().values
    direction = _loss_gradient_sign(model_fn, x, y)
    n_grid, n = grid.numel(), x.shape[0]
    candidates = (x.detach() + grid.view(n_grid, *([1] * x.dim())) * direction).clamp(lo, hi)  # [G, N, …]
    with torch.no_grad():
        fooled = model_fn(candidates.flatten(0, 1)).argmax(-1).view(n_grid, n) != y
    success = fooled.any(dim=0)
    first = torch.where(success, fooled.int().argmax(dim=0), n_grid - 1)
    return candidates[first, torch.arange(n, device=x.device)], grid[first], success


def craft(
    attack_name: str,
    model_fn: ModelFn,
    x: Tensor,
    y: Tensor,
    *,
    eps: Epsilon = 0.3,
    steps: int = 40,
    step_size: float = 0.02,
    eps_grid: Sequence[float] | Tensor = (),
    input_range: tuple[float, float] = INPUT_RANGE,
    random_start: bool = False,
    generator: torch.Generator | None = None,
    batch_size: int = 500,
) -> Crafted:
    """Run ``attack_name`` (one of :data:`ATTACKS`) on x in batches of ``batch_size``.

    ``fgsm`` uses ``eps``; ``pgd`` uses ``eps``, ``steps``, ``step_size``, ``random_start`` and
    ``generator``; ``fgsm_min_eps`` uses ``eps_grid``. An attack succeeds only on an input the model
    classified correctly before the attack: argmax model_fn(x) = y and argmax model_fn(x_adv) ≠ y.
    """
    if attack_name not in ATTACKS:
        raise ConfigError(f"unknown attack {attack_name!r}; choose one of {', '.join(ATTACKS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    eps_all = _eps_column(eps, x).reshape(-1).expand(x.shape[0])
    parts: list[Crafted] = []
    for start in range(0, x.shape[0], batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        eps_b = eps_all[start:start + batch_size]
        with torch.no_grad():
            correct = model_fn(xb).argmax(-1) == yb
        if attack_name == "fgsm_min_eps":
            x_adv, eps_b, success = fgsm_min_eps(model_fn, xb, yb, eps_grid, input_range)
        else:
            if attack_name == "fgsm":
                x_adv = fgsm(model_fn, xb, yb, eps_b, input_range)
            else:
                x_adv = pgd(model_fn, xb, yb, eps_b, steps, step_size, input_range, random_start, generator)
            with torch.no_grad():
                success = model_fn(x_adv).argmax(-1) != yb
        parts.append(Crafted(x_adv, success & correct, eps_b, correct))
    return Crafted(*(torch.cat(field) for field in zip(*parts, strict=True)))


def _loss_gradient_sign(model_fn: ModelFn, x: Tensor, y: Tensor) -> Tensor:
    """sign(∇ₓ Σ_i CE(model_fn(x)_i, y_i)), taken w.r.t. a detached copy of x only."""
    x_var = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(model_fn(x_var), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, x_var)
    return grad.sign()


def _eps_column(eps: Epsilon, x: Tensor) -> Tensor:
    """ε as a tensor that broadcasts against x [N, ...]: a scalar, or [N] reshaped to [N, 1, …]."""
    eps_t = torch.as_tensor(eps, dtype=x.dtype, device=x.device)
    if eps_t.dim() == 1 and eps_t.shape[0] == x.shape[0]:
        eps_t = eps_t.view(-1, *([1] * (x.dim() - 1)))
    elif eps_t.dim() != 0:
        raise ValueError(f"eps must be a number or a tensor [{x.shape[0]}], got shape {list(eps_t.shape)}")
    if bool((eps_t < 0).any()):
        raise ValueError("eps must be non-negative")
    return eps_t


def _checked_range(input_range: tuple[float, float]) -> tuple[float, float]:
    """(lo, hi) of the valid input box, checked to be a non-empty interval."""
    lo, hi = input_range
    if not lo < hi:
        raise ValueError(f"input_range must be (lo, hi) with lo < hi, got {input_range}")
    return lo, hi
