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
stored at ``precision``, the generator networks at ``generators_at`` where given
(:meth:`~apd.distillation.generator.DistilledGenerator.pack`). Files are built under temporary
names and swapped in only when the run has finished.

With ``[distill] seeds`` K > 1 the stage trains K generators, on ``[distill] workers`` processes (one after
another on each), each from its own seed streams (:func:`~apd.pipeline.recipes.distill_seed`) into its own
files (generator seed k: ``generator-seedK.pt``; seed 0 is ``generator.pt``), each with its manifest, reused
or resumed on its own. The samples are aligned once, before the workers start, and stored for every process
that needs them (:mod:`apd.pipeline.stored_alignment`).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from apd.config import config_hash
from apd.distillation.chain_generators import ChainTrainers
from apd.distillation.codec import WeightCodec
from apd.distillation.conditioned import ConditionedTrainer
from apd.distillation.gan import GANTrainer
from apd.distillation.generator import DistilledGenerator, architecture
from apd.distillation.precision import in_samples
from apd.distillation.training import (
    StoreBatches,
    ValidationMonitor,
    evenly_spaced,
    make_chain_trainers,
    make_conditioned_trainer,
    make_trainer,
)
from apd.errors import ConfigError, DivergenceError
from apd.io import nonfinite_tensor, read_json, save_torch_atomic
from apd.nets import ParamSpec
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.manifests import load_checkpoint, manifest_record
from apd.pipeline.parallel import split_work, worker_count
from apd.pipeline.recipes import (
    REFERENCE_SAMPLES,
    codec_for,
    distill_seed,
    store_alignment,
    training_samples,
    validation_monitor,
)
from apd.pipeline.runtime import RunContext, machine
from apd.pipeline.sample_chains import make_chains
from apd.pipeline.stage import publish, require_input, reusable, weights_load
from apd.samplers.store import SampleStore, chain_partition
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


def _check_finite(trainer: GANTrainer, step: int) -> None:
    """Stop with a :class:`DivergenceError` once the generator's or the critic's weights are not finite,
    before anything is judged, kept or checkpointed with them."""
    for part in ("generator", "critic"):
        bad = nonfinite_tensor(getattr(trainer, part).state_dict())
        if bad is not None:
            raise DivergenceError(f"GAN training diverged by generator step {step} (the {part}'s {bad} is not "
                                  "finite); try a smaller distill.lr; complete artifacts are unchanged")


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
        split_work(ctx, distill_seeds, todo, d.workers, "generator seeds")
    return ctx.layout.generator


def distill_seeds(ctx: RunContext, seeds: list[int]) -> None:
    """Generator seeds ``seeds``, one after another, from the samples prepared once (:func:`training_samples`)."""
    d, source = ctx.cfg.distill, ctx.layout.samples
    inputs = {"samples": require_input(ctx, source, "sample")}
    spec = ParamSpec.from_module(ctx.network())
    with SampleStore.open(source, expect_spec=spec) as store:
        if len(store) < 2:
            raise ConfigError(f"{source}: {len(store)} sample; distillation needs at least 2")
        data = training_samples(ctx, store, d)
        # SGLD's predictive is the same aligned or not: the reference stays as stored
        reference = store.read(evenly_spaced(len(store), REFERENCE_SAMPLES))
        for k in seeds:
            started = time.perf_counter()
            codec = codec_for(ctx, data.fit, seed=k)
            real = data.batches(ctx, store, codec, d, seed=k)
            monitor = validation_monitor(ctx, spec, reference, seed=k)
            if d.per_chain:
                trainer, by_chain = chain_trainers(ctx, codec, real, store.chains, seed=k)
                summary = _train(ctx, trainer, codec, by_chain, monitor, inputs,
                                 generators=tuple(b.rng for b in by_chain), seed=k)
            elif d.mode_embedding:
                trainer, labelled = conditioned_trainer(ctx, codec, real, store.chains, seed=k)
                summary = _train(ctx, trainer, codec, labelled, monitor, inputs, generators=(labelled.rng,), seed=k)
            else:
                trainer = make_trainer(d, codec.code_dim, distill_seed(ctx, k, "gan"), ctx.device)
                summary = _train(ctx, trainer, codec, real, monitor, inputs, generators=(real.rng,), seed=k)
            summary["alignment"] = data.alignment
            summary["seconds"] = round(time.perf_counter() - started, 2)  # the seed's own: alignment has its own
            _finish(ctx, spec, summary, inputs, len(store), store.file_bytes, len(np.unique(store.chains)), seed=k)


