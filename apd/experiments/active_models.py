"""The models of ``apd experiment active-learning`` (:mod:`apd.experiments.active_learning`), one round's
training and scoring: every model an MLP of the pipeline's layer sizes trained on the whole labelled set
at once (full batch), the members of one model and seed (every acquisition, every chain) side by side as
one batched network, each from its own seeded initialisation.

- ``sgld``: ``chains`` chains of the SGLD optimizer (:class:`apd.samplers.sgld.SGLD`) with N = the
  labelled count, the pipeline's prior variance and temperature, ``sgld_iterations`` steps of size
  ``sgld_lr`` (ε = lr/N); after ``sgld_burn_in`` steps every ``sgld_thin``-th iterate joins the ensemble;
- ``apd``: online distillation of the same kind of chains: their thinned samples enter a buffer; once it
  holds ``apd_warmup`` of the round's samples a subspace codec of rank ``apd_rank`` is fit to it
  (:func:`apd.distillation.codec.fit_codec`) and a WGAN-GP (:func:`apd.distillation.training.make_trainer`,
  the pipeline's ``[distill]`` optimiser and loss) takes its ``apd_steps`` generator steps spread over the
  rest of the sampling, on random batches of the buffer's codes. Accuracy and acquisition use
  ``apd_networks`` GENERATED networks, never the samples; the buffer is dropped after the round;
- ``mcdropout``: the net with dropout ``dropout`` after each hidden layer, trained by Adam (``train_lr``,
  ``weight_decay``, ``train_steps`` steps) and scored with dropout active over ``mc_passes`` passes;
- ``deterministic``: the same net without dropout; entropy and random acquisition only (BALD of one
  network is 0 everywhere).

Also the protocol's settings (:class:`ActivePlan`, from ``--option KEY=VALUE``), most of them the models'.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from apd.acquisition import ACQUISITIONS, SINGLE_NETWORK
from apd.config import DistillConfig, ResidualConfig, bounded
from apd.distillation.codec import WeightCodec, fit_codec
from apd.distillation.gan import GANTrainer
from apd.distillation.generator import DistilledGenerator
from apd.distillation.training import make_trainer
from apd.errors import ConfigError, DivergenceError
from apd.experiments.options import plan_from_options as options_plan
from apd.nets import ParamSpec, mlp, predict_probs
from apd.pipeline.runtime import RunContext
from apd.pipeline.sample_chains import PREFETCH_SETTINGS
from apd.pipeline.seeds import seed as derived_seed
from apd.samplers.sgld import SGLD

MODELS = ("sgld", "apd", "mcdropout", "deterministic")
EVAL_CHUNK = 2048  # inputs per chunk when scoring MC-dropout passes


@dataclass
class ActivePlan:
    """The protocol's settings, from ``--option KEY=VALUE`` (TOML values), e.g. ``--option rounds=30``.

    Zero for ``pool_size``, ``test_size``, ``target_accuracy``, ``sgld_lr``, ``prior_var`` and
    ``apd_networks`` means: the whole rest of the training split, the whole test split, 0.9 on digits and
    0.8 elsewhere, the pipeline's ``sgld.lr`` and ``sgld.prior_var``, and as many networks as the SGLD
    ensemble has samples."""

    models: list[str] = bounded(list(MODELS))
    acquisitions: list[str] = bounded(list(ACQUISITIONS))
    seeds: int = bounded(3, ge=1)
    rounds: int = bounded(20, ge=0)  # acquisitions per run: rounds + 1 trainings, the last without acquiring
    acquire: int = bounded(10, ge=1)
    initial_per_class: int = bounded(2, ge=1)
    pool_size: int = bounded(0, ge=0)
    test_size: int = bounded(0, ge=0)
    target_accuracy: float = bounded(0.0, ge=0, le=1)
    chains: int = bounded(2, ge=1)
    sgld_iterations: int = bounded(300, ge=1)
    sgld_burn_in: int = bounded(150, ge=0)
    sgld_thin: int = bounded(10, ge=1)
    sgld_lr: float = bounded(0.3, ge=0)
    prior_var: float = bounded(0.0, ge=0)
    apd_rank: int = bounded(8, ge=1)
    apd_steps: int = bounded(75, ge=1)
    apd_hidden: list[int] = bounded([64, 64])
    apd_batch: int = bounded(50, ge=1)
    apd_lr: float = bounded(0.01, ge=0)
    apd_warmup: float = bounded(1.0, gt=0, le=1)  # share of a round's samples in the buffer when the codec is fit
    apd_networks: int = bounded(0, ge=0)
    train_steps: int = bounded(200, ge=1)
    train_lr: float = bounded(0.01, gt=0)
    weight_decay: float = bounded(0.001, ge=0)
    dropout: float = bounded(0.5, gt=0, lt=1)
    mc_passes: int = bounded(20, ge=1)
    workers: int = bounded(0, ge=0)  # processes training (model, seed) batches side by side (0: one per
    # core, at most one per batch of a round); the same results for any number

    @property
    def samples_per_chain(self) -> int:
        return max(0, self.sgld_iterations - self.sgld_burn_in) // self.sgld_thin

    @property
    def ensemble_size(self) -> int:
        """SGLD samples per round and trajectory: chains × thinned samples per chain."""
        return self.chains * self.samples_per_chain

    @property
    def apd_fit_samples(self) -> int:
        """Samples in the buffer when APD's codec is fit: ``apd_warmup`` of the round's, at least rank + 1,
        whole sampling points."""
        points = math.ceil(max(self.apd_rank + 1, self.apd_warmup * self.ensemble_size) / self.chains - 1e-9)
        return points * self.chains


def plan_from_options(options: list[str]) -> ActivePlan:
    """An :class:`ActivePlan` from ``KEY=VALUE`` strings, checked like a config section, then for
    consistency; every problem is a one-line :class:`ConfigError`."""
    plan = options_plan(options, ActivePlan)
    for key, allowed in (("models", MODELS), ("acquisitions", ACQUISITIONS)):
        chosen = getattr(plan, key)
        unknown = [name for name in chosen if name not in allowed]
        if unknown or not chosen or len(set(chosen)) != len(chosen):
            raise ConfigError(f"--option {key}: choose distinct names among {', '.join(allowed)} "
                              f"(got {chosen})")
    if not trajectories(plan):
        raise ConfigError("--option models/acquisitions: the deterministic net runs only entropy and random")
    if {"sgld", "apd"} & set(plan.models) and plan.samples_per_chain < 1:
        raise ConfigError("--option sgld_iterations/sgld_burn_in/sgld_thin: no thinned sample left per chain")
    if "apd" in plan.models and plan.apd_fit_samples > plan.ensemble_size:
        raise ConfigError(f"--option apd_rank: rank {plan.apd_rank} needs more than the {plan.ensemble_size} "
                          "SGLD samples of a round (chains × thinned samples per chain)")
    return plan


def trajectories(plan: ActivePlan) -> list[tuple[str, str]]:
    """(model, acquisition) pairs run for every seed, in table order."""
    return [(m, a) for m in plan.models for a in plan.acquisitions
            if m != "deterministic" or a in SINGLE_NETWORK]


# ------------------------------------------------------------------------------------ batched networks


def init_members(sizes: list[int], seeds: list[int], device: torch.device) -> list[Tensor]:
    """Per-layer weights and biases of len(seeds) MLPs, each with :func:`apd.nets.mlp`'s initialisation
    from its own seed, stacked: [W₁ [B, h, in], b₁ [B, h], …] as leaves that require gradients."""
    spec = ParamSpec.from_module(mlp(sizes))
    flats = []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            flats.append(spec.flatten(mlp(sizes)))
    views = spec.unflatten(torch.stack(flats).to(device))
    return [views[name].clone().requires_grad_() for name in spec.names]


def flat_members(params: list[Tensor]) -> Tensor:
    """[B, D] weight vectors in :class:`ParamSpec` order (weight, bias per layer), detached."""
    return torch.cat([p.detach().reshape(len(p), -1) for p in params], dim=1)


def forward_members(params: list[Tensor], x: Tensor, masks: list[Tensor] | None = None) -> Tensor:
    """Logits [B, n, C] of B MLPs, member b on its own inputs x[b] ([B, n, in]); ``masks`` (one [B, n, h]
    per hidden layer) multiply the hidden activations (inverted dropout)."""
    h = x
    layers = len(params) // 2
    for i in range(layers):
        weight, bias = params[2 * i], params[2 * i + 1]
        h = torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))
        if i < layers - 1:
            h = h.relu()
            if masks is not None:
                h = h * masks[i]
    return h


def members_nll(params: list[Tensor], x: Tensor, y: Tensor, masks: list[Tensor] | None = None) -> Tensor:
    """Σ_b mean_i −log p(y[b, i] | x[b, i], θ_b): each member's gradient is that of its own mean NLL."""
    logits = forward_members(params, x, masks)
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1).sum()


