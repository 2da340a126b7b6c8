"""One process's SGLD chains, stepped together as one batch, into one store (``samples.partial.h5`` or a
worker's shard), resumed from and checkpointed to the ``*.ckpt.pt`` beside it, with the running ensemble's accuracy
on validation images as the progress bar's monitor: what :mod:`apd.pipeline.sample` runs on one worker and
:mod:`apd.pipeline.sample_workers` on each of several.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from apd._version import __version__
from apd.config import config_hash
from apd.errors import ArtifactError
from apd.io import save_torch_atomic
from apd.nets import ParamSpec, predict_probs
from apd.pipeline.manifests import load_checkpoint
from apd.pipeline.runtime import RunContext
from apd.samplers.chain import ChainSeeds, SGLDChains
from apd.samplers.sgld import prefetch_pays
from apd.samplers.store import SampleStore
from apd.schedules import is_thinned_sample

log = logging.getLogger(__name__)

PREFETCH_SETTINGS = {"auto": None, "on": True, "off": False}  # config value -> SGLD(prefetch_noise=...)
MONITOR_SIZE = 1000  # validation images the running-ensemble accuracy on the progress bar is measured on


def chain_seeds(ctx: RunContext, chain: int) -> ChainSeeds:
    """Chain ``chain``'s initialisation, minibatch and noise streams (:mod:`apd.pipeline.seeds`)."""
    return ChainSeeds(*(ctx.seed("chain", chain, stream) for stream in ("init", "batches", "noise")))


def make_chains(ctx: RunContext, chains: list[int], x_train: Tensor, y_train: Tensor, processes: int = 1) -> SGLDChains:
    """Chains ``chains``, stepped together on ``ctx.device``; ``processes``: sampling processes sharing this
    machine's cores (they decide whether ``prefetch_noise = "auto"`` draws the noise on a thread of its own)."""
    prefetch = PREFETCH_SETTINGS[ctx.cfg.prefetch_noise]
    if prefetch is None:
        prefetch = prefetch_pays(ctx.device, processes)
    return SGLDChains(ctx.net_sizes, ctx.cfg.sgld, chains, x_train, y_train, [chain_seeds(ctx, c) for c in chains],
                      prefetch, conv=ctx.cfg.net.conv)


@dataclass
class _ChainState:
    """Where one worker's sampling stands: what a checkpoint holds besides the chains' weights and noise."""

    iteration: int = 0
    stored: int = 0
    monitor_sum: Tensor | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the sampling process (all its threads): wall time without the waits


@dataclass
class Finished:
    """One worker's finished store, as it reports it to rank 0."""

    rank: int
    host: str
    chains: list[int]
    samples: int
    bytes: int
    seconds: float
    cpu_seconds: float
    monitor_sum: Tensor | None
    noise_source: str


def store_meta(ctx: RunContext, chains: list[int], noise_source: str) -> dict:
    data = ctx.data
    return {"config": ctx.cfg.to_dict(), "config_hash": config_hash(ctx.cfg, "sample"), "version": __version__,
            "dataset": data.name, "data_fingerprint": data.fingerprint(), "num_data": len(data.y_train),
            "chains": chains, "noise_source": noise_source,
            "chain_seeds": {str(c): list(vars(chain_seeds(ctx, c)).values()) for c in chains}}


def monitor_accuracy(monitor_sum: Tensor | None, y: Tensor) -> float:
    if monitor_sum is None:
        return float("nan")
    return (monitor_sum.argmax(-1).cpu() == y).float().mean().item()


