"""``apd distill``: train the APD generator (Wang et al., 2018) on SGLD samples.

Offline, the GAN learns from ``samples.h5``; online, SGLD chains and GAN updates alternate and the GAN
sees a FIFO buffer of recent thinned samples, so no sample store is needed. Either way the GAN works in
the space of a :class:`~apd.distillation.codec.WeightCodec`. Every ``eval_every`` generator steps the
generator is judged on validation inputs against SGLD's predictive there (:mod:`apd.distillation.selection`:
mean KL between the predictives plus the mean per-input BALD gap); the step with the lowest criterion is
kept (``selection = "last"`` keeps the last). The kept generator becomes ``generator.pt``, the last one
``generator-last.pt``, and ``generator.json`` records the criterion at every evaluation and the step
kept. With ``per_chain`` one generator per chain of the store learns from that chain's samples
(:mod:`apd.distillation.chain_generators`), all judged together as one generator; with ``mode_embedding``
one generator learns every chain's samples, told the chain by a learned embedding
(:mod:`apd.distillation.conditioned`). Both generators are
stored at ``precision``, the generator networks at ``generators_at`` and the codec's mean at ``mean_at`` where
given (:meth:`~apd.distillation.generator.DistilledGenerator.pack`). Files are built under temporary
names and swapped in only when the run has finished.

With ``[distill] seeds`` K > 1 the stage trains K generators, on ``[distill] workers`` processes (one after
another on each), each from its own seed streams (:func:`~apd.pipeline.recipes.distill_seed`) into its own
files (generator seed k: ``generator-seedK.pt``; seed 0 is ``generator.pt``), each with its manifest, reused
or resumed on its own. The samples are aligned once, before the workers start, and stored for every process
that needs them (:mod:`apd.pipeline.stored_alignment`). On a CUDA device the seeds still to train train as one
batch (:func:`trains_seeds_together`), each seed's GANs drawing from their own streams, so a seed's generator
is the one it is alone to float rounding; such a group checkpoints and resumes as one. The GAN loop itself
is :mod:`apd.pipeline.distill_loop`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from apd.config import config_hash
from apd.distillation.chain_generators import ChainGenerators, ChainTrainers
from apd.distillation.codec import WeightCodec
from apd.distillation.conditioned import ConditionedTrainer
from apd.distillation.gan import GANTrainer, Generator
from apd.distillation.generator import architecture, part_precisions, stored_as_json
from apd.distillation.precision import in_samples
from apd.distillation.training import (
    StoreBatches,
    evenly_spaced,
    make_chain_trainers,
    make_conditioned_trainer,
    make_trainer,
)
from apd.errors import ConfigError
from apd.io import read_json
from apd.nets import ParamSpec
from apd.pipeline.distill_loop import SeedRun, train
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.manifests import manifest_record
from apd.pipeline.parallel import split_work, worker_count
from apd.pipeline.recipes import (
    REFERENCE_SAMPLES,
    TrainingSamples,
    codec_for,
    distill_seed,
    store_alignment,
    training_samples,
    validation_monitor,
)
from apd.pipeline.runtime import RunContext, machine
from apd.pipeline.sample_chains import make_chains
from apd.pipeline.stage import publish, require_input, reusable, weights_load
from apd.samplers.store import SampleStore, chain_labels, chain_partition
from apd.schedules import is_thinned_sample

log = logging.getLogger(__name__)


def run_distill(ctx: RunContext) -> Path:
    """The whole stage: ``[distill] seeds`` generators, offline or online as configured; a complete one is
    reused. Returns seed 0's generator."""
    if ctx.cfg.distill.mode == "online":
        for k in range(ctx.cfg.distill.seeds):
            distill_online(ctx, k)
        return ctx.layout.generator
    return distill_offline(ctx)


def seed_reusable(ctx: RunContext, k: int, inputs: dict) -> bool:
    """Whether generator seed ``k`` is complete for this configuration and ``inputs``, loads, and is the seed
    its manifest says (a generator file copied over another seed's is made again)."""
    path = ctx.layout.generator_of(k)
    return (reusable(ctx, path, "distill", inputs) and weights_load(path, ctx.layout.generator_last_of(k))
            and read_json(manifest_of(path)).get("generator_seed", 0) == k)


