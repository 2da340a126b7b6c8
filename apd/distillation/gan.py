"""GAN building blocks for distilling a posterior into a generator of flat weight vectors.

A :class:`Generator` maps z ~ N(0, I) to a weight vector θ ∈ R^D, a :class:`Critic` scores vectors, and
:class:`GANTrainer` alternates critic and generator updates under one of three objectives, chosen by name
(see :func:`make_loss`):

* ``"wgan-gp"`` — Wasserstein GAN with a two-sided gradient penalty (Gulrajani et al., 2017), the
  objective of Adversarial Posterior Distillation (Wang et al., 2018);
* ``"wgan"`` — Wasserstein GAN with weight clipping (Arjovsky et al., 2017);
* ``"gan"`` — the original GAN with the non-saturating generator loss (Goodfellow et al., 2014).

With D up to ~480k the critic's input layer and the generator's output layer dominate the cost. The
gradient penalty therefore never builds the interpolates x̂ in R^D: the input layer is affine, so its
pre-activation at x̂ = f + α(r − f) is the same interpolation of the pre-activations at r and f, and
‖∇ₓD(x̂)‖² = gᵀ(W₁W₁ᵀ)g with g the gradient at the first hidden layer (see
:func:`scores_and_interpolate_grad_norm`). Adam uses its fused kernel where the device has one.

C GANs of one shape (one per SGLD chain) train as one: :func:`stacked` makes one generator (critic) of
theirs whose linear layers are :class:`StackedLinear` (weights [C, out, in], one batched matmul), every
batch gains a leading chain axis [C, B, ·], each loss is per chain and their sum is minimised, and every
draw comes from that chain's own stream (:func:`draw`). Since the chains share no weight, each chain's
weights get exactly their own loss's gradient, and Adam and RMSprop update elementwise, so chain j trains
as it would alone, to float rounding. On one CPU thread at the sizes of fcNN1's per-chain distiller (codes of 35,
hidden [128, 128], batch 100) the matmuls are compute-bound, so batching saves the chains' per-step
overheads only: 1.0-1.3×, 1.1-1.6× and 1.3-1.7× the chain-steps per second of the chains in turn at C = 2,
4 and 8, where ``torch.vmap`` over ``functional_call`` of the same computation gives 0.6-0.9×, 0.9-1.2× and
1.1-1.4× (``benchmarks/bench_chain_gans.py``, four runs on two shared cores at load average 7).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apd.cuda_graphs import RecordedStep
from apd.errors import ArtifactError, ConfigError, DataError, DivergenceError
from apd.nets import mlp

GAN_KINDS = ("wgan-gp", "wgan", "gan")

OPTIMIZER_DEFAULTS: dict[str, dict[str, Any]] = {
    # Gulrajani et al. (2017), Algorithm 1; also the APD paper's setting.
    "wgan-gp": {"optimizer": "adam", "lr": 1e-4, "betas": (0.5, 0.9)},
    # Arjovsky et al. (2017), Algorithm 1.
    "wgan": {"optimizer": "rmsprop", "lr": 5e-5},
    # Radford et al. (2016), the DCGAN recipe the APD paper used for its vanilla-GAN variant.
    "gan": {"optimizer": "adam", "lr": 2e-4, "betas": (0.5, 0.999)},
}


# One random stream, or one per chain of stacked modules (each chain's draws from its own).
Streams = torch.Generator | Sequence[torch.Generator] | None


def draw(sampler: Callable[..., Tensor], size: tuple[int, ...], like: Tensor, rng: Streams) -> Tensor:
    """``sampler`` (``torch.randn``, ``torch.rand``) of ``size`` on ``like``'s device and dtype from ``rng``;
    given one generator per chain, [C, *size] with chain j's slice drawn from its own generator, the numbers
    that generator alone would give."""
    if rng is None or isinstance(rng, torch.Generator):
        return sampler(*size, device=like.device, dtype=like.dtype, generator=rng)
    return torch.stack([sampler(*size, device=like.device, dtype=like.dtype, generator=g) for g in rng])


def seeded_streams(seed: int | Sequence[int], device: torch.device) -> torch.Generator | list[torch.Generator]:
    """A generator on ``device`` seeded with ``seed``, or one per seed of a sequence."""
    if isinstance(seed, Sequence):
        return [seeded_streams(s, device) for s in seed]
    rng = torch.Generator(device=device)
    rng.manual_seed(seed)
    return rng


class StackedLinear(nn.Module):
    """C affine maps as one: chain j's inputs x_j [B, in] ↦ W_j x_j + b_j, for x [C, B, in] → [C, B, out] in
    one batched matmul; ``weight`` [C, out, in] and ``bias`` [C, out] stack the C maps'."""

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        """The stack of ``layers``' weights and biases; each layer's own parameters then become views of
        their slices of the stack, so the layers see every update of it (and their state_dicts are the
        stack's slices)."""
        super().__init__()
        self.weight = nn.Parameter(torch.stack([layer.weight.detach() for layer in layers]))
        self.bias = nn.Parameter(torch.stack([layer.bias.detach() for layer in layers]))
        for j, layer in enumerate(layers):
            layer.weight = nn.Parameter(self.weight.detach()[j])
            layer.bias = nn.Parameter(self.bias.detach()[j])

    def forward(self, x: Tensor) -> Tensor:
        """W_j x_j + b_j for every chain j: [C, B, in] → [C, B, out]."""
        return torch.baddbmm(self.bias.unsqueeze(-2), x, self.weight.mT)


