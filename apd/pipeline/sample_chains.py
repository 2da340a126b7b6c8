"""One process's SGLD chains run one after another into one store (``samples.partial.h5`` or a worker's
shard), resumed from and checkpointed to the ``*.ckpt.pt`` beside it, with the running ensemble's accuracy
on validation images as the progress bar's monitor: what :mod:`apd.pipeline.sample` runs on one worker and
:mod:`apd.pipeline.sample_workers` on each of several.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from apd import __version__
from apd.config import config_hash
from apd.errors import ArtifactError, DivergenceError
from apd.io import nonfinite_tensor, save_torch_atomic
from apd.nets import ParamSpec
from apd.pipeline.manifests import load_checkpoint
from apd.pipeline.runtime import RunContext
from apd.samplers.chain import ChainSeeds, SGLDChain, is_thinned_sample
from apd.samplers.sgld import prefetch_pays
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)

PREFETCH_SETTINGS = {"auto": None, "on": True, "off": False}  # config value -> SGLD(prefetch_noise=...)
MONITOR_SIZE = 1000  # validation images the running-ensemble accuracy on the progress bar is measured on


def chain_seeds(ctx: RunContext, chain: int) -> ChainSeeds:
    """Chain ``chain``'s initialisation, minibatch and noise streams (:mod:`apd.pipeline.seeds`)."""
    return ChainSeeds(*(ctx.seed("chain", chain, stream) for stream in ("init", "batches", "noise")))


def make_chain(ctx: RunContext, chain: int, x_train: Tensor, y_train: Tensor, processes: int = 1) -> SGLDChain:
    """Chain ``chain`` on ``ctx.device``; ``processes``: sampling processes sharing this machine's cores
    (they decide whether ``prefetch_noise = "auto"`` draws the noise on a thread of its own)."""
    prefetch = PREFETCH_SETTINGS[ctx.cfg.prefetch_noise]
    if prefetch is None:
        prefetch = prefetch_pays(ctx.device, processes)
    return SGLDChain(ctx.net_sizes, ctx.cfg.sgld, chain, x_train, y_train, chain_seeds(ctx, chain), prefetch,
                     conv=ctx.cfg.net.conv)


@torch.no_grad()
def _monitor_probs(net: torch.nn.Module, x: Tensor) -> Tensor:
    return torch.softmax(net(x), dim=-1)


@dataclass
class _ChainState:
    """Where one worker's sampling stands: what a checkpoint holds besides the net and the optimizer.
    ``index`` is the position of the running chain in the worker's list of chains."""

    index: int = 0
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


def store_meta(ctx: RunContext, chains: list[int]) -> dict:
    data = ctx.data
    return {"config": ctx.cfg.to_dict(), "config_hash": config_hash(ctx.cfg, "sample"), "version": __version__,
            "dataset": data.name, "data_fingerprint": data.fingerprint(), "num_data": len(data.y_train),
            "chains": chains, "chain_seeds": {str(c): list(vars(chain_seeds(ctx, c)).values()) for c in chains}}


def monitor_accuracy(monitor_sum: Tensor | None, y: Tensor) -> float:
    if monitor_sum is None:
        return float("nan")
    return (monitor_sum.argmax(-1).cpu() == y).float().mean().item()


def run_chains(ctx: RunContext, spec: ParamSpec, chains: list[int], partial: Path, checkpoint: Path,
                processes: int, rank: int = 0) -> Finished:
    """Run (or resume) ``chains`` one after another into the store at ``partial``, closed when they end."""
    cfg, s = ctx.cfg, ctx.cfg.sgld
    stage_hash = config_hash(cfg, "sample")
    state = _ChainState()
    resumed = None if ctx.force else _load_checkpoint(checkpoint, stage_hash, chains)
    if resumed is not None and partial.is_file():
        state = resumed["state"]
        store = SampleStore.open(partial, "a", expect_spec=spec)
        if len(store) < state.stored:
            store.close()
            raise ArtifactError(f"{partial}: holds {len(store)} samples but its checkpoint recorded "
                                f"{state.stored}; run with --force")
        store.truncate(state.stored)
        if state.index < len(chains):
            log.info("resuming chain %d at iteration %d with %d samples stored", chains[state.index],
                     state.iteration, state.stored)
    else:
        resumed = None
        checkpoint.unlink(missing_ok=True)
        store = SampleStore.create(partial, spec, store_meta(ctx, chains), compression=s.compression,
                                   overwrite=True)
    device = ctx.device
    data = ctx.data
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_monitor, y_monitor = data.x_val[:MONITOR_SIZE].to(device), data.y_val[:MONITOR_SIZE].to(device)
    with store:
        while state.index < len(chains):
            _run_chain(ctx, spec, store, state, chains, resumed, checkpoint, stage_hash,
                       (x_train, y_train, x_monitor, y_monitor), processes, rank)
            resumed = None
            state = _ChainState(state.index + 1, 0, len(store), state.monitor_sum, state.seconds, state.cpu_seconds)
            _save_checkpoint(checkpoint, stage_hash, chains, None, state)
        n_samples = len(store)
    return Finished(rank, socket.gethostname(), chains, n_samples, partial.stat().st_size, state.seconds,
                    state.cpu_seconds, state.monitor_sum)