def chain_trainers(ctx: RunContext, codec: WeightCodec, batches: StoreBatches,
                   chains: np.ndarray, seed: int = 0) -> tuple[ChainTrainers, list[StoreBatches]]:
    """One GAN per chain of the store (seed stream ``distill/gan/chain/C`` of generator seed ``seed``), weighted
    by the chain's share of the store's rows, all trained as one
    (:func:`~apd.distillation.training.make_chain_trainers`), and each chain's real batches (``batches``
    restricted to its rows, stream ``distill/batches/chain/C``)."""
    ids, rows, shares = chain_partition(chains)
    seeds = [distill_seed(ctx, seed, "gan", "chain", c) for c in ids]
    log.info("one generator per chain: %d chains, shares %s", len(ids), [round(float(w), 4) for w in shares])
    return (make_chain_trainers(ctx.cfg.distill, codec.code_dim, seeds, shares, ctx.device),
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
    labels = torch.from_numpy(np.searchsorted(np.asarray(ids), chains))
    return (make_conditioned_trainer(ctx.cfg.distill, codec.code_dim, distill_seed(ctx, seed, "gan"), shares,
                                     ctx.device), batches.with_labels(labels))


def _train(ctx: RunContext, trainer: GANTrainer | ChainTrainers, codec: WeightCodec,
           real: Callable[[], Tensor] | Sequence[Callable[[], Tensor]], monitor: ValidationMonitor, inputs: dict,
           between_steps: Callable[[int], None] | None = None, generators: tuple[torch.Generator, ...] = (),
           seed: int = 0) -> dict:
    """The GAN loop shared by both modes: checkpoints, judging, keeping the best step, and at the end the
    residual's scale matched to SGLD's (:mod:`apd.distillation.residual`) when so configured. The kept
    and the last generator are written to their partial files, stored at ``[distill] precision`` (the
    generator networks at ``generators_at`` where given); stored below float32, the stored generator is
    judged once more (``selection.stored``). The files are generator seed ``seed``'s.

    ``generators`` (e.g. the real-batch sampler's) are checkpointed with the trainer, so a resumed run
    repeats an uninterrupted one exactly."""
    generators = (*generators, monitor.rng)
    d = ctx.cfg.distill
    stage_hash = config_hash(ctx.cfg, "distill")
    model = DistilledGenerator(trainer.generator, codec, d.precision, d.generator_precision())
    path, last_path = ctx.layout.generator_of(seed), ctx.layout.generator_last_of(seed)
    checkpoint = checkpoint_of(path)
    history: list[dict] = []
    best: dict = {"step": 0, "criterion": math.inf, "state": None}
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
            if step % d.eval_every == 0 or step == d.steps or (resumable and step % d.checkpoint_every == 0):
                _check_finite(trainer, step)
            if step % d.eval_every == 0 or step == d.steps:
                model.eval()
                judged = monitor.judge(model)
                history.append({"step": step, **{k: round(v, 6) for k, v in {**judged, **stats}.items()}})
                if d.selection == "last" or judged["criterion"] < best["criterion"]:
                    best = {"step": step, "criterion": judged["criterion"], "state": copy.deepcopy(model.state_dict())}
                ctx.show(bar, f"generator step {step}/{d.steps}", W=f"{stats.get('wasserstein', math.nan):.3f}",
                         criterion=f"{judged['criterion']:.4f}", acc=f"{judged['accuracy']:.4f}")
            if resumable and step % d.checkpoint_every == 0 and step < d.steps:
                save_torch_atomic(checkpoint, {"config_hash": stage_hash, "inputs": inputs,
                                               "trainer": trainer.state_dict(), "history": history, "best": best,
                                               "generators": [rng.get_state() for rng in generators]})
    if best["state"] is None:
        last = history[-1]
        raise DivergenceError(f"no generator step had a finite selection criterion (step {last['step']}: "
                              f"{last['criterion']}); try a smaller distill.lr; complete artifacts are unchanged")
    last = copy.deepcopy(model.state_dict())
    model.load_state_dict(best["state"])
    residual = _match_residual(ctx, model, monitor) if codec.has_residual else {}
    last.update({f"codec.{name}": value.clone() for name, value in codec.state_dict().items()})
    save_torch_atomic(partial_of(last_path), model.pack(last))
    stored = model.pack(model.state_dict())
    save_torch_atomic(partial_of(path), stored)
    kept = next(entry for entry in history if entry["step"] == best["step"])
    selection = {"criterion": "mean KL(SGLD ‖ generated) + mean |BALD gap| on validation inputs (nats)",
                 "rule": d.selection, "inputs": len(monitor.x), "reference_samples": REFERENCE_SAMPLES,
                 "kept_step": best["step"], "kept": kept, "last": history[-1]}
    if model.rounds():  # what the stored numbers give, judged as the kept step was
        model.load_state_dict(model.unpack(stored))
        selection["stored"] = {key: round(value, 6) for key, value in monitor.judge(model.eval()).items()}
    return {"selection": selection, "history": history, "sgld_val_accuracy": monitor.reference.accuracy,
            "sgld_val_mean_bald": monitor.reference.mean_information,
            "generator_parameters": model.stored_parameters(), "stored_bytes": model.stored_bytes(),
            "final_stats": stats, **residual}


def _match_residual(ctx: RunContext, model: DistilledGenerator, monitor: ValidationMonitor) -> dict:
    """Scale the codec's residual as configured (``matched``: α from :meth:`ValidationMonitor.scale_residual`;
    ``fitted``: α = 1); returns what goes into the manifest."""
    if ctx.cfg.distill.residual.scale == "fitted":
        return {"residual_scale": 1.0}
    scale = monitor.scale_residual(model.codec, lambda k, rng: model.generator.sample(k, generator=rng))
    return {"residual_scale": scale}


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
                             storage={"generator_parameters": parameters, "precision": d.precision,
                                      "generators_at": d.generator_precision(),
                                      "generator_bytes": partial_of(path).stat().st_size,
                                      "in_sgld_samples": round(worth, 2),
                                      "store_samples": n_samples, "store_bytes": store_bytes},
                             **summary)
    publish({partial_of(path): path, partial_of(last_path): last_path}, manifest_of(path), record)
    checkpoint_of(path).unlink(missing_ok=True)
    kept = summary["selection"]["kept"]
    log.info("generator seed %d: step %d kept (criterion %.4f, KL %.4f, BALD gap %.4f; validation accuracy %.4f vs "
             "SGLD's %.4f); %s parameters at %s (%.2f SGLD samples' worth); %.0f s → %s", seed, kept["step"],
             kept["criterion"],
             kept["kl"], kept["bald_gap"], kept["accuracy"], summary["sgld_val_accuracy"], f"{parameters:,}",
             d.precision if d.generator_precision() == d.precision else
             f"{d.precision} (generator networks {d.generator_precision()})", worth, summary["seconds"],
             path)


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
    model = DistilledGenerator(trainer.generator, codec)

    def between_steps(step: int) -> None:
        if step == 0 or step % d.t_gan:
            return
        add_samples(d.t_sgld)
        position["round"] += 1
        if d.restart_every and position["round"] % d.restart_every == 0:
            chains.theta.copy_(model.sample_weights(len(chains)))

    summary = _train(ctx, trainer, codec, real_batch, monitor, {}, between_steps, seed=seed)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    summary["sgld_samples_seen"] = position["count"]
    _finish(ctx, spec, summary, {}, 0, 0, seed=seed)
    return path
