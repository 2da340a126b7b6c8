"""``apd distill``: train the APD generator (Wang et al., 2018) on SGLD samples.

Offline, the GAN learns from ``samples.h5``; online, SGLD chains and GAN updates alternate and the GAN
sees a FIFO buffer of recent thinned samples, so no sample store is needed. Either way the GAN works in
the space of a :class:`~apd.codec.WeightCodec` (raw vectors, standardised vectors, or principal-subspace
coordinates), and every ``eval_every`` generator steps the validation accuracy of an ensemble of
``eval_networks`` generated networks is compared with an equal SGLD ensemble. The generator with the
best validation accuracy is saved as ``generator.pt`` (the last one as ``generator-last.pt``) beside
``generator.json`` (spec, architecture, training summary, written last).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from apd.artifacts import (
    is_complete,
    load_checkpoint,
    load_torch,
    manifest_digest,
    manifest_path,
    read_json,
    save_torch_atomic,
    write_manifest,
)
from apd.codec import WeightCodec, fit_codec, storage_in_samples
from apd.config import DistillConfig, config_hash
from apd.errors import ArtifactError
from apd.gan import Critic, GANTrainer, Generator, make_loss
from apd.kronecker import KroneckerResidual
from apd.metrics import accuracy
from apd.nets import ParamSpec, mlp, predict_probs
from apd.residual import match_residual_scale, mean_mutual_information
from apd.runtime import RunContext
from apd.sampling import SGLDChain, is_thinned_sample, samples_path
from apd.store import SampleStore

log = logging.getLogger(__name__)

MONITOR_SIZE = 2000  # validation images the generated ensemble is scored on during training
FISHER_INPUTS = 5000  # training images the Kronecker residual's factors are estimated on


class DistilledGenerator(nn.Module):
    """θ = codec.decode(G(z)), z ~ N(0, I): the APD posterior approximation over flat weight vectors."""

    def __init__(self, generator: Generator, codec: WeightCodec) -> None:
        super().__init__()
        self.generator, self.codec = generator, codec

    @torch.no_grad()
    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return self.codec.decode(self.generator.sample(k, generator=generator), generator=generator)

    def stored_parameters(self) -> int:
        return sum(p.numel() for p in self.generator.parameters()) + self.codec.stored_parameters()


def uses_kronecker(cfg: DistillConfig) -> bool:
    """Whether the codec's residual is the Kronecker-factored one (:mod:`apd.kronecker`)."""
    return cfg.generator == "subspace" and cfg.subspace_residual and cfg.subspace_residual_model == "kronecker"


def make_codec(ctx: RunContext, cfg: DistillConfig, samples: Tensor) -> WeightCodec:
    """The codec of ``cfg`` fit to ``samples`` [n, D] (CPU), on the run's device. A Kronecker residual is
    fit at the samples' mean on :data:`FISHER_INPUTS` random training images, for the SGLD posterior's
    N/T data points and prior precision 1/(prior_var·T)."""
    kronecker = uses_kronecker(cfg)
    codec = fit_codec(codec_kind(cfg), samples, cfg.subspace_rank, cfg.subspace_residual and not kronecker,
                      seed=ctx.cfg.seed)
    if kronecker:
        s, x = ctx.cfg.sgld, ctx.data.x_train
        rng = torch.Generator().manual_seed(ctx.cfg.seed + 7)
        rows = torch.randperm(len(x), generator=rng)[:FISHER_INPUTS]
        codec.kronecker = KroneckerResidual.fit(ctx.net_sizes, cfg.kronecker_rank, codec.mean, x[rows],
                                                len(x) / s.temperature, 1.0 / (s.prior_var * s.temperature), rng)
    return codec.to(ctx.device)


def codec_kind(cfg: DistillConfig) -> str:
    if cfg.generator == "subspace":
        return "subspace"
    return "standardize" if cfg.standardize else "identity"