def distill_offline(ctx: RunContext) -> Path:
    """Every generator seed not complete yet, on up to ``[distill] workers`` processes
    (:func:`~apd.pipeline.parallel.split_work`: seed k's generator is the same on any of them)."""
    d = ctx.cfg.distill
    inputs = {"samples": require_input(ctx, ctx.layout.samples, "sample")}
    todo = [k for k in range(d.seeds) if not seed_reusable(ctx, k, inputs)]
    if todo and d.align != "none" and worker_count(ctx, len(todo), d.workers) > 1:
        with SampleStore.open(ctx.layout.samples, expect_spec=ParamSpec.from_module(ctx.network())) as store:
            store_alignment(ctx, store)  # aligned here once and stored: the workers read it
    if todo:
        split_work(ctx, distill_seeds, todo, d.workers, "generator seeds", "distill")
    return ctx.layout.generator


def trains_seeds_together(ctx: RunContext, seeds: Sequence[int]) -> bool:
    """Whether generator seeds ``seeds`` train as one batch: on a CUDA device, where the seeds' small GANs
    stepped in turn leave the card waiting on their kernels, for one generator or one per chain (a
    conditioned generator trains alone). On a CPU they train in turn, so a seed's generator is the same bit
    for bit on any number of workers."""
    return ctx.device.type == "cuda" and len(seeds) > 1 and not ctx.cfg.distill.mode_embedding


def distill_seeds(ctx: RunContext, seeds: list[int]) -> None:
    """Generator seeds ``seeds``, one after another or as one batch (:func:`trains_seeds_together`), from the
    samples prepared once (:func:`training_samples`)."""
    d, source = ctx.cfg.distill, ctx.layout.samples
    inputs = {"samples": require_input(ctx, source, "sample")}
    spec = ParamSpec.from_module(ctx.network())
    with SampleStore.open(source, expect_spec=spec) as store:
        if len(store) < 2:
            raise ConfigError(f"{source}: {len(store)} sample; distillation needs at least 2")
        data = training_samples(ctx, store, d)
        # SGLD's predictive is the same aligned or not: the reference stays as stored
        reference = store.read(evenly_spaced(len(store), REFERENCE_SAMPLES))
        for group in [seeds] if trains_seeds_together(ctx, seeds) else [[k] for k in seeds]:
            started = time.perf_counter()
            trainer, runs, step = _seed_group(ctx, store, data, spec, reference, group)
            summaries = train(ctx, trainer, runs, step, inputs)
            seconds = round(time.perf_counter() - started, 2)  # the group's own: alignment has its own
            for k, summary in zip(group, summaries, strict=True):
                summary |= {"alignment": data.alignment, "seconds": seconds}
                if len(group) > 1:
                    summary["trained_with_seeds"] = group  # the seconds are the group's
                _finish(ctx, spec, summary, inputs, len(store), store.file_bytes, len(np.unique(store.chains)),
                        seed=k)
            for k in group:  # the group's checkpoint is its first seed's; the others' are of earlier runs
                checkpoint_of(ctx.layout.generator_of(k)).unlink(missing_ok=True)


@dataclass
class SeedGANs:
    """Generator seed k's GANs: one per chain of the store (``per_chain``) or one; each GAN's stream seed, its
    share (its weight in the statistics and, per chain, in a draw; on the run's device) and its real batches."""

    per_chain: bool
    seeds: list[int]
    shares: Tensor
    batches: list[StoreBatches]

    def generator(self, generators: Sequence[Generator]) -> ChainGenerators | Generator:
        """The seed's generator of ``generators`` (its GANs' trained generators)."""
        return ChainGenerators(generators, self.shares) if self.per_chain else generators[0]


def seed_gans(ctx: RunContext, batches: StoreBatches, chains: np.ndarray, seed: int = 0) -> SeedGANs:
    """Generator seed ``seed``'s GANs: with ``per_chain`` one per chain of the store (stream
    ``distill/gan/chain/C``), weighted by the chain's share of the store's rows, its real batches ``batches``
    restricted to its rows (stream ``distill/batches/chain/C``); else one GAN (stream ``distill/gan``) on
    ``batches``."""
    if not ctx.cfg.distill.per_chain:
        return SeedGANs(False, [distill_seed(ctx, seed, "gan")], torch.ones(1, device=ctx.device), [batches])
    ids, rows, shares = chain_partition(chains)
    log.info("one generator per chain: %d chains, shares %s", len(ids), [round(float(w), 4) for w in shares])
    return SeedGANs(True, [distill_seed(ctx, seed, "gan", "chain", c) for c in ids], shares.to(ctx.device),
                    [batches.restricted(r, distill_seed(ctx, seed, "batches", "chain", c))
                     for c, r in zip(ids, rows, strict=True)])


