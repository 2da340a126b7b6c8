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
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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


class Generator(nn.Module):
    """θ = G(z), z ~ N(0, I_{z_dim}): Linear+ReLU hidden layers and a linear output of size ``out_dim``.

    APD (Wang et al., 2018) uses z_dim 32 and hidden [100, 100, 100].
    """

    def __init__(self, z_dim: int, hidden: list[int], out_dim: int) -> None:
        super().__init__()
        self.z_dim = z_dim
        self.out_dim = out_dim
        self.net = mlp([z_dim, *hidden, out_dim])

    def forward(self, z: Tensor) -> Tensor:
        """θ = G(z) for z: [k, z_dim] → [k, out_dim]."""
        return self.net(z)

    def sample(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """Draw k vectors G(z), z ~ N(0, I), with z created on the module's device; shape [k, out_dim]."""
        weight = self.net[0].weight
        z = torch.randn(k, self.z_dim, device=weight.device, dtype=weight.dtype, generator=generator)
        return self(z)


class Critic(nn.Module):
    """D(x): Linear+ReLU hidden layers and a linear output of size ``out`` (the logit for the vanilla GAN).

    The first layer is exposed as :attr:`input_layer` and the remaining map as :meth:`head`, so the
    gradient penalty can work on first-layer pre-activations instead of D-dimensional inputs.
    """

    def __init__(self, in_dim: int, hidden: list[int], out: int = 1) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.net = mlp([in_dim, *hidden, out])

    @property
    def input_layer(self) -> nn.Linear:
        """The affine map h = W₁x + b applied to the D-dimensional input."""
        return self.net[0]

    def head(self, pre_activation: Tensor) -> Tensor:
        """Everything after the input layer's affine map (identity for a critic with no hidden layer)."""
        out = pre_activation
        for layer in self.net[1:]:
            out = layer(out)
        return out

    def forward(self, x: Tensor) -> Tensor:
        """D(x) for x: [B, in_dim] → [B, out]."""
        return self.net(x)


def scores_and_interpolate_grad_norm(
    critic: Critic, real: Tensor, fake: Tensor, alpha: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """D(real), D(fake) (each [B]) and ‖∇ₓD(x̂)‖₂ ([B]) at x̂ = fake + α·(real − fake), α: [B, 1].

    Exact and cheaper than differentiating through explicit interpolates: with first layer
    h = W₁x + b (affine), h(x̂) = h(fake) + α·(h(real) − h(fake)), and by the chain rule
    ∇ₓD(x̂) = W₁ᵀ g with g = ∂D/∂h at h(x̂), so ‖∇ₓD(x̂)‖² = gᵀ(W₁W₁ᵀ)g. The critic's input layer is
    therefore applied to two batches (not three) and no [B, D] gradient is ever formed; g comes from
    ``torch.autograd.grad(..., create_graph=True)`` so the penalty is differentiable in every weight.
    """
    layer = critic.input_layer
    h_real, h_fake = layer(real), layer(fake)
    h_mix = torch.lerp(h_fake, h_real, alpha)
    d_real, d_fake, d_mix = critic.head(torch.cat([h_real, h_fake, h_mix])).squeeze(-1).split(len(real))
    (g,) = torch.autograd.grad(d_mix.sum(), h_mix, create_graph=True)
    gram = layer.weight @ layer.weight.T
    sq_norm = ((g @ gram) * g).sum(dim=1)
    return d_real, d_fake, sq_norm.clamp_min(1e-12).sqrt()


class GANLoss(ABC):
    """A critic objective, a generator objective and an optional hook after each critic update."""

    kind: ClassVar[str]

    @abstractmethod
    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: torch.Generator | None = None
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
        return -critic(fake).mean()


class WassersteinGP(_Wasserstein):
    """WGAN-GP (Gulrajani et al., 2017): L_D = E[D(x̃)] − E[D(x)] + λ·E[(‖∇D(x̂)‖₂ − 1)²],
    x̂ = x̃ + α(x − x̃), α ~ U[0, 1] per example; L_G = −E[D(x̃)]."""

    kind = "wgan-gp"

    def __init__(self, gp_weight: float = 10.0) -> None:
        self.gp_weight = gp_weight

    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Two-sided penalty λ·E[(‖∇D(x̂)‖₂ − 1)²] on random interpolates (Gulrajani et al., 2017, Alg. 1)."""
        alpha = torch.rand(len(real), 1, device=real.device, dtype=real.dtype, generator=rng)
        d_real, d_fake, grad_norm = scores_and_interpolate_grad_norm(critic, real, fake, alpha)
        wasserstein = d_real.mean() - d_fake.mean()
        penalty = (grad_norm - 1).square().mean()
        loss = self.gp_weight * penalty - wasserstein
        return loss, _detached(critic_loss=loss, wasserstein=wasserstein, gradient_penalty=penalty)


class WassersteinClip(_Wasserstein):
    """WGAN (Arjovsky et al., 2017): L_D = E[D(x̃)] − E[D(x)], every critic weight clipped to [−c, c]
    after each critic update; L_G = −E[D(x̃)]."""

    kind = "wgan"

    def __init__(self, clip: float = 0.01) -> None:
        self.clip = clip

    def critic_loss(
        self, critic: Critic, real: Tensor, fake: Tensor, rng: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """L_D = −(E[D(x)] − E[D(x̃)]); the bracket estimates the Wasserstein-1 distance (up to scale)."""
        wasserstein = critic(real).mean() - critic(fake).mean()
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
        self, critic: Critic, real: Tensor, fake: Tensor, rng: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Binary cross-entropy, real labelled 1 and fake 0: softplus(−D(x)) + softplus(D(x̃))."""
        d_real, d_fake = critic(real), critic(fake)
        loss = F.softplus(-d_real).mean() + F.softplus(d_fake).mean()
        return loss, _detached(
            critic_loss=loss, real_prob=torch.sigmoid(d_real).mean(), fake_prob=torch.sigmoid(d_fake).mean()
        )

    def generator_loss(self, critic: Critic, fake: Tensor) -> Tensor:
        """L_G = −E[log σ(D(G(z)))] = E[softplus(−D(G(z)))] (Goodfellow et al., 2014, Section 3)."""
        return F.softplus(-critic(fake)).mean()


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
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """(generator optimiser, critic optimiser) for ``kind``: Adam(lr, β) for wgan-gp and gan, RMSprop(lr)
    for wgan; ``None`` takes the defaults in :data:`OPTIMIZER_DEFAULTS` (betas are ignored for RMSprop)."""
    if kind not in OPTIMIZER_DEFAULTS:
        raise ConfigError(f"unknown GAN loss {kind!r}; choose one of {', '.join(GAN_KINDS)}")
    defaults = OPTIMIZER_DEFAULTS[kind]
    lr = defaults["lr"] if lr is None else lr
    if defaults["optimizer"] == "rmsprop":
        return (torch.optim.RMSprop(generator.parameters(), lr=lr, foreach=True),
                torch.optim.RMSprop(critic.parameters(), lr=lr, foreach=True))
    betas = defaults["betas"] if betas is None else betas
    return _adam(generator, lr, betas), _adam(critic, lr, betas)


def _adam(module: nn.Module, lr: float, betas: tuple[float, float]) -> torch.optim.Adam:
    """Adam with the fused kernel (several times faster than foreach on CPU), foreach where none exists."""
    params = list(module.parameters())
    try:
        return torch.optim.Adam(params, lr=lr, betas=betas, fused=True)
    except RuntimeError:  # a device without a fused Adam kernel
        return torch.optim.Adam(params, lr=lr, betas=betas, foreach=True)


def _detached(**stats: Tensor) -> dict[str, Tensor]:
    return {name: value.detach() for name, value in stats.items()}


class GANTrainer:
    """Generator, critic, their optimisers, the objective and the random stream of one GAN run.

    All tensors live on the modules' device (move the modules before building the trainer); real
    batches are moved there if needed. z and the interpolation weights come from the trainer's own
    seeded ``torch.Generator``, which is part of :meth:`state_dict`, so a resumed run repeats exactly.
    A non-finite loss raises :class:`DivergenceError`.
    """

    def __init__(
        self,
        generator: Generator,
        critic: Critic,
        loss: GANLoss | str = "wgan-gp",
        *,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        seed: int = 0,
    ) -> None:
        if generator.out_dim != critic.in_dim:
            raise ValueError(f"generator makes {generator.out_dim}-vectors, critic takes {critic.in_dim}")
        self.generator = generator
        self.critic = critic
        self.loss = make_loss(loss) if isinstance(loss, str) else loss
        self.generator_opt, self.critic_opt = make_optimizers(self.loss.kind, generator, critic, lr, betas)
        first_weight = critic.input_layer.weight
        self.device, self.dtype = first_weight.device, first_weight.dtype
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(seed)
        self.critic_steps = 0
        self.generator_steps = 0

    def critic_step(self, real: Tensor) -> dict[str, float]:
        """One critic update on ``real`` [B, D] and B fresh generator samples; returns the loss's stats
        (``critic_loss``, plus ``wasserstein`` = E[D(real)] − E[D(fake)] and ``gradient_penalty`` for the
        Wasserstein kinds, or ``real_prob``/``fake_prob`` for the vanilla GAN)."""
        if real.ndim != 2 or real.shape[1] != self.critic.in_dim:
            raise DataError(f"real batch has shape {list(real.shape)}; "
                            f"expected [batch, {self.critic.in_dim}]")
        real = real.to(self.device, self.dtype, non_blocking=True)
        with torch.no_grad():
            fake = self.generator.sample(len(real), generator=self.rng)
        loss, stats = self.loss.critic_loss(self.critic, real, fake, rng=self.rng)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        self.loss.after_critic_step(self.critic)
        self.critic_steps += 1
        return self._checked(stats, f"critic step {self.critic_steps}")

    def generator_step(self, batch_size: int) -> dict[str, float]:
        """One generator update on ``batch_size`` fresh samples; returns ``{"generator_loss": …}``.

        Gradients flow through the critic but are accumulated only into the generator, so the critic's
        large input-layer weight gradient is never computed here.
        """
        fake = self.generator.sample(batch_size, generator=self.rng)
        loss = self.loss.generator_loss(self.critic, fake)
        self.generator_opt.zero_grad(set_to_none=True)
        loss.backward(inputs=list(self.generator.parameters()))
        self.generator_opt.step()
        self.generator_steps += 1
        return self._checked({"generator_loss": loss.detach()}, f"generator step {self.generator_steps}")

    def step(
        self, real_batches: Iterable[Tensor] | Callable[[], Tensor], n_critic: int = 5
    ) -> dict[str, float]:
        """``n_critic`` critic updates, each on a fresh real batch, then one generator update of the same
        batch size (Gulrajani et al., 2017, Algorithm 1). ``real_batches`` is a zero-argument callable or
        an iterator (consumed across calls). Returns the critic stats averaged over the critic updates
        together with ``generator_loss``."""
        if n_critic < 1:
            raise ValueError(f"n_critic must be at least 1, got {n_critic}")
        next_real = real_batches if callable(real_batches) else iter(real_batches).__next__
        totals: dict[str, float] = {}
        for _ in range(n_critic):
            real = next_real()
            for name, value in self.critic_step(real).items():
                totals[name] = totals.get(name, 0.0) + value / n_critic
        return totals | self.generator_step(len(real))

    def state_dict(self) -> dict[str, Any]:
        """Both networks, both optimisers, the random stream and the step counters; tensors and plain
        containers only, so ``torch.load(..., weights_only=True)`` reads it back."""
        return {
            "kind": self.loss.kind,
            "generator": self.generator.state_dict(),
            "critic": self.critic.state_dict(),
            "generator_opt": self.generator_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "rng": self.rng.get_state(),
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
            self.generator_opt.load_state_dict(state["generator_opt"])
            self.critic_opt.load_state_dict(state["critic_opt"])
            self.rng.set_state(state["rng"].cpu())
            self.critic_steps = int(state["critic_steps"])
            self.generator_steps = int(state["generator_steps"])
        except (KeyError, RuntimeError, ValueError) as err:
            first_line = str(err).strip().splitlines()[0]
            raise ArtifactError(f"GAN checkpoint does not fit this generator/critic: {first_line}") from err

    @staticmethod
    def _checked(stats: dict[str, Tensor], where: str) -> dict[str, float]:
        values = dict(zip(stats, torch.stack(list(stats.values())).tolist(), strict=True))
        for name, value in values.items():
            if not math.isfinite(value):
                raise DivergenceError(f"GAN training diverged: {name} is {value} at {where}")
        return values