def dropout_masks(params: list[Tensor], n: int, p: float, generator: torch.Generator) -> list[Tensor]:
    """Inverted-dropout masks [B, n, h] (keep with probability 1 − p, scaled by 1/(1 − p)) per hidden layer."""
    shapes = [(len(params[0]), n, w.shape[1]) for w in params[:-2:2]]
    keep = 1.0 - p
    return [torch.bernoulli(torch.full(shape, keep, device=params[0].device), generator=generator).div_(keep)
            for shape in shapes]


# ---------------------------------------------------------------------------------------------- models


@dataclass
class Fitted:
    """One round's trained model of one trajectory: ``probs(x, generator)`` → member probabilities
    [K, N, C]; ``stored`` its stored numbers (APD: generator + codec)."""

    probs: Callable[[Tensor, torch.Generator], Tensor]
    stored: int = 0


@dataclass
class BatchTimes:
    sgld: float = 0.0
    gan: float = 0.0
    train: float = 0.0


class OnlineGAN:
    """Online APD for one trajectory within one round: the chains' thinned samples enter a buffer; once
    it holds ``plan.apd_fit_samples`` samples the subspace codec is fit to it and the GAN starts; after each
    later sampling point the GAN catches up with its share of the ``apd_steps`` generator steps, so the
    last step comes with the last sample."""

    def __init__(self, plan: ActivePlan, d: DistillConfig, seed: int, device: torch.device) -> None:
        self.plan, self.d, self.seed, self.device = plan, d, seed, device
        self.buffer: list[Tensor] = []
        self.codec: WeightCodec | None = None
        self.trainer: GANTrainer | None = None
        self.rng = torch.Generator(device=device).manual_seed(derived_seed(seed, "batches"))
        start = plan.apd_fit_samples // plan.chains  # the sampling point (1-based) the codec is fit at
        self.points = plan.samples_per_chain - start + 1  # sampling points with GAN steps, the fit's included
        self.done_points = 0

    def add(self, samples: Tensor) -> None:
        """The chains' new samples [chains, D]; then the GAN steps now due."""
        self.buffer.append(samples)
        if self.codec is None:
            if len(self.buffer) * self.plan.chains < self.plan.apd_fit_samples:
                return
            self.codec = fit_codec("subspace", torch.cat(self.buffer).cpu(), self.plan.apd_rank, residual=False,
                                   seed=derived_seed(self.seed, "codec")).to(self.device)
            self.trainer = make_trainer(self.d, self.codec.code_dim, derived_seed(self.seed, "gan"), self.device)
        codes = self.codec.encode(torch.cat(self.buffer))
        self.done_points += 1
        due = round(self.plan.apd_steps * self.done_points / self.points)

        def real() -> Tensor:
            return codes[torch.randint(len(codes), (self.d.batch_size,), generator=self.rng, device=self.device)]

        while self.trainer.generator_steps < due:
            self.trainer.step(real, self.d.n_critic)

    def model(self) -> DistilledGenerator:
        if self.trainer is None or self.trainer.generator_steps != self.plan.apd_steps:
            raise RuntimeError("the GAN has not finished its steps")
        return DistilledGenerator(self.trainer.generator, self.codec).eval()