def conditioned_trainer(ctx: RunContext, codec: WeightCodec, batches: StoreBatches,
                        chains: np.ndarray, seed: int = 0) -> tuple[ConditionedTrainer, StoreBatches]:
    """One GAN conditioned on the store's chains (seed stream ``distill/gan`` of generator seed ``seed``; each
    chain weighted by its share of the rows: :func:`~apd.distillation.training.make_conditioned_trainer`), and
    its real batches: ``batches`` (rows uniform over the store, so chains by their shares) with each row's
    chain, 0 … C − 1 in increasing order of the chain ids."""
    ids, _, shares = chain_partition(chains)
    log.info("one generator conditioned on %d chains by %d numbers each", len(ids), ctx.cfg.distill.mode_embedding)
    return (make_conditioned_trainer(ctx.cfg.distill, codec.code_dim, distill_seed(ctx, seed, "gan"), shares,
                                     ctx.device), batches.with_labels(chain_labels(chains)))


def _seed_group(ctx: RunContext, store: SampleStore, data: TrainingSamples, spec: ParamSpec, reference: Tensor,
                group: list[int]) -> tuple[GANTrainer | ChainTrainers | ConditionedTrainer, list[SeedRun],
                                           Callable[[], list[dict[str, float]]]]:
    """The trainer of generator seeds ``group``, their runs and the step that returns each run's statistics.
    One seed trains as it always has: a conditioned generator, one per chain
    (:func:`~apd.distillation.training.make_chain_trainers`) or one. Several train as one stack of every
    seed's GANs, each GAN drawing from its own streams as it would alone, each seed's statistics its own GANs'
    averaged by their shares."""
    d = ctx.cfg.distill
    parts = []
    for k in group:
        codec = codec_for(ctx, data.fit, seed=k)
        parts.append((k, codec, data.batches(ctx, store, codec, d, seed=k, sharing=len(group)),
                      validation_monitor(ctx, spec, reference, seed=k)))
    if d.mode_embedding:
        (k, codec, real, monitor), = parts
        trainer, labelled = conditioned_trainer(ctx, codec, real, store.chains, seed=k)
        return (trainer, [SeedRun.of(ctx, k, trainer.generator, codec, monitor, (labelled.rng,))],
                lambda: [trainer.step(labelled, d.n_critic)])
    gans = [seed_gans(ctx, real, store.chains, seed=k) for k, _, real, _ in parts]
    if len(group) == 1 and not gans[0].per_chain:
        (k, codec, real, monitor), = parts
        trainer = make_trainer(d, codec.code_dim, gans[0].seeds[0], ctx.device)
        return (trainer, [SeedRun.of(ctx, k, trainer.generator, codec, monitor, (real.rng,))],
                lambda: [trainer.step(real, d.n_critic)])
    code_dim = parts[0][1].code_dim  # every seed's codec is of the configured kind and rank
    trainer = make_chain_trainers(d, code_dim, [s for g in gans for s in g.seeds], torch.cat([g.shares for g in gans]),
                                  ctx.device)
    runs, weights, start = [], [], 0
    for (k, codec, _, monitor), g in zip(parts, gans, strict=True):
        members = slice(start, start + len(g.seeds))
        runs.append(SeedRun.of(ctx, k, g.generator(trainer.generator.generators[members]), codec, monitor,
                               tuple(b.rng for b in g.batches)))
        weights.append(torch.zeros(len(trainer.generator.generators), dtype=torch.float64))
        weights[-1][members] = g.shares.double().cpu()
        start = members.stop
    batches = [b for g in gans for b in g.batches]

    def step() -> list[dict[str, float]]:
        by_gan = trainer.step_by_chain(batches, d.n_critic)
        return [trainer.trainer.averaged(by_gan, w) for w in weights]

    return trainer, runs, step


