"""SGLD's step-size schedules t ↦ lr_t (constant, polynomial, cyclical) and which iterates a chain keeps:
plain functions of the configuration, so that it can be checked before any work (e.g. that a chain keeps
a sample at all) without the samplers."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from apd.config import SGLDConfig

if TYPE_CHECKING:
    from torch.optim import Optimizer


class StepSchedule(ABC):
    """A step-size schedule t ↦ lr_t for :class:`SGLD` (t counts optimizer steps from 0)."""

    @abstractmethod
    def lr(self, t: int) -> float:
        """The step size ``lr`` (ε·N) at iteration t."""

    def is_sampling(self, t: int) -> bool:
        """Whether θ_t, the parameters after t updates, is a posterior sample (burn-in is the caller's
        business)."""
        return True

    def noise_on(self, t: int) -> bool:
        """Whether update t (θ_t → θ_{t+1}) injects Langevin noise (off means a plain gradient step)."""
        return True

    def sampling_count(self, start: int, step: int, n: int) -> int:
        """How many of the n iterates start, start + step, …, start + (n − 1)·step are samples
        (:meth:`is_sampling`), in closed form: no loop over the iterations."""
        return n

    def apply(self, optimizer: Optimizer, t: int, temperature: float = 1.0) -> None:
        """Set every param group's ``lr`` to lr_t and its ``temperature`` to ``temperature``, or to 0
        where :meth:`noise_on` says the step injects no noise."""
        lr = self.lr(t)
        step_temperature = temperature if self.noise_on(t) else 0.0
        for group in optimizer.param_groups:
            group["lr"] = lr
            group["temperature"] = step_temperature


@dataclass(frozen=True)
class ConstantSchedule(StepSchedule):
    """lr_t = lr (the paper's reference run)."""

    step_size: float

    def __post_init__(self) -> None:
        if not self.step_size > 0:
            raise ValueError(f"constant schedule needs lr > 0, got {self.step_size!r}")

    def lr(self, t: int) -> float:
        return self.step_size


@dataclass(frozen=True)
class PolynomialSchedule(StepSchedule):
    """lr_t = a·(b + t)^(−γ), the decaying step of Welling & Teh (2011); they need γ ∈ (0.5, 1] for
    the SGLD chain to converge, γ = 0 gives a constant step a·b⁰ = a."""

    a: float
    b: float
    gamma: float

    def __post_init__(self) -> None:
        if not (self.a > 0 and self.b > 0 and 0 <= self.gamma <= 1):
            raise ValueError(f"polynomial schedule needs a > 0, b > 0, 0 <= gamma <= 1, got a={self.a!r}, "
                             f"b={self.b!r}, gamma={self.gamma!r}")

    def lr(self, t: int) -> float:
        return self.a * (self.b + t) ** (-self.gamma)


@dataclass(frozen=True)
class CyclicalSchedule(StepSchedule):
    """Cyclical SGLD (Zhang, Li, Zhang, Chen & Wilson, ICLR 2020), M cycles over T iterations:

    lr_t = lr0/2 · (cos(π·mod(t, L)/L) + 1),   L = ⌈T/M⌉,

    restarting at lr0 every L iterations. Update t explores (a plain gradient step, no noise) while
    mod(t, L)/L < explore_fraction and samples (a Langevin step) afterwards; the samples are the iterates
    the Langevin steps make, θ_{t+1} for every sampling update t, so a cycle's last one is kept and none
    that an exploring step made.
    """

    lr0: float
    total_iterations: int
    cycles: int
    explore_fraction: float

    def __post_init__(self) -> None:
        valid = self.lr0 > 0 and 1 <= self.cycles <= self.total_iterations and 0 <= self.explore_fraction < 1
        if not valid:
            raise ValueError(
                f"cyclical schedule needs lr0 > 0, 1 <= cycles <= total_iterations and 0 <= explore_fraction "
                f"< 1, got lr0={self.lr0!r}, total_iterations={self.total_iterations!r}, "
                f"cycles={self.cycles!r}, explore_fraction={self.explore_fraction!r}")

    @property
    def cycle_length(self) -> int:
        """L = ⌈T/M⌉ iterations."""
        return -(-self.total_iterations // self.cycles)

    def _phase(self, t: int) -> float:
        """mod(t, L)/L ∈ [0, 1): how far iteration t is through its cycle."""
        return (t % self.cycle_length) / self.cycle_length

    def lr(self, t: int) -> float:
        return self.lr0 / 2 * (math.cos(math.pi * self._phase(t)) + 1)

    def noise_on(self, t: int) -> bool:
        return self._phase(t) >= self.explore_fraction

    def is_sampling(self, t: int) -> bool:
        return t > 0 and self.noise_on(t - 1)

    def sampling_count(self, start: int, step: int, n: int) -> int:
        # θ_t is a sample when t > 0 and update u = t − 1 has mod(u, L) ≥ r0, the first offset whose phase
        # reaches explore_fraction (found with the float comparison noise_on makes), and
        # [mod(u, L) ≥ r0] = ⌊(u + L − r0)/L⌋ − ⌊u/L⌋; θ_0 (start 0) is the initialisation, no sample
        if start == 0 and n > 0:
            start, n = step, n - 1
        length = self.cycle_length
        r0 = min(length, math.ceil(self.explore_fraction * length))
        while r0 > 0 and (r0 - 1) / length >= self.explore_fraction:
            r0 -= 1
        while r0 < length and r0 / length < self.explore_fraction:
            r0 += 1
        u = start - 1
        return floor_sum(n, length, step, u + length - r0) - floor_sum(n, length, step, u)


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Σ_{i<n} ⌊(a·i + b)/m⌋ for n ≥ 0, m ≥ 1 and a, b ≥ 0, in O(log m) steps (Euclid-like reduction)."""
    total = 0
    while True:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b, m, a = top // m, top % m, a, m


def make_schedule(cfg: SGLDConfig) -> StepSchedule:
    """The schedule ``cfg.schedule`` names: constant lr; polynomial lr·(b + t)^(−γ) with b = ``poly_b``,
    γ = ``poly_gamma``; cyclical with lr0 = lr over ``iterations`` in ``cycles`` cycles."""
    if cfg.schedule == "constant":
        return ConstantSchedule(cfg.lr)
    if cfg.schedule == "polynomial":
        return PolynomialSchedule(cfg.lr, cfg.poly_b, cfg.poly_gamma)
    if cfg.schedule == "cyclical":
        return CyclicalSchedule(cfg.lr, cfg.iterations, cfg.cycles, cfg.explore_fraction)
    raise ValueError(f"unknown SGLD schedule {cfg.schedule!r}")


def is_thinned_sample(s: SGLDConfig, schedule: StepSchedule, t: int) -> bool:
    """Whether iterate t (θ_t) is kept: past burn-in, every ``thin``-th, a sample of the schedule (made by a
    sampling-phase update)."""
    return t >= s.burn_in and (t - s.burn_in + 1) % s.thin == 0 and schedule.is_sampling(t)


def thinned_count(s: SGLDConfig, schedule: StepSchedule | None = None) -> int:
    """How many iterates one chain keeps (those :func:`is_thinned_sample` keeps), in closed form."""
    schedule = schedule or make_schedule(s)
    return schedule.sampling_count(s.burn_in + s.thin - 1, s.thin, max(0, (s.iterations - s.burn_in) // s.thin))