SGLD_SETTINGS = ("lr", "prior_var", "temperature")  # what run_sgld reads of [sgld]
GAN_SETTINGS = ("loss", "z_dim", "gen_hidden", "critic_hidden", "gp_weight", "clip", "n_critic", "lr", "beta1",
                "beta2", "batch_size")  # what OnlineGAN and make_trainer read of apd_config's section


def settings_read(ctx: RunContext, plan: ActivePlan) -> dict:
    """The pipeline's settings these models read: the seed, ``[data]``, ``[net]``, ``[sgld]``'s step, prior and
    temperature, and the GAN's settings of :func:`apd_config` (the plan's widths, batch and lr in place of the
    section's). The rest of ``[sgld]`` and ``[distill]`` (the offline distiller's kind, rank, precision,
    steps, seeds) changes no model here."""
    cfg, gan = ctx.cfg, apd_config(ctx, plan)
    return {"seed": cfg.seed, "data": dataclasses.asdict(cfg.data), "net": dataclasses.asdict(cfg.net),
            "sgld": {key: getattr(cfg.sgld, key) for key in SGLD_SETTINGS},
            "gan": {key: getattr(gan, key) for key in GAN_SETTINGS}}


def apd_config(ctx: RunContext, plan: ActivePlan) -> DistillConfig:
    """The pipeline's ``[distill]`` section (loss, optimiser, z, critic steps) for a subspace GAN of the
    plan's rank, widths, batch and steps, without a residual."""
    return dataclasses.replace(ctx.cfg.distill, generator="subspace", subspace_rank=plan.apd_rank,
                               residual=ResidualConfig(model="none"), gen_hidden=list(plan.apd_hidden),
                               critic_hidden=list(plan.apd_hidden), batch_size=plan.apd_batch, steps=plan.apd_steps,
                               lr=plan.apd_lr or ctx.cfg.distill.lr)