def _finish(ctx: RunContext, spec: ParamSpec, summary: dict, inputs: dict, n_samples: int, store_bytes: int,
            chains: int = 1, seed: int = 0) -> None:
    d = ctx.cfg.distill
    path, last_path = ctx.layout.generator_of(seed), ctx.layout.generator_last_of(seed)
    parameters = summary["generator_parameters"]
    worth = in_samples(summary.pop("stored_bytes"), spec.numel)
    record = manifest_record("distill", config_hash(ctx.cfg, "distill"), inputs, spec=spec.to_json(),
                             machine=machine(ctx.device),
                             architecture=architecture(d, spec.numel, spec.layer_sizes, chains), mode=d.mode,
                             generator_seed=seed,
                             storage={"generator_parameters": parameters, **stored_as_json(part_precisions(d)),
                                      "generator_bytes": partial_of(path).stat().st_size,
                                      "in_sgld_samples": round(worth, 2),
                                      "store_samples": n_samples, "store_bytes": store_bytes},
                             **summary)
    publish({partial_of(path): path, partial_of(last_path): last_path}, manifest_of(path), record)
    kept = summary["selection"]["kept"]
    log.info("generator seed %d: step %d kept (criterion %.4f, KL %.4f, BALD gap %.4f; validation accuracy %.4f vs "
             "SGLD's %.4f); %s parameters at %s (%.2f SGLD samples' worth); %.0f s → %s", seed, kept["step"],
             kept["criterion"],
             kept["kl"], kept["bald_gap"], kept["accuracy"], summary["sgld_val_accuracy"], f"{parameters:,}",
             part_precisions(d).describe(), worth, summary["seconds"], path)


def distill_online(ctx: RunContext, seed: int = 0) -> Path:
    """Generator seed ``seed`` by alternating SGLD and GAN updates (no sample store): chains fill a FIFO
    buffer of thinned samples; every ``t_sgld`` new samples the GAN takes ``t_gan`` generator steps on
    batches from the buffer. The chains are the pipeline's, the same for every seed."""
    d, s = ctx.cfg.distill, ctx.cfg.sgld
    path = ctx.layout.generator_of(seed)
    if seed_reusable(ctx, seed, {}):
        return path
    started = time.perf_counter()
    spec = ParamSpec.from_module(ctx.network())
    x, y = ctx.data.x_train.to(ctx.device), ctx.data.y_train.to(ctx.device)
    chains = make_chains(ctx, list(range(s.chains)), x, y)
    buffer = torch.empty(d.buffer_size, spec.numel, device=ctx.device)
    position = {"t": 0, "count": 0, "round": 0}

    def add_samples(n: int) -> None:
        """Step the chains together until at least ``n`` thinned samples (one per chain at each kept
        iteration) have entered the buffer."""
        added = 0
        while added < n:
            t = position["t"]
            _, kept = chains.step(t, is_thinned_sample(s, chains.schedule, t))
            position["t"] = t + 1
            for vec in kept if kept is not None else ():
                buffer[position["count"] % d.buffer_size] = vec
                position["count"] += 1
                added += 1

    log.info("online distillation: warming up the buffer with %d samples", d.buffer_size)
    add_samples(d.buffer_size)
    codec = codec_for(ctx, buffer.cpu(), seed=seed)
    batch_rng = torch.Generator(device=ctx.device).manual_seed(distill_seed(ctx, seed, "batches"))

    def real_batch() -> Tensor:
        index = torch.randint(min(position["count"], d.buffer_size), (d.batch_size,), generator=batch_rng,
                              device=ctx.device)
        return codec.encode(buffer[index])

    monitor = validation_monitor(ctx, spec, buffer[evenly_spaced(d.buffer_size, REFERENCE_SAMPLES)].clone(), seed)
    trainer = make_trainer(d, codec.code_dim, distill_seed(ctx, seed, "gan"), ctx.device)
    run = SeedRun.of(ctx, seed, trainer.generator, codec, monitor, ())

    def between_steps(step: int) -> None:
        if step == 0 or step % d.t_gan:
            return
        add_samples(d.t_sgld)
        position["round"] += 1
        if d.restart_every and position["round"] % d.restart_every == 0:
            chains.theta.copy_(run.model.sample_weights(len(chains)))

    summary, = train(ctx, trainer, [run], lambda: [trainer.step(real_batch, d.n_critic)], {}, between_steps)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["sgld_samples_seen"] = position["count"]
    _finish(ctx, spec, summary, {}, 0, 0, seed=seed)
    return path