Net = TypeVar("Net", "Generator", "Critic")


def stacked(modules: Sequence[Net]) -> Net:
    """C generators (or critics) of one shape as one module on [C, B, ·] inputs, chain j's through module
    j's weights: its linear layers :class:`StackedLinear` of theirs (whose weights thereby become views of
    the stack's), the other layers theirs."""
    stack = copy.deepcopy(modules[0])
    stack.net = nn.Sequential(*(StackedLinear(layers) if isinstance(layers[0], nn.Linear) else layers[0]
                                for layers in zip(*(m.net for m in modules), strict=True)))
    return stack


class Generator(nn.Module):
    """θ = G(z), z ~ N(0, I_{z_dim}): Linear+ReLU hidden layers and a linear output of size ``out_dim``.

    APD (Wang et al., 2018) uses z_dim 32 and hidden [100, 100, 100]. A :func:`stacked` generator maps
    z [C, k, z_dim] → [C, k, out_dim].
    """

    def __init__(self, z_dim: int, hidden: list[int], out_dim: int) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.out_dim = out_dim
        self.net = mlp([z_dim, *hidden, out_dim])

    def forward(self, z: Tensor) -> Tensor:
        """θ = G(z) for z: [k, z_dim] → [k, out_dim]."""
        return self.net(z)

    def sample(self, k: int, generator: Streams = None) -> Tensor:
        """Draw k vectors G(z), z ~ N(0, I), with z created on the module's device; shape [k, out_dim], or
        [C, k, out_dim] for a :func:`stacked` generator given one generator per chain (:func:`draw`)."""
        return self(draw(torch.randn, (k, self.z_dim), self.net[0].weight, generator))


class Critic(nn.Module):
    """D(x): Linear+ReLU hidden layers and a linear output of size ``out`` (the logit for the vanilla GAN).

    The first layer is exposed as :attr:`input_layer` and the remaining map as :meth:`head`, so the
    gradient penalty can work on first-layer pre-activations instead of D-dimensional inputs. A
    :func:`stacked` critic scores x [C, B, in_dim] → [C, B, out].
    """

    def __init__(self, in_dim: int, hidden: list[int], out: int = 1) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.net = mlp([in_dim, *hidden, out])

    @property
    def input_layer(self) -> nn.Linear | StackedLinear:
        """The affine map h = W₁x + b applied to the D-dimensional input."""
        return self.net[0]

    def head(self, pre_activation: Tensor) -> Tensor:
        """Everything after the input layer's affine map (identity for a critic with no hidden layer)."""
        out = pre_activation
        for layer in self.net[1:]:
            out = layer(out)
        return out

    def forward(self, x: Tensor) -> Tensor:
        """D(x) for x: [B, in_dim] → [B, out] ([C, B, in_dim] → [C, B, out] stacked)."""
        return self.net(x)