def _run_chain(ctx: RunContext, spec: ParamSpec, store: SampleStore, state: _ChainState, chains: list[int],
               resumed: dict | None, checkpoint: Path, stage_hash: str,
               tensors: tuple[Tensor, Tensor, Tensor, Tensor], processes: int, position: int) -> None:
    """Run chain ``chains[state.index]`` from ``state.iteration`` to the end, appending samples to ``store``."""
    s = ctx.cfg.sgld
    x_train, y_train, x_monitor, y_monitor = tensors
    index = chains[state.index]
    chain = make_chain(ctx, index, x_train, y_train, processes)
    if resumed is not None and "net" in resumed:
        chain.load_state_dict(resumed)
    where = f"SGLD chain {index + 1}/{s.chains}"
    bar = ctx.progress(total=s.iterations, initial=state.iteration, desc=where, unit="it", position=position)
    started = time.perf_counter() - state.seconds  # state.seconds: time spent before this call
    cpu_started = time.process_time() - state.cpu_seconds
    with bar:
        for t in range(state.iteration, s.iterations):
            keep = is_thinned_sample(s, chain.schedule, t)
            monitored = None
            if keep:
                monitored = _monitor_probs(chain.net, x_monitor)
            loss, vec = chain.step(t, spec if keep else None)
            if vec is not None:
                store.append(vec, step=t, chain=index, lr=chain.schedule.lr(t), log_lik=-loss.item())
                state.monitor_sum = monitored if state.monitor_sum is None else state.monitor_sum + monitored
            bar.update()
            done = t + 1
            if done % s.eval_every == 0:
                accuracy = monitor_accuracy(state.monitor_sum, y_monitor.cpu())
                ctx.show(bar, f"{where} iteration {done}/{s.iterations}", samples=len(store),
                         val_acc=f"{accuracy:.4f}")
            if done % s.checkpoint_every == 0 and done < s.iterations:
                _save_checkpoint(checkpoint, stage_hash, chains, chain, _ChainState(
                    state.index, done, len(store), state.monitor_sum, time.perf_counter() - started,
                    time.process_time() - cpu_started))
    state.seconds = time.perf_counter() - started
    state.cpu_seconds = time.process_time() - cpu_started


def _save_checkpoint(path: Path, stage_hash: str, chains: list[int], chain: SGLDChain | None,
                     state: _ChainState) -> None:
    """The worker's state; with ``chain`` (mid-chain) its net and optimizer too."""
    if chain is not None:
        bad = nonfinite_tensor(chain.net.state_dict())
        if bad is not None:
            raise DivergenceError(f"SGLD diverged before iteration {state.iteration} of chain {chains[state.index]} "
                                  f"({bad} not finite); try a smaller sgld.lr (now {chain.optimizer.defaults['lr']}); "
                                  "complete artifacts are unchanged")
    save_torch_atomic(path, {
        "config_hash": stage_hash, "chains": chains, **(chain.state_dict() if chain is not None else {}),
        "index": state.index, "iteration": state.iteration, "stored": state.stored,
        "monitor_sum": state.monitor_sum, "seconds": state.seconds, "cpu_seconds": state.cpu_seconds,
    })


def _load_checkpoint(path: Path, stage_hash: str, chains: list[int]) -> dict | None:
    """A checkpoint of this config and this worker's chains with its state, or None."""
    ckpt = load_checkpoint(path, config_hash=stage_hash, chains=chains)
    if ckpt is not None:
        ckpt["state"] = _ChainState(ckpt["index"], ckpt["iteration"], ckpt["stored"], ckpt["monitor_sum"],
                                    ckpt["seconds"], ckpt.get("cpu_seconds", 0.0))
    return ckpt
