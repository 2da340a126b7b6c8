"""SGLD chains over a target network, stepped together as one batch (:class:`SGLDChains`): each chain's
initialisation, minibatch order and Langevin noise come from streams of its own (:class:`ChainSeeds`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from apd.config import SGLDConfig
from apd.cuda_graphs import RecordedStep
from apd.data import MinibatchOrders
from apd.errors import DivergenceError
from apd.nets import ParamSpec, network, per_network_logits
from apd.samplers.langevin_kernel import fused_update_available, keyed_langevin_update_, step_keys
from apd.samplers.sgld import GaussianNoise, langevin_coefficients, langevin_update_
from apd.schedules import make_schedule


@dataclass(frozen=True)
class ChainSeeds:
    """The three random streams of a chain."""

    init: int
    batches: int
    noise: int


def initial_weights(sizes: list[int], cfg: SGLDConfig, seed: int, conv: Sequence[int] = ()) -> Tensor:
    """A chain's starting θ [D] for a :func:`apd.nets.network` of ``sizes`` and ``conv``: ``cfg.init``
    (``default``: PyTorch's layer initialisation; ``prior``: a draw of N(0, prior_var·I), every weight and
    bias) times ``cfg.init_scale``, drawn from ``seed`` on the CPU, so a chain starts from the same weights on
    every device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = network(sizes, conv)
        theta = ParamSpec.from_module(net).flatten(net)
        if cfg.init == "prior":
            theta.normal_(0.0, math.sqrt(cfg.prior_var))
    return theta * cfg.init_scale if cfg.init_scale != 1.0 else theta