def architecture(cfg: DistillConfig, dim: int, layer_sizes: list[int]) -> dict:
    """What :func:`load_generator` needs to rebuild the modules (stored in ``generator.json``)."""
    kronecker = uses_kronecker(cfg)
    return {"codec": codec_kind(cfg), "dim": dim, "rank": cfg.subspace_rank,
            "residual": cfg.subspace_residual and not kronecker,
            "kronecker_rank": cfg.kronecker_rank if kronecker else 0, "layer_sizes": layer_sizes,
            "z_dim": cfg.z_dim, "gen_hidden": cfg.gen_hidden, "critic_hidden": cfg.critic_hidden, "loss": cfg.loss}


def build_generator(arch: dict) -> DistilledGenerator:
    codec = WeightCodec.empty(arch["codec"], arch["dim"], arch["rank"], arch["residual"])
    if arch.get("kronecker_rank"):
        codec.kronecker = KroneckerResidual(arch["layer_sizes"], arch["kronecker_rank"])
    return DistilledGenerator(Generator(arch["z_dim"], arch["gen_hidden"], codec.code_dim), codec)


def generator_path(ctx: RunContext) -> Path:
    return ctx.out_dir / "generator.pt"


def load_generator(path: Path, expect_spec: ParamSpec | None = None,
                   device: torch.device | str = "cpu") -> tuple[DistilledGenerator, dict]:
    """Rebuild a saved generator from ``generator.pt`` (weights only) and ``generator.json``; returns it
    (in eval mode) with its manifest. A generator for another network is an :class:`ArtifactError`."""
    manifest = read_json(manifest_path(path))
    try:
        spec, arch = ParamSpec.from_json(manifest["spec"]), manifest["architecture"]
    except KeyError as exc:
        raise ArtifactError(f"{manifest_path(path)}: not a generator manifest (no {exc})") from None
    if expect_spec is not None and spec != expect_spec:
        raise ArtifactError(f"{path}: generator makes weights for a {spec.layer_sizes} network, the pipeline's "
                            f"network is {expect_spec.layer_sizes}; run `apd distill --force`")
    model = build_generator(arch)
    state = load_torch(path)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ArtifactError(f"{path}: does not match {manifest_path(path)} ({str(exc).splitlines()[0]})") from None
    return model.to(device).eval(), manifest


class EnsembleMonitor:
    """Validation accuracy of an ensemble of k networks, on a fixed subset of validation images, and
    the reference it is compared with: k SGLD samples drawn by ``draw_sgld(k, generator)``."""

    def __init__(self, ctx: RunContext, spec: ParamSpec, networks: int,
                 draw_sgld: Callable[[int, torch.Generator], Tensor]) -> None:
        self.spec, self.networks = spec, networks
        self.x = ctx.data.x_val[:MONITOR_SIZE].to(ctx.device)
        self.y = ctx.data.y_val[:MONITOR_SIZE].to(ctx.device)
        self.rng = torch.Generator(device=ctx.device).manual_seed(ctx.cfg.seed + 99)
        sgld = draw_sgld(networks, self.rng)
        self.reference_accuracy = self.accuracy(sgld)
        self.reference_information = mean_mutual_information(spec, sgld, self.x)

    def accuracy(self, weights: Tensor) -> float:
        return accuracy(predict_probs(self.spec, weights, self.x).mean(0), self.y)

    def generated_accuracy(self, model: DistilledGenerator) -> float:
        """Accuracy of the generator's networks without the residual, which is only scaled after training
        (at its fitted scale it would swamp the comparison between generator steps)."""
        codes = model.generator.sample(self.networks, generator=self.rng)
        return self.accuracy(model.codec.decode_principal(codes))