def scores_and_interpolate_grad_norm(
    critic: Critic, real: Tensor, fake: Tensor, alpha: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """D(real), D(fake) (each [B]) and ‖∇ₓD(x̂)‖₂ ([B]) at x̂ = fake + α·(real − fake), α: [B, 1]; for a
    :func:`stacked` critic, batches [C, B, D] and α [C, B, 1] give each [C, B], chain by chain.

    Exact and cheaper than differentiating through explicit interpolates: with first layer
    h = W₁x + b (affine), h(x̂) = h(fake) + α·(h(real) − h(fake)), and by the chain rule
    ∇ₓD(x̂) = W₁ᵀ g with g = ∂D/∂h at h(x̂), so ‖∇ₓD(x̂)‖² = gᵀ(W₁W₁ᵀ)g. The critic's input layer is
    therefore applied to two batches (not three) and no [B, D] gradient is ever formed; g comes from
    ``torch.autograd.grad(..., create_graph=True)`` so the penalty is differentiable in every weight.
    The head scores the interpolates on their own, apart from [real; fake]: g and the penalty's
    second-order terms then run over B rows, not over 3B of which 2B carry a zero gradient
    (benchmarks/bench_gradient_penalty.py measures the two side by side).
    """
    layer = critic.input_layer
    h_real, h_fake = layer(real), layer(fake)
    h_mix = torch.lerp(h_fake, h_real, alpha)
    scores = critic.head(torch.cat([h_real, h_fake], dim=-2)).squeeze(-1)
    d_real, d_fake = scores.split(real.shape[-2], dim=-1)
    d_mix = critic.head(h_mix).squeeze(-1)
    (g,) = torch.autograd.grad(d_mix.sum(), h_mix, create_graph=True)  # the chains' sum: each its own g
    gram = layer.weight @ layer.weight.mT
    sq_norm = ((g @ gram) * g).sum(dim=-1)
    return d_real, d_fake, sq_norm.clamp_min(1e-12).sqrt()


def batch_mean(scores: Tensor) -> Tensor:
    """The mean of a critic's scores [B, 1] over the batch: a scalar, or [C] for stacked scores [C, B, 1]."""
    return scores.mean(dim=(-2, -1))


class GANLoss(ABC):
    """A critic objective, a generator objective and an optional hook after each critic update. Each loss
    and statistic is a scalar, or one per chain [C] for stacked modules and batches (:func:`stacked`);
    ``rng`` is then one generator per chain."""

    kind: ClassVar[str]

    @abstractmethod
    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: Streams = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss the critic minimises on a real and a (detached) fake batch, and detached stats."""

    @abstractmethod
    def generator_loss(self, critic: Critic, fake: Tensor) -> Tensor:
        """The loss the generator minimises on a fake batch that carries its graph."""

    def after_critic_step(self, critic: Critic) -> None:  # noqa: B027 (a hook that is a no-op by default)
        """Constraint applied to the critic after each optimiser step (none by default)."""


class _Wasserstein(GANLoss):
    def generator_loss(self, critic: Critic, fake: Tensor) -> Tensor:
        """L_G = −E[D(G(z))] (Arjovsky et al., 2017)."""
        return -batch_mean(critic(fake))


class WassersteinGP(_Wasserstein):
    """WGAN-GP (Gulrajani et al., 2017): L_D = E[D(x̃)] − E[D(x)] + λ·E[(‖∇D(x̂)‖₂ − 1)²],
    x̂ = x̃ + α(x − x̃), α ~ U[0, 1] per example; L_G = −E[D(x̃)]."""

    kind = "wgan-gp"

    def __init__(self, gp_weight: float = 10.0) -> None:
        self.gp_weight = gp_weight

    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: Streams = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Two-sided penalty λ·E[(‖∇D(x̂)‖₂ − 1)²] on random interpolates (Gulrajani et al., 2017, Alg. 1)."""
        alpha = draw(torch.rand, (real.shape[-2], 1), real, rng)
        d_real, d_fake, grad_norm = scores_and_interpolate_grad_norm(critic, real, fake, alpha)
        wasserstein = d_real.mean(-1) - d_fake.mean(-1)
        penalty = (grad_norm - 1).square().mean(-1)
        loss = self.gp_weight * penalty - wasserstein
        return loss, _detached(critic_loss=loss, wasserstein=wasserstein, gradient_penalty=penalty)


class WassersteinClip(_Wasserstein):
    """WGAN (Arjovsky et al., 2017): L_D = E[D(x̃)] − E[D(x)], every critic weight clipped to [−c, c]
    after each critic update; L_G = −E[D(x̃)]."""

    kind = "wgan"

    def __init__(self, clip: float = 0.01) -> None:
        self.clip = clip

    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: Streams = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """L_D = −(E[D(x)] − E[D(x̃)]); the bracket estimates the Wasserstein-1 distance (up to scale)."""
        wasserstein = batch_mean(critic(real)) - batch_mean(critic(fake))
        loss = -wasserstein
        return loss, _detached(critic_loss=loss, wasserstein=wasserstein)

    @torch.no_grad()
    def after_critic_step(self, critic: Critic) -> None:
        """w ← clip(w, −c, c) for every critic parameter (Arjovsky et al., 2017, Algorithm 1)."""
        for param in critic.parameters():
            param.clamp_(-self.clip, self.clip)


class NonSaturatingGAN(GANLoss):
    """GAN (Goodfellow et al., 2014) with D as a logit: L_D = −E[log σ(D(x))] − E[log(1 − σ(D(x̃)))],
    and the non-saturating L_G = −E[log σ(D(x̃))]."""

    kind = "gan"

    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: Streams = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Binary cross-entropy, real labelled 1 and fake 0: softplus(−D(x)) + softplus(D(x̃))."""
        d_real, d_fake = critic(real), critic(fake)
        loss = batch_mean(F.softplus(-d_real)) + batch_mean(F.softplus(d_fake))
        return loss, _detached(critic_loss=loss, real_prob=batch_mean(torch.sigmoid(d_real)),
                               fake_prob=batch_mean(torch.sigmoid(d_fake)))

    def generator_loss(self, critic: Critic, fake: Tensor) -> Tensor:
        """L_G = −E[log σ(D(G(z)))] = E[softplus(−D(G(z)))] (Goodfellow et al., 2014, Section 3)."""
        return batch_mean(F.softplus(-critic(fake)))


def make_loss(kind: str, gp_weight: float = 10.0, clip: float = 0.01) -> GANLoss:
    """The objective named ``kind`` (one of :data:`GAN_KINDS`) with its hyper-parameter."""
    if kind == "wgan-gp":
        return WassersteinGP(gp_weight)
    if kind == "wgan":
        return WassersteinClip(clip)
    if kind == "gan":
        return NonSaturatingGAN()
    raise ConfigError(f"unknown GAN loss {kind!r}; choose one of {', '.join(GAN_KINDS)}")


def make_optimizers(
    kind: str,
    generator: nn.Module,
    critic: nn.Module,
    lr: float | None = None,
    betas: tuple[float, float] | None = None,
    capturable: bool = False,
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """(generator optimiser, critic optimiser) for ``kind``: Adam(lr, β) for wgan-gp and gan, RMSprop(lr)
    for wgan; ``None`` takes the defaults in :data:`OPTIMIZER_DEFAULTS` (betas are ignored for RMSprop).
    ``capturable``: their steps can be recorded in a CUDA graph (their step counts kept on the device)."""
    if kind not in OPTIMIZER_DEFAULTS:
        raise ConfigError(f"unknown GAN loss {kind!r}; choose one of {', '.join(GAN_KINDS)}")
    defaults = OPTIMIZER_DEFAULTS[kind]
    lr = defaults["lr"] if lr is None else lr
    if defaults["optimizer"] == "rmsprop":
        return (torch.optim.RMSprop(generator.parameters(), lr=lr, foreach=True, capturable=capturable),
                torch.optim.RMSprop(critic.parameters(), lr=lr, foreach=True, capturable=capturable))
    betas = defaults["betas"] if betas is None else betas
    return _adam(generator, lr, betas, capturable), _adam(critic, lr, betas, capturable)


def _adam(module: nn.Module, lr: float, betas: tuple[float, float], capturable: bool) -> torch.optim.Adam:
    """Adam with the fused kernel (several times faster than foreach on CPU), foreach where none exists."""
    params = list(module.parameters())
    try:
        return torch.optim.Adam(params, lr=lr, betas=betas, fused=True, capturable=capturable)
    except RuntimeError:  # a device without a fused Adam kernel
        return torch.optim.Adam(params, lr=lr, betas=betas, foreach=True, capturable=capturable)


def _detached(**stats: Tensor) -> dict[str, Tensor]:
    return {name: value.detach() for name, value in stats.items()}


class GANTrainer:
    """Generator, critic, their optimisers, the objective and the random stream of one GAN run.

    All tensors live on the modules' device (move the modules before building the trainer); real
    batches are moved there if needed. z and the interpolation weights come from the trainer's own
    seeded ``torch.Generator``, which is part of :meth:`state_dict`, so a resumed run repeats exactly.
    A non-finite loss raises :class:`DivergenceError`.

    With :func:`stacked` modules of C chains, ``seed`` is one seed per chain and the trainer trains the C
    GANs as one: real batches are [C, B, D], chain j's z and interpolation weights come from its own
    stream (so it draws what a trainer of chain j alone draws), the per-chain losses are summed, and the
    statistics returned are the chains' averaged with ``chain_weights`` [C] (default: equally).

    A batch is the critic's input: the codes and ``label_columns`` columns after them (none here; a
    conditioned trainer's batches carry each row's chain, :mod:`apd.distillation.conditioned`). The fakes
    a critic step scores come from :meth:`fakes_like`, a generator step's from :meth:`fakes`.

    On CUDA (``cuda_graph``, on there by default) :meth:`step` — its critic steps and its generator step — is
    recorded as one CUDA graph after three steps as usual, and replayed (:class:`~apd.cuda_graphs.RecordedStep`):
    a step of these small networks is several hundred short kernels, which the replay launches in one call.
    It draws what the steps as usual draw and makes the same updates (the optimisers then keep their step
    counts on the device, as recording requires).
    """

    label_columns: ClassVar[int] = 0

    def __init__(
        self,
        generator: Generator,
        critic: Critic,
        loss: GANLoss | str = "wgan-gp",
        *,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        seed: int | Sequence[int] = 0,
        chain_weights: Tensor | None = None,
        cuda_graph: bool | None = None,
    ) -> None:
        if generator.out_dim + self.label_columns != critic.in_dim:
            raise ValueError(f"generator makes {generator.out_dim}-vectors (and {self.label_columns} label columns), "
                             f"critic takes {critic.in_dim}")
        self.generator = generator
        self.critic = critic
        self.loss = make_loss(loss) if isinstance(loss, str) else loss
        first_weight = critic.input_layer.weight
        self.device, self.dtype = first_weight.device, first_weight.dtype
        self.graphed = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if self.graphed and self.device.type != "cuda":
            raise ValueError(f"a CUDA graph of the GAN step needs CUDA; the networks are on {self.device}")
        self.generator_opt, self.critic_opt = make_optimizers(self.loss.kind, generator, critic, lr, betas,
                                                              capturable=self.graphed)
        self.rng = seeded_streams(seed, self.device)
        self.chains = (len(seed),) if isinstance(seed, Sequence) else ()  # the batches' leading axes
        if self.chains and chain_weights is None:
            chain_weights = torch.full(self.chains, 1 / len(seed))
        self.chain_weights = None if chain_weights is None else chain_weights.double().cpu()
        self.critic_steps = 0
        self.generator_steps = 0
        self._recording: RecordedStep | None = None
        self._recorded_real: Tensor | None = None  # the recorded step's real batches [n_critic, *chains, B, D]

    def critic_step(self, real: Tensor) -> dict[str, float]:
        """One critic update on ``real`` [B, D] ([C, B, D] for C chains) and B fresh generator samples (per
        chain); returns the loss's stats (``critic_loss``, plus ``wasserstein`` = E[D(real)] − E[D(fake)]
        and ``gradient_penalty`` for the Wasserstein kinds, or ``real_prob``/``fake_prob`` for the vanilla
        GAN)."""
        stats = self._critic_update(self._checked_batch(real))
        self.critic_steps += 1
        return self.averaged(self._checked(stats, f"critic step {self.critic_steps}"))

    def generator_step(self, batch_size: int) -> dict[str, float]:
        """One generator update on ``batch_size`` fresh samples; returns ``{"generator_loss": …}``.

        Gradients flow through the critic but are accumulated only into the generator, so the critic's
        large input-layer weight gradient is never computed here.
        """
        stats = self._generator_update(batch_size)
        self.generator_steps += 1
        return self.averaged(self._checked(stats, f"generator step {self.generator_steps}"))

    def _checked_batch(self, real: Tensor) -> Tensor:
        """``real`` on the trainer's device and dtype, or a :class:`DataError` for a batch of another shape."""
        if real.ndim != len(self.chains) + 2 or real.shape[:-2] != self.chains or real.shape[-1] != self.critic.in_dim:
            raise DataError(f"real batch has shape {list(real.shape)}; "
                            f"expected [{', '.join(map(str, [*self.chains, 'batch', self.critic.in_dim]))}]")
        return real.to(self.device, self.dtype, non_blocking=True)

    def _critic_update(self, real: Tensor) -> dict[str, Tensor]:
        """The critic update of :meth:`critic_step` on a checked batch; its stats as tensors."""
        with torch.no_grad():
            fake = self.fakes_like(real)
        loss, stats = self.loss.critic_loss(self.critic, real, fake, rng=self.rng)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # the chains' sum: each chain's weights get their own loss's gradient
        self.critic_opt.step()
        self.loss.after_critic_step(self.critic)
        return stats

    def _generator_update(self, batch_size: int) -> dict[str, Tensor]:
        """The generator update of :meth:`generator_step`; its loss as a tensor."""
        fake = self.fakes(batch_size)
        loss = self.loss.generator_loss(self.critic, fake)
        self.generator_opt.zero_grad(set_to_none=True)
        loss.sum().backward(inputs=list(self.generator.parameters()))
        self.generator_opt.step()
        return {"generator_loss": loss.detach()}

    def fakes_like(self, real: Tensor) -> Tensor:
        """A fake batch of as many rows as the real batch ``real`` (per chain), from the trainer's streams."""
        return self.fakes(real.shape[-2])

    def fakes(self, batch_size: int) -> Tensor:
        """``batch_size`` generator samples (per chain), from the trainer's streams."""
        return self.generator.sample(batch_size, generator=self.rng)

    def step(
        self, real_batches: Iterable[Tensor] | Callable[[], Tensor], n_critic: int = 5
    ) -> dict[str, float]:
        """``n_critic`` critic updates, each on a fresh real batch, then one generator update of the same
        batch size (Gulrajani et al., 2017, Algorithm 1). ``real_batches`` is a zero-argument callable or
        an iterator (consumed across calls). Returns the critic stats averaged over the critic updates
        together with ``generator_loss`` (the chains' averaged with ``chain_weights``)."""
        return self.averaged(self.step_by_chain(real_batches, n_critic))

    def step_by_chain(
        self, real_batches: Iterable[Tensor] | Callable[[], Tensor], n_critic: int = 5
    ) -> dict[str, Tensor]:
        """:meth:`step`, its statistics each chain's own: float64 tensors [*chains] on the CPU (0-d for
        unstacked modules)."""
        if n_critic < 1:
            raise ValueError(f"n_critic must be at least 1, got {n_critic}")
        next_real = real_batches if callable(real_batches) else iter(real_batches).__next__
        if self.graphed:
            critic_stats, generator_stats = self._replayed(next_real, n_critic)
        else:
            critic_stats = []
            for _ in range(n_critic):
                real = self._checked_batch(next_real())
                critic_stats.append(self._critic_update(real))
            generator_stats = self._generator_update(real.shape[-2])
        totals: dict[str, Tensor] = {}
        for stats in critic_stats:
            self.critic_steps += 1
            for name, value in self._checked(stats, f"critic step {self.critic_steps}").items():
                totals[name] = totals.get(name, 0.0) + value / n_critic
        self.generator_steps += 1
        return totals | self._checked(generator_stats, f"generator step {self.generator_steps}")

    def _replayed(self, next_real: Callable[[], Tensor], n_critic: int
                  ) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        """The updates of :meth:`step` as a replay of their CUDA graph, the real batches copied into the
        tensor the graph reads first; a batch shape or ``n_critic`` the graph was not recorded with records
        another."""
        first = self._checked_batch(next_real())
        shape = (n_critic, *first.shape)
        if self._recorded_real is None or self._recorded_real.shape != shape:
            self._recorded_real = torch.empty(shape, device=self.device, dtype=self.dtype)
            self._recording = RecordedStep("GAN training", self.device, generators=self._streams())
        self._recorded_real[0].copy_(first)
        for slot in self._recorded_real[1:]:
            slot.copy_(self._checked_batch(next_real()))
        return self._recording(self._updates)

    def _updates(self) -> tuple[list[dict[str, Tensor]], dict[str, Tensor]]:
        """The updates of one :meth:`step` on the real batches in ``_recorded_real``: what is recorded."""
        real = self._recorded_real
        return [self._critic_update(batch) for batch in real], self._generator_update(real.shape[-2])

    @property
    def graph_recorded(self) -> bool:
        """Whether a step now replays the recorded CUDA graph (not before its fourth step, nor after a refused
        recording)."""
        return self._recording is not None and self._recording.recorded

    def _streams(self) -> list[torch.Generator]:
        return [self.rng] if isinstance(self.rng, torch.Generator) else list(self.rng)

    def state_dict(self) -> dict[str, Any]:
        """Both networks, both optimisers, the random stream and the step counters; tensors and plain
        containers only, so ``torch.load(..., weights_only=True)`` reads it back."""
        return {
            "kind": self.loss.kind,
            "generator": self.generator.state_dict(),
            "critic": self.critic.state_dict(),
            "generator_opt": self.generator_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "rng": self.rng.get_state() if self.chains == () else [g.get_state() for g in self.rng],
            "critic_steps": self.critic_steps,
            "generator_steps": self.generator_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; a checkpoint of another loss or shape is an
        :class:`ArtifactError`."""
        if state.get("kind") != self.loss.kind:
            raise ArtifactError(f"GAN checkpoint was trained with loss {state.get('kind')!r}, not "
                                f"{self.loss.kind!r}")
        try:
            self.generator.load_state_dict(state["generator"])
            self.critic.load_state_dict(state["critic"])
            # copies: an optimiser takes a state's tensors as they are, so a live trainer's would be shared
            self.generator_opt.load_state_dict(copy.deepcopy(state["generator_opt"]))
            self.critic_opt.load_state_dict(copy.deepcopy(state["critic_opt"]))
            self._set_rng_state(state["rng"])
            self._recording = self._recorded_real = None  # the optimisers' state is new: record again
            self.critic_steps = int(state["critic_steps"])
            self.generator_steps = int(state["generator_steps"])
        except (KeyError, RuntimeError, ValueError) as err:
            first_line = str(err).strip().splitlines()[0]
            raise ArtifactError(f"GAN checkpoint does not fit this generator/critic: {first_line}") from err

    def _set_rng_state(self, state: Tensor | list[Tensor]) -> None:
        """Restore the random streams from what :meth:`state_dict` saved."""
        if self.chains == ():
            self.rng.set_state(state.cpu())
            return
        if len(state) != len(self.rng):
            raise ValueError(f"{len(state)} chains' random streams for {len(self.rng)} chains")
        for rng, chain_state in zip(self.rng, state, strict=True):
            rng.set_state(chain_state.cpu())

    def _checked(self, stats: dict[str, Tensor], where: str) -> dict[str, Tensor]:
        """The statistics as float64 tensors on the CPU, each chain's own; a non-finite one (of any chain)
        raises :class:`DivergenceError`."""
        values = torch.stack(list(stats.values())).cpu()
        if not bool(values.isfinite().all()):
            name, *chain = (values.isfinite().logical_not().nonzero()[0]).tolist()
            value = values[(name, *chain)].item()
            where = f"{where} (chain {chain[0]})" if chain else where
            raise DivergenceError(f"GAN training diverged: {list(stats)[name]} is {value} at {where}")
        return dict(zip(stats, values.double().unbind(), strict=True))

    def averaged(self, stats: dict[str, Tensor], weights: Tensor | None = None) -> dict[str, float]:
        """Per-chain statistics (:meth:`step_by_chain`) as floats: Σ_j w_j s_j over the chains, with
        ``weights`` (default ``chain_weights``) [C]; those of unstacked modules as they are."""
        if not self.chains:
            return {name: value.item() for name, value in stats.items()}
        weights = self.chain_weights if weights is None else weights.double()
        return {name: (value @ weights).item() for name, value in stats.items()}