def run_sgld(ctx: RunContext, plan: ActivePlan, x: Tensor, y: Tensor, seed: int,
             on_sample: Callable[[Tensor], None] | None = None) -> Tensor:
    """``plan.chains`` SGLD chains per labelled set x[t], y[t] ([T, n, in], [T, n]), all batched; returns the
    thinned samples [T, chains × samples per chain, D]. ``on_sample`` gets each sampling point's new
    samples [T, chains, D]."""
    s = ctx.cfg.sgld
    n_sets, n = y.shape
    chains, members = plan.chains, n_sets * plan.chains
    params = init_members(ctx.net_sizes, [derived_seed(seed, "init", b) for b in range(members)], ctx.device)
    xm, ym = x.repeat_interleave(chains, 0), y.repeat_interleave(chains, 0)
    lr = plan.sgld_lr or s.lr
    optimizer = SGLD(params, lr=lr, num_data=n, prior_std=math.sqrt(plan.prior_var or s.prior_var),
                     temperature=s.temperature, seed=derived_seed(seed, "noise"),
                     prefetch_noise=PREFETCH_SETTINGS[ctx.cfg.prefetch_noise])
    samples = []
    for t in range(plan.sgld_iterations):
        loss = members_nll(params, xm, ym)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if t >= plan.sgld_burn_in and (t - plan.sgld_burn_in + 1) % plan.sgld_thin == 0:
            flat = flat_members(params)
            if not (math.isfinite(loss.item()) and torch.isfinite(flat).all()):
                raise DivergenceError(f"active learning: SGLD diverged at iteration {t} with {n} labels; "
                                      f"try a smaller --option sgld_lr (now {lr})")
            point = flat.view(n_sets, chains, -1)
            samples.append(point)
            if on_sample is not None:
                on_sample(point)
    return torch.stack(samples, 2).reshape(n_sets, chains * len(samples), -1)


