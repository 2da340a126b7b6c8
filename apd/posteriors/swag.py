"""SWAG, the stochastic-weight-averaging Gaussian (Maddox, Izmailov, Garipov, Vetrov & Wilson, "A Simple
Baseline for Bayesian Uncertainty in Deep Learning", NeurIPS 2019).

From a trained SGD network, SGD continues at a constant learning rate; after every epoch (or
``snapshots_per_epoch`` times per epoch) the iterate θ_t is collected. SWAG keeps

- the SWA mean θ̄ = (1/T) Σ_t θ_t,
- the diagonal Σ_diag = diag(θ̄² − θ̄²) (second moment minus squared mean; accumulated here with
  Welford's update, the same quantity without the cancellation),
- the deviation matrix D̂ [D, K] whose columns are the last K = ``rank`` deviations θ_t − θ̄_t, θ̄_t
  being the running mean just after θ_t was added (the paper's Algorithm 1 and reference code).

It samples from N(θ̄, s·(Σ_diag + D̂D̂ᵀ/(K − 1))):

    θ = θ̄ + √s · Σ_diag^{1/2} z₁ + √(s/(K − 1)) · D̂ z₂,   z₁ ~ N(0, I_D), z₂ ~ N(0, I_K).

The scale s multiplies the covariance, as the ``scale`` argument of the reference implementation's
``SWAG.sample(scale, cov=True)`` (wjmaddox/swa_gaussian, ``swag/posteriors/swag.py``: it adds
``scale ** 0.5`` times the draw). The paper defines the SWAG covariance as Σ = ½(Σ_diag + Σ_low-rank) and
samples θ̃ = θ_SWA + (1/√2)·Σ_diag^{1/2} z₁ + (1/√(2(K − 1)))·D̂ z₂ (its Section 4, "SWAG: Low Rank plus
Diagonal Covariance Structure"), which is s = 0.5: the default here. So the draws are multiplied by
√0.5, the covariance by 0.5. With fewer than 2 deviations the low-rank term is left out.

:func:`collect_swag_moments` is pure (any sequence of flat vectors); :func:`swag_iterates` is the SGD
loop; :func:`fit_swag` joins them; :func:`choose_swag_lr` picks the learning rate by the SWAG
ensemble's NLL on the validation split only.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from apd.data import MinibatchOrder
from apd.errors import DivergenceError
from apd.nets import ParamSpec
from apd.posteriors.base import Posterior
from apd.samplers.baselines import MinibatchSGD

VAR_CLAMP = 1e-30  # floor of the diagonal variance, as in the reference code


class SWAGMoments:
    """Running SWAG statistics of flat iterates θ_t [D]: count, mean, variance and the last ``rank``
    deviations θ_t − θ̄_t (float64)."""

    def __init__(self, dim: int, rank: int = 20, device: torch.device | str = "cpu") -> None:
        if rank < 0:
            raise ValueError(f"rank must be non-negative, got {rank}")
        self.dim, self.rank, self.n = dim, rank, 0
        self.mean = torch.zeros(dim, dtype=torch.float64, device=device)
        self._m2 = torch.zeros(dim, dtype=torch.float64, device=device)
        self._deviations: deque[Tensor] = deque(maxlen=rank)

    def update(self, theta: Tensor) -> None:
        """Add one iterate θ [D]."""
        theta = theta.detach().reshape(-1).to(self.mean.device, torch.float64)
        if theta.shape[0] != self.dim:
            raise ValueError(f"iterate has {theta.shape[0]} entries, expected {self.dim}")
        self.n += 1
        delta = theta - self.mean
        self.mean += delta / self.n
        self._m2 += delta * (theta - self.mean)
        if self.rank:
            self._deviations.append(theta - self.mean)

    @property
    def variance(self) -> Tensor:
        """Σ_diag = (1/T) Σ_t (θ_t − θ̄)², floored at ``VAR_CLAMP`` (float64 [D])."""
        if self.n == 0:
            raise ValueError("no iterates collected")
        return (self._m2 / self.n).clamp_min(VAR_CLAMP)

    @property
    def sq_mean(self) -> Tensor:
        """The paper's second moment θ̄² = (1/T) Σ_t θ_t² (float64 [D])."""
        return self._m2 / max(self.n, 1) + self.mean**2

    @property
    def deviations(self) -> Tensor:
        """The last min(T, rank) deviations as rows, oldest first: D̂ᵀ, float64 [K, D]."""
        if not self._deviations:
            return torch.zeros(0, self.dim, dtype=torch.float64, device=self.mean.device)
        return torch.stack(list(self._deviations))