def make_trainer(cfg: DistillConfig, code_dim: int, seed: int, device: torch.device) -> GANTrainer:
    """Generator and critic (initialised from ``seed``) for codes of ``code_dim``; ``lr`` 0 takes the
    loss's default."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = Generator(cfg.z_dim, cfg.gen_hidden, code_dim).to(device)
        critic = Critic(code_dim, cfg.critic_hidden).to(device)
    loss = make_loss(cfg.loss, gp_weight=cfg.gp_weight, clip=cfg.clip)
    return GANTrainer(generator, critic, loss, lr=cfg.lr or None, betas=(cfg.beta1, cfg.beta2), seed=seed)


def run_distill(ctx: RunContext) -> Path:
    """The whole stage: offline or online as configured; a complete generator is reused."""
    return distill_online(ctx) if ctx.cfg.distill.mode == "online" else distill_offline(ctx)


def evenly_spaced(n: int, k: int) -> list[int]:
    """min(n, k) row indices spread evenly over 0 … n − 1 (the samples a codec is fit to)."""
    return sorted({int(i) for i in torch.linspace(0, n - 1, min(n, k)).round().tolist()})


class StoreBatches:
    """Random real batches, as codes, from a sample store: held in memory when small enough."""

    def __init__(self, store: SampleStore, codec: WeightCodec, batch_size: int, in_memory_gb: float,
                 seed: int, device: torch.device) -> None:
        self.store, self.codec, self.batch_size, self.device = store, codec, batch_size, device
        self.rng = torch.Generator().manual_seed(seed)
        n, code_dim = len(store), codec.code_dim
        self.codes = None
        if n * code_dim * 4 <= in_memory_gb * 2**30:
            chunks = [codec.encode(store.read_all(i, min(n, i + 1000))) for i in range(0, n, 1000)]
            self.codes = torch.cat(chunks).to(device)

    def __call__(self) -> Tensor:
        index = torch.randint(len(self.store), (self.batch_size,), generator=self.rng)
        if self.codes is not None:
            return self.codes[index.to(self.device)]
        return self.codec.encode(self.store.read(index.numpy())).to(self.device)


def stored_draws(store: SampleStore, device: torch.device) -> Callable[[int, torch.Generator], Tensor]:
    """``draw(k, generator)``: k rows of ``store`` drawn uniformly (with replacement) on ``device``, the
    generator living on that device."""
    def draw(k: int, generator: torch.Generator) -> Tensor:
        rows = torch.randint(len(store), (k,), generator=generator, device=generator.device)
        return store.read(rows).to(device)
    return draw


def distill_offline(ctx: RunContext) -> Path:
    cfg, d = ctx.cfg, ctx.cfg.distill
    path, manifest = generator_path(ctx), manifest_path(generator_path(ctx))
    source = samples_path(ctx)
    if not manifest_path(source).is_file():
        raise ArtifactError(f"{source}: no complete sample store; run `apd sample --config {cfg.source}` first")
    stage_hash = config_hash(cfg, "distill")
    inputs = {"samples": manifest_digest(manifest_path(source))}
    if not ctx.force and is_complete(manifest, stage_hash, inputs):
        log.info("reusing %s (--force to redo)", path)
        return path
    manifest.unlink(missing_ok=True)
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    started = time.perf_counter()
    with SampleStore.open(source, expect_spec=spec) as store:
        fit_rows = evenly_spaced(len(store), d.fit_samples)
        codec = make_codec(ctx, d, store.read(fit_rows))
        real = StoreBatches(store, codec, d.batch_size, d.in_memory_gb, cfg.seed + 5, ctx.device)
        monitor = EnsembleMonitor(ctx, spec, d.eval_networks, stored_draws(store, ctx.device))
        trainer = make_trainer(d, codec.code_dim, cfg.seed + 3, ctx.device)
        summary = _train(ctx, trainer, codec, real, monitor, stage_hash, inputs, setup_seconds=0.0,
                         generators=(real.rng,))
        n_samples, store_bytes = len(store), source.stat().st_size
    summary["seconds"] = round(time.perf_counter() - started, 2)
    _finish(ctx, spec, codec, summary, stage_hash, inputs, n_samples, store_bytes)
    return path


def _train(ctx: RunContext, trainer: GANTrainer, codec: WeightCodec, real: Callable[[], Tensor],
           monitor: EnsembleMonitor, stage_hash: str, inputs: dict, setup_seconds: float,
           between_steps: Callable[[int], None] | None = None,
           generators: tuple[torch.Generator, ...] = ()) -> dict:
    """The GAN loop shared by both modes: checkpoints, evaluation, best-generator tracking, and at the
    end the residual's scale matched to SGLD's (:mod:`apd.residual`) when so configured.

    ``generators`` (e.g. the real-batch sampler's) are checkpointed with the trainer, so a resumed run
    repeats an uninterrupted one exactly."""
    generators = (*generators, monitor.rng)
    d = ctx.cfg.distill
    reference = monitor.reference_accuracy
    model = DistilledGenerator(trainer.generator, codec)
    checkpoint = generator_path(ctx).with_suffix(".ckpt.pt")
    history: list[dict] = []
    best = {"step": 0, "val_accuracy": -1.0, "state": None}
    resumable = between_steps is None  # online runs hold SGLD chains and a buffer: they start afresh
    ckpt = load_checkpoint(checkpoint, config_hash=stage_hash, inputs=inputs) if resumable and not ctx.force else None
    if ckpt is not None:
        trainer.load_state_dict(ckpt["trainer"])
        history, best = ckpt["history"], ckpt["best"]
        for rng, state in zip(generators, ckpt["generators"], strict=True):
            rng.set_state(state)
        log.info("resuming distillation at generator step %d", trainer.generator_steps)
    bar = ctx.progress(total=d.steps, initial=trainer.generator_steps, desc="WGAN-GP" if d.loss == "wgan-gp"
                       else d.loss.upper(), unit="step")
    stats: dict[str, float] = {}
    with bar:
        while trainer.generator_steps < d.steps:
            if between_steps is not None:
                between_steps(trainer.generator_steps)
            stats = trainer.step(real, d.n_critic)
            bar.update()
            step = trainer.generator_steps
            if step % d.eval_every == 0 or step == d.steps:
                model.eval()
                val = monitor.generated_accuracy(model)
                history.append({"step": step, "val_accuracy": val, **{k: round(v, 5) for k, v in stats.items()}})
                if val > best["val_accuracy"]:
                    best = {"step": step, "val_accuracy": val,
                            "state": copy.deepcopy(model.state_dict())}
                ctx.show(bar, f"generator step {step}/{d.steps}", W=f"{stats.get('wasserstein', math.nan):.3f}",
                         acc=f"{val:.4f}", ratio=f"{val / reference:.4f}")
            if resumable and step % d.checkpoint_every == 0 and step < d.steps:
                save_torch_atomic(checkpoint, {"config_hash": stage_hash, "inputs": inputs,
                                               "trainer": trainer.state_dict(), "history": history, "best": best,
                                               "generators": [rng.get_state() for rng in generators]})
    last = copy.deepcopy(model.state_dict())
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    residual = _match_residual(ctx, model, monitor) if codec.has_residual else {}
    last.update({f"codec.{name}": value.clone() for name, value in codec.state_dict().items()})
    save_torch_atomic(generator_path(ctx).with_name("generator-last.pt"), last)
    save_torch_atomic(generator_path(ctx), model.state_dict())
    checkpoint.unlink(missing_ok=True)
    return {"history": history, "best_step": best["step"], "best_val_accuracy": best["val_accuracy"],
            "sgld_val_accuracy": reference, "val_accuracy_ratio": best["val_accuracy"] / reference,
            "generator_parameters": model.stored_parameters(), "setup_seconds": setup_seconds,
            "final_stats": stats, **residual}


def _match_residual(ctx: RunContext, model: DistilledGenerator, monitor: EnsembleMonitor) -> dict:
    """Scale the codec's residual as configured (``matched``: :func:`scale_residual`; ``fitted``: α = 1);
    returns what goes into the manifest."""
    if ctx.cfg.distill.subspace_residual_scale == "fitted":
        return {"residual_scale": 1.0}
    alpha = scale_residual(model.codec, lambda k, rng: model.generator.sample(k, generator=rng), monitor)
    return {"residual_scale": alpha, "sgld_val_mutual_information": monitor.reference_information}


def scale_residual(codec: WeightCodec, sample_codes: Callable[[int, torch.Generator], Tensor],
                   monitor: EnsembleMonitor) -> float:
    """Multiply ``codec``'s residual in place by the α of :func:`~apd.residual.match_residual_scale` on the
    monitor's validation inputs and SGLD reference, for codes drawn by ``sample_codes``; returns α."""
    alpha = match_residual_scale(codec, sample_codes, monitor.spec, monitor.x, monitor.reference_information,
                                 monitor.networks, monitor.rng)
    codec.scale_residual_(alpha)
    log.info("residual scaled by %.3f: mean mutual information on validation inputs matched to SGLD's %.4f",
             alpha, monitor.reference_information)
    return alpha


def _finish(ctx: RunContext, spec: ParamSpec, codec: WeightCodec, summary: dict, stage_hash: str,
            inputs: dict, n_samples: int, store_bytes: int) -> None:
    path = generator_path(ctx)
    d = ctx.cfg.distill
    parameters = summary["generator_parameters"]
    write_manifest(manifest_path(path), "distill", stage_hash, inputs, spec=spec.to_json(),
                   architecture=architecture(d, spec.numel, ctx.net_sizes), mode=d.mode,
                   storage={"generator_parameters": parameters, "generator_bytes": path.stat().st_size,
                            "in_sgld_samples": round(storage_in_samples(parameters, spec.numel), 2),
                            "store_samples": n_samples, "store_bytes": store_bytes},
                   **summary)
    log.info("generator: best validation accuracy %.4f at step %d = %.4f of SGLD's %.4f; %s parameters "
             "(%.1f SGLD samples' worth); %.0f s → %s", summary["best_val_accuracy"], summary["best_step"],
             summary["val_accuracy_ratio"], summary["sgld_val_accuracy"], f"{parameters:,}",
             storage_in_samples(parameters, spec.numel), summary["seconds"], path)


def distill_online(ctx: RunContext) -> Path:
    """Alternate SGLD and GAN updates (no sample store): chains fill a FIFO buffer of thinned samples;
    every ``t_sgld`` new samples the GAN takes ``t_gan`` generator steps on batches from the buffer."""
    cfg, d, s = ctx.cfg, ctx.cfg.distill, ctx.cfg.sgld
    path, manifest = generator_path(ctx), manifest_path(generator_path(ctx))
    stage_hash = config_hash(cfg, "distill")
    if not ctx.force and is_complete(manifest, stage_hash, {}):
        log.info("reusing %s (--force to redo)", path)
        return path
    manifest.unlink(missing_ok=True)
    started = time.perf_counter()
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    x, y = ctx.data.x_train.to(ctx.device), ctx.data.y_train.to(ctx.device)
    chains = [SGLDChain(ctx, i, x, y) for i in range(s.chains)]
    buffer = torch.empty(d.buffer_size, spec.numel, device=ctx.device)
    position = {"t": [0] * s.chains, "count": 0, "round": 0}

    def add_samples(n: int) -> None:
        """Advance the chains round robin until ``n`` thinned samples have entered the buffer."""
        for _ in range(n):
            chain_index = position["count"] % s.chains
            chain, t = chains[chain_index], position["t"][chain_index]
            while True:
                loss = chain.step(t)
                t += 1
                if is_thinned_sample(s, chain.schedule, t - 1):
                    break
            position["t"][chain_index] = t
            buffer[position["count"] % d.buffer_size] = chain.checked_vector(spec, t - 1, loss, 0)
            position["count"] += 1

    log.info("online distillation: warming up the buffer with %d samples", d.buffer_size)
    add_samples(d.buffer_size)
    codec = make_codec(ctx, d, buffer.cpu())
    batch_rng = torch.Generator(device=ctx.device).manual_seed(cfg.seed + 5)

    def real_batch() -> Tensor:
        index = torch.randint(min(position["count"], d.buffer_size), (d.batch_size,), generator=batch_rng,
                              device=ctx.device)
        return codec.encode(buffer[index])

    monitor = EnsembleMonitor(ctx, spec, d.eval_networks, lambda k, rng: buffer[
        torch.randint(d.buffer_size, (k,), generator=rng, device=ctx.device)])
    trainer = make_trainer(d, codec.code_dim, cfg.seed + 3, ctx.device)
    model = DistilledGenerator(trainer.generator, codec)

    def between_steps(step: int) -> None:
        if step == 0 or step % d.t_gan:
            return
        add_samples(d.t_sgld)
        position["round"] += 1
        if d.restart_every and position["round"] % d.restart_every == 0:
            for chain, theta in zip(chains, model.sample_weights(len(chains)), strict=True):
                spec.load_into(chain.net, theta)

    setup = time.perf_counter() - started
    summary = _train(ctx, trainer, codec, real_batch, monitor, stage_hash, {}, setup, between_steps)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["sgld_samples_seen"] = position["count"]
    _finish(ctx, spec, codec, summary, stage_hash, {}, 0, 0)
    return path