def run_chains(ctx: RunContext, spec: ParamSpec, chains: list[int], partial: Path, checkpoint: Path,
               processes: int, rank: int = 0) -> Finished:
    """Run (or resume) ``chains``, stepped together (:class:`SGLDChains`), into the store at ``partial``,
    closed when they end. At each kept iteration the store gains one row per chain, in the order of
    ``chains``, so its rows are ordered by (iteration, chain)."""
    cfg, s = ctx.cfg, ctx.cfg.sgld
    stage_hash = config_hash(cfg, "sample")
    device, data = ctx.device, ctx.data
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_monitor, y_monitor = data.x_val[:MONITOR_SIZE].to(device), data.y_val[:MONITOR_SIZE].to(device)
    batch = make_chains(ctx, chains, x_train, y_train, processes)
    state = _ChainState()
    resumed = None if ctx.force else load_checkpoint(checkpoint, config_hash=stage_hash, chains=chains,
                                                     noise_source=batch.noise_source)
    if resumed is not None and partial.is_file():
        monitor_sum = resumed["monitor_sum"]
        state = _ChainState(resumed["iteration"], resumed["stored"],
                            None if monitor_sum is None else monitor_sum.to(device), resumed["seconds"],
                            resumed["cpu_seconds"])
        store = SampleStore.open(partial, "a", expect_spec=spec)
        if len(store) < state.stored:
            store.close()
            raise ArtifactError(f"{partial}: holds {len(store)} samples but its checkpoint recorded "
                                f"{state.stored}; run with --force")
        store.truncate(state.stored)
        batch.load_state_dict(resumed)
        if state.iteration < s.iterations:
            log.info("resuming chains %s at iteration %d with %d samples stored", _named(chains), state.iteration,
                     state.stored)
    else:
        checkpoint.unlink(missing_ok=True)
        store = SampleStore.create(partial, spec, store_meta(ctx, chains, batch.noise_source),
                                   compression=s.compression, overwrite=True)
    with store:
        _run(ctx, batch, store, state, checkpoint, stage_hash, (x_monitor, y_monitor), rank)
        n_samples = len(store)
    return Finished(rank, socket.gethostname(), chains, n_samples, partial.stat().st_size, state.seconds,
                    state.cpu_seconds, state.monitor_sum, batch.noise_source)


def _named(chains: list[int]) -> str:
    """Chain ids as a user counts them (from 1)."""
    return ", ".join(str(c + 1) for c in chains)


def _run(ctx: RunContext, batch: SGLDChains, store: SampleStore, state: _ChainState, checkpoint: Path,
         stage_hash: str, monitor: tuple[Tensor, Tensor], position: int) -> None:
    """Step ``batch`` from ``state.iteration`` to the end, appending its kept iterates to ``store``."""
    s = ctx.cfg.sgld
    x_monitor, y_monitor = monitor
    chains = batch.indices
    where = f"SGLD chain {chains[0] + 1}/{s.chains}" if len(chains) == 1 else \
        f"SGLD chains {_named(chains)} of {s.chains}" if len(chains) <= 4 else f"SGLD {len(chains)} chains"
    bar = ctx.progress(total=s.iterations, initial=state.iteration, desc=where, unit="it", position=position)
    started = time.perf_counter() - state.seconds  # state.seconds: time spent before this call
    cpu_started = time.process_time() - state.cpu_seconds
    with bar:
        for t in range(state.iteration, s.iterations):
            keep = is_thinned_sample(s, batch.schedule, t)
            loss, kept = batch.step(t, keep)
            if kept is not None:
                store.append_many(kept, steps=t, chains=chains, lrs=batch.schedule.lr(t),
                                  log_liks=(-loss).cpu().numpy())
                monitored = predict_probs(batch.spec, kept, x_monitor).sum(0)
                state.monitor_sum = monitored if state.monitor_sum is None else state.monitor_sum + monitored
            bar.update()
            done = t + 1
            state.iteration, state.stored = done, len(store)
            if done % s.eval_every == 0:
                accuracy = monitor_accuracy(state.monitor_sum, y_monitor.cpu())
                ctx.show(bar, f"{where} iteration {done}/{s.iterations}", samples=len(store),
                         val_acc=f"{accuracy:.4f}")
            if done % s.checkpoint_every == 0 and done < s.iterations:
                state.seconds, state.cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
                _save_checkpoint(checkpoint, stage_hash, batch, state)
    state.seconds = time.perf_counter() - started
    state.cpu_seconds = time.process_time() - cpu_started
    _save_checkpoint(checkpoint, stage_hash, batch, state)


def _save_checkpoint(path: Path, stage_hash: str, batch: SGLDChains, state: _ChainState) -> None:
    """The worker's state with its chains' weights and noise (checked finite first)."""
    batch.checked_weights(state.iteration)
    save_torch_atomic(path, {
        "config_hash": stage_hash, "chains": batch.indices, **batch.state_dict(),
        "iteration": state.iteration, "stored": state.stored, "monitor_sum": state.monitor_sum,
        "seconds": state.seconds, "cpu_seconds": state.cpu_seconds,
    })