def train_nets(ctx: RunContext, plan: ActivePlan, x: Tensor, y: Tensor, dropout: float, seed: int) -> list[Tensor]:
    """One net per labelled set x[t], y[t], trained side by side by full-batch Adam with weight decay for
    ``plan.train_steps`` steps (inverted dropout ``dropout`` after each hidden layer); per-layer parameters."""
    params = init_members(ctx.net_sizes, [derived_seed(seed, "init", t) for t in range(len(y))], ctx.device)
    optimizer = torch.optim.Adam(params, lr=plan.train_lr, weight_decay=plan.weight_decay)
    rng = torch.Generator(device=ctx.device).manual_seed(derived_seed(seed, "dropout"))
    for _ in range(plan.train_steps):
        masks = dropout_masks(params, y.shape[1], dropout, rng) if dropout else None
        loss = members_nll(params, x, y, masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if not all(torch.isfinite(p).all() for p in params):
        raise DivergenceError(f"active learning: training diverged; try a smaller --option train_lr "
                              f"(now {plan.train_lr})")
    return [p.detach() for p in params]


@torch.no_grad()
def mc_dropout_member_probs(params: list[Tensor], x: Tensor, passes: int, p: float,
                            generator: torch.Generator) -> Tensor:
    """[passes, N, C]: one net (per-layer parameters without the member axis) with a fresh dropout mask
    per pass and input."""
    out = []
    keep = 1.0 - p
    layers = len(params) // 2
    for start in range(0, len(x), EVAL_CHUNK):
        h = x[start:start + EVAL_CHUNK].unsqueeze(0)
        for i in range(layers):
            h = torch.matmul(h, params[2 * i].t()) + params[2 * i + 1]
            if i < layers - 1:
                h = h.relu()
                mask = torch.bernoulli(torch.full((passes, h.shape[1], h.shape[2]), keep, device=h.device),
                                       generator=generator)
                h = h * mask / keep
        out.append(torch.softmax(h, -1))
    return torch.cat(out, 1)


def fit_models(ctx: RunContext, plan: ActivePlan, model: str, x: Tensor, y: Tensor, seed: int,
               times: BatchTimes) -> list[Fitted]:
    """Model ``model`` trained on each labelled set x[t], y[t]; one :class:`Fitted` per set."""
    spec = ParamSpec.from_module(ctx.network())
    if model == "sgld":
        started = time.perf_counter()
        samples = run_sgld(ctx, plan, x, y, seed)
        times.sgld += time.perf_counter() - started
        return [Fitted(lambda inputs, rng, w=w: predict_probs(spec, w, inputs)) for w in samples]
    if model == "apd":
        d = apd_config(ctx, plan)
        gans = [OnlineGAN(plan, d, derived_seed(seed, "apd", t), ctx.device) for t in range(len(y))]

        def feed(point: Tensor) -> None:
            started = time.perf_counter()
            for gan, samples in zip(gans, point, strict=True):
                gan.add(samples)
            times.gan += time.perf_counter() - started

        started = time.perf_counter()
        run_sgld(ctx, plan, x, y, seed, on_sample=feed)
        times.sgld += time.perf_counter() - started - times.gan
        networks = plan.apd_networks or plan.ensemble_size
        out = []
        for gan in gans:
            generator = gan.model()
            out.append(Fitted(lambda inputs, rng, g=generator: predict_probs(spec, g.sample_weights(networks, rng),
                                                                              inputs),
                              stored=generator.stored_parameters()))
        return out
    started = time.perf_counter()
    dropout = plan.dropout if model == "mcdropout" else 0.0
    params = train_nets(ctx, plan, x, y, dropout, seed)
    times.train += time.perf_counter() - started
    if model == "mcdropout":
        return [Fitted(lambda inputs, rng, t=t: mc_dropout_member_probs([p[t] for p in params], inputs,
                                                                        plan.mc_passes, dropout, rng))
                for t in range(len(y))]
    flat = flat_members(params)
    return [Fitted(lambda inputs, rng, w=w: predict_probs(spec, w.unsqueeze(0), inputs)) for w in flat]