def collect_swag_moments(iterates: Iterable[Tensor], rank: int = 20) -> SWAGMoments:
    """SWAG statistics of a sequence of flat iterates (pure: no training, no randomness)."""
    moments: SWAGMoments | None = None
    for theta in iterates:
        if moments is None:
            moments = SWAGMoments(theta.numel(), rank, theta.device)
        moments.update(theta)
    if moments is None:
        raise ValueError("no iterates collected")
    return moments


class SWAGPosterior(Posterior):
    """N(θ̄, s·(Σ_diag + D̂D̂ᵀ/(K − 1))) over flat weights (module docstring); storage (2 + K)·D."""

    def __init__(self, spec: ParamSpec, mean: Tensor, variance: Tensor, deviations: Tensor, scale: float = 0.5,
                 device: torch.device | str = "cpu", name: str = "swag") -> None:
        d = spec.numel
        if mean.shape != (d,) or variance.shape != (d,) or deviations.dim() != 2 or deviations.shape[1] != d:
            raise ValueError(f"SWAG needs mean [{d}], variance [{d}] and deviations [K, {d}]")
        if scale < 0:
            raise ValueError(f"scale must be non-negative, got {scale}")
        self.name, self.spec, self.device, self.scale = name, spec, torch.device(device), scale
        self.mean = mean.to(self.device, torch.float32)
        self.std = variance.clamp_min(VAR_CLAMP).sqrt().to(self.device, torch.float32)
        self.deviations = deviations.to(self.device, torch.float32)

    @classmethod
    def from_moments(cls, spec: ParamSpec, moments: SWAGMoments, scale: float = 0.5,
                     device: torch.device | str = "cpu", name: str = "swag") -> SWAGPosterior:
        return cls(spec, moments.mean, moments.variance, moments.deviations, scale, device, name)

    @property
    def rank(self) -> int:
        return self.deviations.shape[0]

    def covariance(self) -> Tensor:
        """The dense covariance s·(Σ_diag + D̂D̂ᵀ/(K − 1)) [D, D], float64 (for tests and small nets)."""
        cov = torch.diag(self.std.double() ** 2)
        if self.rank >= 2:
            dev = self.deviations.double()
            cov += dev.T @ dev / (self.rank - 1)
        return self.scale * cov

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        gen_device = generator.device if generator is not None else self.device
        z1 = torch.randn(k, self.spec.numel, generator=generator, device=gen_device).to(self.device)
        draws = z1 * self.std
        if self.rank >= 2:
            z2 = torch.randn(k, self.rank, generator=generator, device=gen_device).to(self.device)
            draws += z2 @ self.deviations / math.sqrt(self.rank - 1)
        return self.mean + math.sqrt(self.scale) * draws

    def stored_parameters(self) -> int:
        return (2 + self.rank) * self.spec.numel