class SGLDChains:
    """C SGLD chains of one network stepped together: θ [C, D], chain j of the batch being chain
    ``indices[j]`` with the streams ``seeds[j]``.

    Each iteration is one batched forward and backward pass (:func:`apd.nets.per_network_logits`), every
    chain on its own minibatch (:class:`apd.data.MinibatchOrders` of ``seeds[j].batches``), then the SGLD
    step of :func:`apd.samplers.sgld.langevin_update_` for every chain with its own noise: on CUDA with
    Triton the fused kernel of :mod:`apd.samplers.langevin_kernel` keyed by ``seeds[j].noise``; elsewhere
    a torch generator per chain seeded by it (:class:`GaussianNoise`, drawn one step ahead on a worker
    thread with ``prefetch_noise``); ``fused_update`` False keeps the torch generators on CUDA too. Chain
    j's trajectory does not depend on the other chains of the batch or their number (up to the float
    rounding of batched products), so C chains stepped together give the samples that C processes of one
    chain each would.

    With the fused update every input of an iteration lives in tensors on the card (minibatch indices, step
    keys, step coefficients), so the iteration — gather, forward, backward, update — is recorded once as a
    CUDA graph and replayed (``cuda_graph``, on by default with the fused update; :class:`RecordedStep`, after
    three steps as usual): a replay launches its few dozen kernels in one call, where a step of few chains is
    otherwise bound by launching them one by one.
    """

    def __init__(self, sizes: list[int], cfg: SGLDConfig, indices: Sequence[int], x_train: Tensor, y_train: Tensor,
                 seeds: Sequence[ChainSeeds], prefetch_noise: bool = False, conv: Sequence[int] = (),
                 fused_update: bool | None = None, cuda_graph: bool | None = None) -> None:
        if len(indices) != len(seeds) or not indices:
            raise ValueError(f"{len(indices)} chain ids for {len(seeds)} seed sets")
        self.indices, self.x_train, self.y_train = list(indices), x_train, y_train
        device = x_train.device
        self.spec = ParamSpec.from_module(network(sizes, conv))
        self.theta = torch.stack([initial_weights(sizes, cfg, s.init, conv) for s in seeds]).to(device)
        self.num_data, self.prior_std, self.temperature = len(y_train), math.sqrt(cfg.prior_var), cfg.temperature
        self.lr = cfg.lr  # the configured step, which a divergence message names
        self.schedule = make_schedule(cfg)
        self.orders = MinibatchOrders(len(y_train), cfg.batch_size, [s.batches for s in seeds], device)
        available = fused_update_available(device)
        if fused_update and not available:
            raise ValueError(f"the fused SGLD update needs CUDA and Triton; the chains are on {device}")
        self.fused = available if fused_update is None else fused_update
        if cuda_graph and not self.fused:
            raise ValueError("a CUDA graph of the SGLD step needs the fused update (CUDA and Triton)")
        self.graphed = self.fused if cuda_graph is None else cuda_graph
        self._graph = RecordedStep("SGLD chains", device) if self.graphed else None
        if self.fused:
            self.keys = torch.tensor([s.noise for s in seeds], dtype=torch.int64, device=device)
            self._step_keys = torch.empty_like(self.keys)
            self._coefficients = torch.empty(3, device=device)  # a, b, c of langevin_coefficients
            self._coefficients_set: tuple[float, float, float] | None = None
            self._batch_indices = torch.empty(len(seeds), cfg.batch_size, dtype=torch.int64, device=device)
        else:
            generators = [torch.Generator(device=device).manual_seed(s.noise) for s in seeds]
            self.noise = GaussianNoise(generators, self.spec.numel, self.theta, prefetch_noise)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def graph_recorded(self) -> bool:
        """Whether a step now replays the recorded CUDA graph (not before its fourth step, nor after a refused
        recording)."""
        return self._graph is not None and self._graph.recorded

    @property
    def noise_source(self) -> str:
        """How the chains draw their Langevin noise, as stores and checkpoints record it."""
        return "philox-keyed" if self.fused else "torch-generator"

    def step(self, t: int, keep: bool = False) -> tuple[Tensor, Tensor | None]:
        """SGLD iteration t (0-based) of every chain on its minibatch: θ_t → θ_{t+1}. Returns each chain's
        minibatch mean NLL at θ_t [C] and, with ``keep`` (iterate t is kept), θ_t itself [C, D], checked
        finite, so each loss describes exactly the weights kept."""
        lr = self.schedule.lr(t)
        temperature = self.temperature if self.schedule.noise_on(t) else 0.0
        kept = self.theta.clone() if keep else None
        if self.fused:
            self._set_step_inputs(t, lr, temperature)
            loss = self._graph(self._fused_step).clone() if self._graph is not None else self._fused_step()
        else:
            loss = self._generator_step(self.orders.indices(t), lr, temperature)
        if kept is not None:
            self._check_finite(t, kept, loss)
        return loss, kept

    def _loss_and_gradient(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Each chain's minibatch mean NLL at θ [C] and its gradient [C, D], chain j on rows ``idx[j]``."""
        theta = self.theta.detach().requires_grad_(True)
        logits = per_network_logits(self.spec, theta, self.x_train[idx])
        nll = F.cross_entropy(logits.flatten(0, 1), self.y_train[idx].flatten(), reduction="none")
        loss = nll.view(idx.shape).mean(1)
        (grad,) = torch.autograd.grad(loss.sum(), theta)
        return loss.detach(), grad

    def _generator_step(self, idx: Tensor, lr: float, temperature: float) -> Tensor:
        loss, grad = self._loss_and_gradient(idx)
        with torch.no_grad():
            xi = self.noise.buffers[self.noise.next()] if temperature > 0 else None
            langevin_update_([self.theta], [grad], [xi], lr, self.num_data, self.prior_std, temperature)
            if temperature > 0:
                self.noise.prefetch()
        return loss

    def _set_step_inputs(self, t: int, lr: float, temperature: float) -> None:
        """Iteration t's minibatch indices, keys and coefficients into the tensors the fused step reads
        (device-side writes only: no host synchronisation)."""
        self._batch_indices.copy_(self.orders.indices(t))
        step_keys(self.keys, t, out=self._step_keys)
        coefficients = langevin_coefficients(lr, self.num_data, self.prior_std, temperature)
        if coefficients != self._coefficients_set:
            for slot, value in zip(self._coefficients, coefficients, strict=True):
                slot.fill_(value)
            self._coefficients_set = coefficients

    def _fused_step(self) -> Tensor:
        loss, grad = self._loss_and_gradient(self._batch_indices)
        with torch.no_grad():
            keyed_langevin_update_(self.theta, grad, self._step_keys, self._coefficients)
        return loss

    def checked_weights(self, t: int) -> Tensor:
        """A copy of θ [C, D], or a :class:`DivergenceError` naming the first chain whose θ is not finite."""
        weights = self.theta.clone()
        self._check_finite(t, weights)
        return weights

    def _check_finite(self, t: int, weights: Tensor, loss: Tensor | None = None) -> None:
        """A :class:`DivergenceError` naming the first chain whose ``weights`` (or minibatch loss, when given)
        are not finite."""
        finite = torch.isfinite(weights).all(1)
        if loss is not None:
            finite &= torch.isfinite(loss)
        if not bool(finite.all()):
            bad = int((~finite).nonzero()[0, 0])
            what = f"minibatch loss {loss[bad].item()}" if loss is not None else "weights not finite"
            raise DivergenceError(f"SGLD diverged at iteration {t} of chain {self.indices[bad]} ({what}); try a "
                                  f"smaller sgld.lr (now {self.lr}); complete artifacts are unchanged")

    def state_dict(self) -> dict:
        """θ and, for torch generators, each chain's noise generator state as of its last consumed draw (the
        keyed noise is a function of the iteration and needs none)."""
        state = {"theta": self.theta.cpu(), "noise_source": self.noise_source}
        if not self.fused:
            state["noise_states"] = self.noise.consumed_states()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("noise_source") != self.noise_source or tuple(state["theta"].shape) != tuple(self.theta.shape):
            raise ValueError(f"the checkpoint holds {tuple(state['theta'].shape)} weights with "
                             f"{state.get('noise_source')} noise; these chains are {tuple(self.theta.shape)} with "
                             f"{self.noise_source} noise")
        self.theta.copy_(state["theta"])
        if not self.fused:
            self.noise.rewind(state["noise_states"])
