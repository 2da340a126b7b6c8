"""Stochastic gradient Langevin dynamics (Welling & Teh, ICML 2011) as a ``torch.optim.Optimizer``, and its
step as a function of tensors for chains stepped together (step-size schedules: :mod:`apd.schedules`).

The user backpropagates the **mean** minibatch negative log-likelihood, exactly as for SGD. With N
training points, prior N(0, prior_std²·I) and the energy

    U(θ) = N·mean_nll(θ) + ‖θ‖² / (2·prior_std²),

one step with ε = lr / N is

    θ ← θ − (ε/2)·∇U(θ) + 𝒩(0, ε·T)
      = θ·(1 − lr / (2·N·prior_std²)) − (lr/2)·∇mean_nll(θ) + √(lr·T/N)·ξ,   ξ ~ 𝒩(0, I),

so T = 1 samples the posterior, T < 1 a tempered ("cold") one and T = 0 is plain gradient descent.
With lr 0.05, N 50,000 and prior_std² 0.02 this is the reference run of Wang et al. (ICML 2018).

The noise ξ comes from a dedicated ``torch.Generator``, one flat draw per noisy step, so a seed fixes the
whole trajectory. With ``prefetch_noise`` the next step's ξ is drawn on a worker thread while the caller
runs forward and backward; the draws happen in the same order, so the trajectory is bit-identical with
or without it, and ``state_dict`` carries the generator state as of the last *consumed* draw, so a
resumed run continues exactly where the interrupted one stopped.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

_STATE_KEY = "sgld_noise_generator"


def prefetch_pays(device: torch.device, processes: int = 1) -> bool:
    """Whether drawing the noise on a worker thread should speed a step up: only on CPU, and only when the
    compute threads of ``processes`` such processes on this machine (torch's thread count each) leave a
    core free for each one's worker (on CUDA the draw is already asynchronous).

    benchmarks/bench_sgld.py on an idle 2-core CPU with one compute thread: SGLD/SGD 0.99-1.07 on fcNN2
    and 1.21-1.25 on fcNN1 with the prefetch, 1.36-1.45 and 1.28-1.35 without; with both cores computing,
    or both busy with other work, the worker only competes for a core and the step is 1-20 % slower.
    """
    return device.type == "cpu" and processes * (torch.get_num_threads() + 1) <= _usable_cores()


def _usable_cores() -> int:
    """CPU cores this process may run on (all of the machine's where the OS cannot tell)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _check_hyperparameters(group: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first SGLD hyperparameter of ``group`` that is out of range."""
    lr, num_data = group["lr"], group["num_data"]
    prior_std, temperature = group["prior_std"], group["temperature"]
    if not lr > 0:
        raise ValueError(f"SGLD lr must be positive, got {lr!r}")
    if not num_data >= 1:
        raise ValueError(f"SGLD num_data must be at least 1, got {num_data!r}")
    if not prior_std > 0:
        raise ValueError(f"SGLD prior_std must be positive, got {prior_std!r}")
    if not temperature >= 0:
        raise ValueError(f"SGLD temperature must be non-negative, got {temperature!r}")


def langevin_coefficients(lr: float, num_data: int, prior_std: float, temperature: float) -> tuple[float, float, float]:
    """The three numbers of one SGLD step (module docstring), θ ← a·θ − b·∇mean_nll(θ) + c·ξ:
    a = 1 − lr/(2·N·prior_std²), b = lr/2, c = √(lr·T/N)."""
    return 1.0 - lr / (2.0 * num_data * prior_std**2), lr / 2.0, math.sqrt(lr * temperature / num_data)


def langevin_update_(params: list[Tensor], grads: list[Tensor], noise: list[Tensor] | None, lr: float,
                     num_data: int, prior_std: float, temperature: float) -> None:
    """One SGLD step in place (module docstring): θ ← θ·(1 − lr/(2·N·prior_std²)) − (lr/2)·∇mean_nll(θ)
    + √(lr·T/N)·ξ, for each θ of ``params`` with its gradient in ``grads`` and its ξ ~ 𝒩(0, I) in ``noise``
    (unused, and may be None, when T = 0)."""
    decay, half_lr, noise_scale = langevin_coefficients(lr, num_data, prior_std, temperature)
    torch._foreach_mul_(params, decay)
    torch._foreach_add_(params, grads, alpha=-half_lr)
    if temperature > 0:
        torch._foreach_add_(params, noise, alpha=noise_scale)


def _group_views(flat: Tensor, shapes: list[list[torch.Size]]) -> list[list[Tensor]]:
    """``flat`` cut into consecutive views of the given shapes, one list per param group."""
    pieces = iter(flat.split([shape.numel() for group in shapes for shape in group]))
    return [[next(pieces).view(shape) for shape in group] for group in shapes]


class GaussianNoise:
    """Standard-normal draws ξ [R, numel], row r from ``generators[r]`` (one flat draw of ``numel`` values per
    row and call, so row r's sequence does not depend on the other rows), optionally drawn one call ahead.

    :meth:`next` returns the index into :attr:`buffers` of the buffer holding the next draw. With
    ``prefetch``, :meth:`prefetch` starts the draw for the following call on a single worker thread into a
    second buffer, so the buffer returned by :meth:`next` stays valid until the following call. A sampler
    starts it after its update, so that the draw runs beside the next gradient, not beside the update.
    """

    def __init__(self, generators: list[torch.Generator], numel: int, like: Tensor, prefetch: bool) -> None:
        self.generators = generators
        copies = 2 if prefetch else 1
        self.buffers = [torch.empty(len(generators), numel, dtype=like.dtype, device=like.device)
                        for _ in range(copies)]
        self._turn = 0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sgld-noise") if prefetch else None
        self._pending: Future[int] | None = None
        self._states_before_pending: list[Tensor] | None = None

    def _draw(self, turn: int) -> int:
        for row, generator in zip(self.buffers[turn], self.generators, strict=True):
            row.normal_(generator=generator)
        return turn

    def next(self) -> int:
        """The index of the buffer holding the next ξ of every row's sequence (the prefetched draw, or one
        drawn now)."""
        if self._pending is None:
            return self._draw(self._turn)
        turn, self._pending = self._pending.result(), None
        return turn

    def prefetch(self) -> None:
        """Start drawing the following ξ on the worker thread (nothing without ``prefetch`` or when a draw
        is pending already)."""
        if self._executor is None or self._pending is not None:
            return
        self._turn = 1 - self._turn
        self._states_before_pending = [generator.get_state() for generator in self.generators]
        self._pending = self._executor.submit(self._draw, self._turn)

    def consumed_states(self) -> list[Tensor]:
        """Each generator's state after the last draw handed out by :meth:`next` (a prefetch not counted)."""
        if self._pending is not None:
            return [state.clone() for state in self._states_before_pending]
        return [generator.get_state() for generator in self.generators]

    def rewind(self, states: list[Tensor] | None = None) -> None:
        """Drop any prefetched draw and set the generators to ``states`` (default: the consumed states)."""
        states = self.consumed_states() if states is None else states
        if len(states) != len(self.generators):
            raise ValueError(f"{len(states)} generator states for {len(self.generators)} noise streams")
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        for generator, state in zip(self.generators, states, strict=True):
            generator.set_state(state)


class SGLD(Optimizer):
    """SGLD sampler, a drop-in ``torch.optim.Optimizer`` for a loss that is the mean minibatch NLL.

    Step (Welling & Teh, 2011, with ε = lr/N and U(θ) = N·mean_nll(θ) + ‖θ‖²/(2·prior_std²)):
    θ ← θ − (ε/2)·∇U(θ) + 𝒩(0, ε·temperature).

    ``lr``, ``num_data``, ``prior_std`` and ``temperature`` are read from each param group at every step,
    so a schedule may change ``group["lr"]`` or ``group["temperature"]`` between steps. Noise comes from
    ``generator`` (owned by the optimizer from then on) or a new one seeded with ``seed``; with neither,
    the seed is drawn from torch's global generator, so ``torch.manual_seed`` fixes it. All parameters
    must share one device and dtype. ``prefetch_noise`` draws the next step's noise on a worker thread
    (same trajectory, bit for bit); ``None`` decides by :func:`prefetch_pays`.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        num_data: int,
        prior_std: float = 1.0,
        temperature: float = 1.0,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        prefetch_noise: bool | None = None,
    ) -> None:
        if seed is not None and generator is not None:
            raise ValueError("SGLD takes either a seed or a generator, not both")
        self._noise: GaussianNoise | None = None
        self._noise_views: list[list[list[Tensor]]] = []
        defaults = {"lr": lr, "num_data": num_data, "prior_std": prior_std, "temperature": temperature}
        super().__init__(params, defaults)
        like = self.param_groups[0]["params"][0]
        self._prefetch = prefetch_pays(like.device) if prefetch_noise is None else prefetch_noise
        if generator is None:
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,)).item())
            generator = torch.Generator(device=like.device).manual_seed(seed)
        elif generator.device.type != like.device.type:
            raise ValueError(f"SGLD generator is on {generator.device}, the parameters on {like.device}")
        self.generator = generator

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (validated); the flat noise layout is rebuilt at the next step."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        first = self.param_groups[0]["params"][0]
        try:
            _check_hyperparameters(group)
            for p in group["params"]:
                if p.device != first.device or p.dtype != first.dtype:
                    raise ValueError(f"SGLD parameters must share one device and dtype: found {p.dtype} on "
                                     f"{p.device} besides {first.dtype} on {first.device}")
        except ValueError:
            self.param_groups.pop()
            raise
        if self._noise is not None:
            self._noise.rewind()
            self._noise = None

    def _next_noise(self) -> list[list[Tensor]]:
        """ξ for every parameter of every group (views into one flat draw), in param-group order."""
        if self._noise is None:
            shapes = [[p.shape for p in group["params"]] for group in self.param_groups]
            numel = sum(shape.numel() for group in shapes for shape in group)
            self._noise = GaussianNoise([self.generator], numel, self.param_groups[0]["params"][0], self._prefetch)
            self._noise_views = [_group_views(buffer[0], shapes) for buffer in self._noise.buffers]
        return self._noise_views[self._noise.next()]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One SGLD update of every parameter that has a gradient (see the class docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        noise = None
        for index, group in enumerate(self.param_groups):
            _check_hyperparameters(group)
            with_grad = [(i, p) for i, p in enumerate(group["params"]) if p.grad is not None]
            if not with_grad:
                continue
            params = [p for _, p in with_grad]
            group_noise = None
            if group["temperature"] > 0:
                noise = self._next_noise() if noise is None else noise
                group_noise = [noise[index][i] for i, _ in with_grad]
            langevin_update_(params, [p.grad for p in params], group_noise, group["lr"], group["num_data"],
                             group["prior_std"], group["temperature"])
        if noise is not None:
            self._noise.prefetch()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The usual optimizer state plus the noise generator's state as of the last consumed draw."""
        state = super().state_dict()
        consumed = self.generator.get_state() if self._noise is None else self._noise.consumed_states()[0]
        state[_STATE_KEY] = consumed
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyperparameters and the noise generator, dropping any prefetched draw."""
        state_dict = dict(state_dict)
        if _STATE_KEY not in state_dict:
            raise ValueError(f"not an SGLD state_dict: it has no {_STATE_KEY!r} entry")
        generator_state = state_dict.pop(_STATE_KEY)
        super().load_state_dict(state_dict)
        if self._noise is None:
            self.generator.set_state(generator_state)
        else:
            self._noise.rewind([generator_state])