def swag_iterates(net: nn.Module, x_train: Tensor, y_train: Tensor, lr: float, epochs: int, batch_size: int = 100,
                  weight_decay: float = 0.001, seed: int = 0, snapshots_per_epoch: int = 1,
                  momentum: float = 0.0) -> Iterator[Tensor]:
    """Continue SGD from ``net``'s weights (on a copy; ``net`` is not changed) at the constant ``lr`` for
    ``epochs`` epochs of the mean minibatch cross-entropy, weight decay on the mean loss (as the SGD
    baseline), minibatches from :class:`apd.data.MinibatchOrder` (``seed``); yield the flat weights
    ``snapshots_per_epoch`` times per epoch, evenly spaced, the last at the epoch's end."""
    if lr < 0 or epochs < 1 or snapshots_per_epoch < 1:
        raise ValueError("SWAG needs lr ≥ 0, epochs ≥ 1 and snapshots_per_epoch ≥ 1")
    net = copy.deepcopy(net).train()
    spec = ParamSpec.from_module(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    order = MinibatchOrder(len(y_train), batch_size, seed, x_train.device)
    sgd = MinibatchSGD(net, optimizer, x_train, y_train, batch_size)
    per_epoch = order.batches_per_epoch
    if snapshots_per_epoch > per_epoch:
        raise ValueError(f"{snapshots_per_epoch} snapshots per epoch, but an epoch has {per_epoch} minibatches")
    marks = {round((s + 1) * per_epoch / snapshots_per_epoch) for s in range(snapshots_per_epoch)}
    for t in range(epochs * per_epoch):
        if not torch.isfinite(sgd(order.indices(t))):
            raise DivergenceError(f"SWAG's SGD diverged at step {t} (lr {lr}); choose a smaller learning rate")
        if (t % per_epoch) + 1 in marks:
            yield spec.flatten(net)


def fit_swag(net: nn.Module, x_train: Tensor, y_train: Tensor, lr: float, epochs: int, rank: int = 20,
             batch_size: int = 100, weight_decay: float = 0.001, seed: int = 0, snapshots_per_epoch: int = 1,
             momentum: float = 0.0, scale: float = 0.5, name: str = "swag") -> SWAGPosterior:
    """SWAG from a trained ``net``: :func:`swag_iterates` collected by :func:`collect_swag_moments`."""
    iterates = swag_iterates(net, x_train, y_train, lr, epochs, batch_size, weight_decay, seed,
                             snapshots_per_epoch, momentum)
    moments = collect_swag_moments(iterates, rank)
    return SWAGPosterior.from_moments(ParamSpec.from_module(net), moments, scale, x_train.device, name)


@torch.no_grad()
def ensemble_nll(posterior: Posterior, x: Tensor, y: Tensor, samples: int,
                 generator: torch.Generator | None = None) -> float:
    """−(1/N) Σ_i log p̄(y_i | x_i), p̄ the mean of ``samples`` members' class probabilities."""
    mean_probs = posterior.predict_probs(x, samples, generator).mean(0)
    picked = mean_probs.gather(1, y.to(mean_probs.device).view(-1, 1)).squeeze(1)
    return float(-picked.clamp_min(torch.finfo(picked.dtype).tiny).log().mean())


@dataclass
class SWAGChoice:
    lr: float
    val_nll: dict[float, float]
    posterior: SWAGPosterior


def choose_swag_lr(net: nn.Module, x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor,
                   lrs: Sequence[float], epochs: int, rank: int = 20, samples: int = 30, batch_size: int = 100,
                   weight_decay: float = 0.001, seed: int = 0, snapshots_per_epoch: int = 1,
                   momentum: float = 0.0, scale: float = 0.5) -> SWAGChoice:
    """Fit SWAG at each learning rate in ``lrs`` (same start, same minibatches) and keep the one whose
    ensemble of ``samples`` draws has the lowest NLL on the validation split (x_val, y_val): only
    validation data takes part in the choice, never test or OOD data. A learning rate at which SGD
    diverges counts as NLL +inf."""
    if not lrs:
        raise ValueError("no learning rates to choose from")
    nlls: dict[float, float] = {}
    best: SWAGChoice | None = None
    for lr in lrs:
        try:
            posterior = fit_swag(net, x_train, y_train, lr, epochs, rank, batch_size, weight_decay, seed,
                                 snapshots_per_epoch, momentum, scale)
        except DivergenceError:
            nlls[lr] = math.inf
            continue
        generator = torch.Generator(device=posterior.device).manual_seed(seed)
        nll = ensemble_nll(posterior, x_val, y_val, samples, generator)
        nlls[lr] = nll if math.isfinite(nll) else math.inf
        if best is None or nlls[lr] < nlls[best.lr]:
            best = SWAGChoice(lr, nlls, posterior)
    if best is None:
        raise DivergenceError(f"SWAG's SGD diverged at every learning rate in {list(lrs)}")
    return best

