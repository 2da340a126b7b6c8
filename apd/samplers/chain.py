"""One SGLD chain over a target MLP: its net, optimizer, step-size schedule and minibatch order, each
seeded from its own stream (initialisation, minibatch order and Langevin noise are independent)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from apd.config import SGLDConfig
from apd.data import MinibatchOrder
from apd.errors import DivergenceError
from apd.nets import ParamSpec, network
from apd.samplers.sgld import SGLD, StepSchedule, make_schedule


@dataclass(frozen=True)
class ChainSeeds:
    """The three random streams of a chain."""

    init: int
    batches: int
    noise: int


class SGLDChain:
    """Chain ``index``: a network of ``sizes`` and ``conv`` (:func:`apd.nets.network`) initialised from
    ``seeds.init``, SGLD steps (:class:`SGLD`) on minibatches of (x_train, y_train) in the order of
    ``seeds.batches``, noise from ``seeds.noise``.
    The initial weights are ``cfg.init`` (``default``: PyTorch's layer initialisation; ``prior``: a draw
    of N(0, prior_var·I), every weight and bias) times ``cfg.init_scale``; both draw from ``seeds.init``
    on the CPU, so a chain starts from the same weights on every device."""

    def __init__(self, sizes: list[int], cfg: SGLDConfig, index: int, x_train: Tensor, y_train: Tensor,
                 seeds: ChainSeeds, prefetch_noise: bool | None = None, conv: Sequence[int] = ()) -> None:
        self.index, self.x_train, self.y_train = index, x_train, y_train
        device = x_train.device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seeds.init)
            net = network(sizes, conv)
            if cfg.init == "prior":
                with torch.no_grad():
                    for parameter in net.parameters():
                        parameter.normal_(0.0, math.sqrt(cfg.prior_var))
        if cfg.init_scale != 1.0:
            with torch.no_grad():
                for parameter in net.parameters():
                    parameter.mul_(cfg.init_scale)
        self.net = net.to(device)
        self.optimizer = SGLD(self.net.parameters(), lr=cfg.lr, num_data=len(y_train),
                              prior_std=math.sqrt(cfg.prior_var), temperature=cfg.temperature, seed=seeds.noise,
                              prefetch_noise=prefetch_noise)
        self.schedule = make_schedule(cfg)
        self.temperature = cfg.temperature
        self.order = MinibatchOrder(len(y_train), cfg.batch_size, seeds.batches, device)

    def step(self, t: int, spec: ParamSpec | None = None) -> tuple[Tensor, Tensor | None]:
        """SGLD iteration t (0-based) on its minibatch: θ_t → θ_{t+1}. Returns the minibatch mean NLL at
        θ_t and, when ``spec`` is given (iterate t is kept), θ_t itself as a checked flat vector, so the
        loss describes exactly the weights kept."""
        self.schedule.apply(self.optimizer, t, self.temperature)
        idx = self.order.indices(t)
        loss = F.cross_entropy(self.net(self.x_train[idx]), self.y_train[idx])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        vec = None if spec is None else self.checked_vector(spec, t, loss)
        self.optimizer.step()
        return loss.detach(), vec

    def checked_vector(self, spec: ParamSpec, t: int, loss: Tensor) -> Tensor:
        """The weights as a flat vector, or a :class:`DivergenceError` when the loss or θ is not finite."""
        vec = spec.flatten(self.net)
        loss_value = loss.item()
        if not (math.isfinite(loss_value) and torch.isfinite(vec).all()):
            lr = self.optimizer.defaults["lr"]
            raise DivergenceError(f"SGLD diverged at iteration {t} of chain {self.index} (minibatch loss "
                                  f"{loss_value}); try a smaller sgld.lr (now {lr}); complete artifacts are "
                                  "unchanged")
        return vec

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


def is_thinned_sample(s: SGLDConfig, schedule: StepSchedule, t: int) -> bool:
    """Whether iterate t is kept: past burn-in, every ``thin``-th, in the schedule's sampling phase."""
    return t >= s.burn_in and (t - s.burn_in + 1) % s.thin == 0 and schedule.is_sampling(t)


def thinned_count(s: SGLDConfig, schedule: StepSchedule | None = None) -> int:
    """How many iterates one chain keeps."""
    schedule = schedule or make_schedule(s)
    return sum(is_thinned_sample(s, schedule, t) for t in range(s.burn_in, s.iterations))
