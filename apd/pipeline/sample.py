"""``apd sample``: SGLD posterior samples into ``samples.h5``, plus the SGD and MC-dropout baselines.

Each chain starts from its own seeded initialisation and runs ``sgld.iterations`` SGLD steps on
minibatches (:class:`apd.data.MinibatchOrder`); after ``burn_in`` iterations every ``thin``-th iterate
(within the sampling phase of the step-size schedule) is appended to the store with the minibatch mean
log-likelihood at exactly those weights. The store is built in ``samples.partial.h5``; a checkpoint
(nets, optimizers with their noise generators, iteration, store length, running ensemble) is written
every ``checkpoint_every`` iterations, so an interrupted run resumes where the checkpoint left it and
stores exactly the samples an uninterrupted run would. Only a finished store replaces ``samples.h5``
(then its manifest), so a failure, a divergence or a kill never touches a complete store.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from apd import __version__
from apd.config import config_hash
from apd.errors import ArtifactError, ConfigError, DivergenceError
from apd.io import load_torch, nonfinite_tensor, save_torch_atomic
from apd.nets import ParamSpec, mlp
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.manifests import load_checkpoint, manifest_record
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import publish, reusable
from apd.samplers.baselines import train_baseline
from apd.samplers.chain import ChainSeeds, SGLDChain, is_thinned_sample, thinned_count
from apd.samplers.store import FREE_MARGIN, SampleStore

log = logging.getLogger(__name__)

PREFETCH_SETTINGS = {"auto": None, "on": True, "off": False}  # config value -> SGLD(prefetch_noise=...)
MONITOR_SIZE = 1000  # validation images the running-ensemble accuracy on the progress bar is measured on
BASELINES = ("sgd", "mcdropout")
DISK_MARGIN = 1.1  # free disk asked for, relative to the store's expected size
STORE_CHECK_BYTES = 2**28  # rows read at a time when a store is checked before reuse


def run_sample(ctx: RunContext) -> None:
    """The whole stage: SGLD samples, then the two baselines; complete parts are reused."""
    sample_sgld(ctx)
    for name in BASELINES:
        train_and_save_baseline(ctx, name)


def chain_seeds(ctx: RunContext, chain: int) -> ChainSeeds:
    """Chain ``chain``'s initialisation, minibatch and noise streams (:mod:`apd.pipeline.seeds`)."""
    return ChainSeeds(*(ctx.seed("chain", chain, stream) for stream in ("init", "batches", "noise")))


def make_chain(ctx: RunContext, chain: int, x_train: Tensor, y_train: Tensor) -> SGLDChain:
    return SGLDChain(ctx.net_sizes, ctx.cfg.sgld, chain, x_train, y_train, chain_seeds(ctx, chain),
                     PREFETCH_SETTINGS[ctx.cfg.prefetch_noise])


@torch.no_grad()
def _monitor_probs(net: torch.nn.Module, x: Tensor) -> Tensor:
    return torch.softmax(net(x), dim=-1)


@dataclass
class _ChainState:
    """Where sampling stands: what a checkpoint holds besides the net and the optimizer."""

    chain: int = 0
    iteration: int = 0
    stored: int = 0
    monitor_sum: Tensor | None = None
    seconds: float = 0.0


def check_sampling_fits(ctx: RunContext, spec: ParamSpec) -> None:
    """Fail before any work when the minibatch exceeds the training split or the store cannot fit on disk."""
    s, n_train = ctx.cfg.sgld, len(ctx.data.y_train)
    if s.batch_size > n_train:
        raise ConfigError(f"{ctx.cfg.source}: 'sgld.batch_size' ({s.batch_size}) is larger than the training "
                          f"split ({n_train} images)")
    expected = thinned_count(s) * s.chains * spec.numel * 4 * DISK_MARGIN + FREE_MARGIN
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(ctx.out_dir).free
    if expected > free:
        raise ArtifactError(f"{ctx.out_dir}: No space left for the sample store (it needs about "
                            f"{expected / 2**20:,.1f} MiB, {free / 2**20:,.1f} MiB are free)")


def sample_sgld(ctx: RunContext) -> Path:
    """Run (or resume, or reuse) the SGLD chains into ``samples.h5``; returns its path."""
    cfg, s = ctx.cfg, ctx.cfg.sgld
    path = ctx.layout.samples
    if reusable(ctx, path, "sample", {}) and _store_is_sound(path):
        return path
    partial, checkpoint = partial_of(path), checkpoint_of(path)
    stage_hash = config_hash(cfg, "sample")
    data, device = ctx.data, ctx.device
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    check_sampling_fits(ctx, spec)
    state = _ChainState()
    resumed = None if ctx.force else _load_checkpoint(checkpoint, stage_hash)
    if resumed is not None and partial.is_file():
        state = resumed["state"]
        store = SampleStore.open(partial, "a", expect_spec=spec)
        if len(store) < state.stored:
            store.close()
            raise ArtifactError(f"{partial}: holds {len(store)} samples but its checkpoint recorded "
                                f"{state.stored}; run with --force")
        store.truncate(state.stored)
        log.info("resuming chain %d at iteration %d with %d samples stored", state.chain, state.iteration,
                 state.stored)
    else:
        resumed = None
        checkpoint.unlink(missing_ok=True)
        meta = {"config": cfg.to_dict(), "config_hash": stage_hash, "version": __version__,
                "dataset": data.name, "data_fingerprint": data.fingerprint(), "num_data": len(data.y_train)}
        store = SampleStore.create(partial, spec, meta, compression=s.compression, overwrite=True)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_monitor, y_monitor = data.x_val[:MONITOR_SIZE].to(device), data.y_val[:MONITOR_SIZE].to(device)
    with store:
        while state.chain < s.chains:
            _run_chain(ctx, spec, store, state, resumed, checkpoint, stage_hash,
                       (x_train, y_train, x_monitor, y_monitor))
            resumed = None
            state = _ChainState(state.chain + 1, 0, len(store), state.monitor_sum, state.seconds)
        n_samples = len(store)
    accuracy = _monitor_accuracy(state.monitor_sum, y_monitor)
    record = manifest_record("sample", stage_hash, {}, samples=n_samples, dimension=spec.numel,
                             seconds=round(state.seconds, 2),
                             iterations_per_second=round(s.iterations * s.chains / max(state.seconds, 1e-9), 1),
                             monitor_ensemble_val_accuracy=accuracy)
    publish({partial: path}, manifest_of(path), record)
    checkpoint.unlink(missing_ok=True)
    log.info("stored %d SGLD samples in %s (%.0f s); ensemble accuracy on %d validation images: %.4f",
             n_samples, path, state.seconds, len(y_monitor), accuracy)
    return path


def _store_is_sound(path: Path) -> bool:
    """Whether the store opens and every row is finite (what reuse checks besides the manifest's digest)."""
    try:
        with SampleStore.open(path) as store:
            block = max(1, STORE_CHECK_BYTES // (4 * store.dim))
            for start in range(0, len(store), block):
                store.read_all(start, min(len(store), start + block))
    except ArtifactError as exc:
        log.warning("not reusing it: %s", exc)
        return False
    return True


def _loads(path: Path) -> bool:
    """Whether a saved baseline loads (weights only, finite): what reuse checks besides its digest."""
    try:
        load_torch(path)
    except ArtifactError as exc:
        log.warning("not reusing it: %s", exc)
        return False
    return True


def _monitor_accuracy(monitor_sum: Tensor | None, y: Tensor) -> float:
    if monitor_sum is None:
        return float("nan")
    return (monitor_sum.argmax(-1) == y).float().mean().item()


def _run_chain(ctx: RunContext, spec: ParamSpec, store: SampleStore, state: _ChainState, resumed: dict | None,
               checkpoint: Path, stage_hash: str, tensors: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
    """Run chain ``state.chain`` from ``state.iteration`` to the end, appending samples to ``store``."""
    s = ctx.cfg.sgld
    x_train, y_train, x_monitor, y_monitor = tensors
    chain = make_chain(ctx, state.chain, x_train, y_train)
    if resumed is not None:
        chain.load_state_dict(resumed)
    bar = ctx.progress(total=s.iterations, initial=state.iteration,
                       desc=f"SGLD chain {state.chain + 1}/{s.chains}", unit="it")
    started = time.perf_counter() - state.seconds  # state.seconds: time spent before this call
    with bar:
        for t in range(state.iteration, s.iterations):
            keep = is_thinned_sample(s, chain.schedule, t)
            monitored = None
            if keep:
                monitored = _monitor_probs(chain.net, x_monitor)
            loss, vec = chain.step(t, spec if keep else None)
            if vec is not None:
                store.append(vec, step=t, chain=state.chain, lr=chain.schedule.lr(t), log_lik=-loss.item())
                state.monitor_sum = monitored if state.monitor_sum is None else state.monitor_sum + monitored
            bar.update()
            done = t + 1
            if done % s.eval_every == 0:
                accuracy = _monitor_accuracy(state.monitor_sum, y_monitor)
                ctx.show(bar, f"SGLD chain {state.chain + 1}/{s.chains} iteration {done}/{s.iterations}",
                         samples=len(store), val_acc=f"{accuracy:.4f}")
            if done % s.checkpoint_every == 0 and done < s.iterations:
                _save_checkpoint(checkpoint, stage_hash, chain, _ChainState(
                    state.chain, done, len(store), state.monitor_sum, time.perf_counter() - started))
    state.seconds = time.perf_counter() - started


def _save_checkpoint(path: Path, stage_hash: str, chain: SGLDChain, state: _ChainState) -> None:
    """Write the chain's state; weights that are no longer finite stop the run instead (a checkpoint is
    never written with them)."""
    bad = nonfinite_tensor(chain.net.state_dict())
    if bad is not None:
        raise DivergenceError(f"SGLD diverged before iteration {state.iteration} of chain {state.chain} ({bad} "
                              f"not finite); try a smaller sgld.lr (now {chain.optimizer.defaults['lr']}); "
                              "complete artifacts are unchanged")
    save_torch_atomic(path, {
        "config_hash": stage_hash, **chain.state_dict(),
        "chain": state.chain, "iteration": state.iteration, "stored": state.stored,
        "monitor_sum": state.monitor_sum, "seconds": state.seconds,
    })


def _load_checkpoint(path: Path, stage_hash: str) -> dict | None:
    """A checkpoint of this config with its chain state, or None."""
    ckpt = load_checkpoint(path, config_hash=stage_hash)
    if ckpt is not None:
        ckpt["state"] = _ChainState(ckpt["chain"], ckpt["iteration"], ckpt["stored"], ckpt["monitor_sum"],
                                    ckpt["seconds"])
    return ckpt


def train_and_save_baseline(ctx: RunContext, name: str) -> Path:
    """Train the ``sgd`` or ``mcdropout`` baseline (or reuse it) into ``baselines/NAME.pt``."""
    cfg, b = ctx.cfg, ctx.cfg.baselines
    path = ctx.layout.baseline(name)
    if reusable(ctx, path, "baselines", {}) and _loads(path):
        return path
    dropout = b.dropout if name == "mcdropout" else 0.0
    if b.batch_size > len(ctx.data.y_train):
        raise ConfigError(f"{cfg.source}: 'baselines.batch_size' ({b.batch_size}) is larger than the training "
                          f"split ({len(ctx.data.y_train)} images)")
    data, device = ctx.data, ctx.device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed("baseline", name, "init"))
        net = mlp(ctx.net_sizes, dropout=dropout).to(device)
        torch.manual_seed(ctx.seed("baseline", name, "dropout"))
        mc_passes = b.mc_passes if dropout > 0 else 0
        result = train_baseline(
            net, b, data.x_train.to(device), data.y_train.to(device), data.x_val.to(device),
            data.y_val.to(device), seed=ctx.seed("baseline", name, "batches"), mc_passes=mc_passes,
            progress=lambda it: ctx.progress(it, desc=f"{name} epochs", unit="epoch"))
    bad = nonfinite_tensor(result.state_dict)
    if bad is not None:
        raise DivergenceError(f"the {name} baseline diverged ({bad} not finite); try a smaller baselines.lr "
                              f"(now {b.lr}); complete artifacts are unchanged")
    built = partial_of(path)
    save_torch_atomic(built, result.state_dict)
    record = manifest_record("baselines", config_hash(cfg, "baselines"), {}, method=name, dropout=dropout,
                             best_epoch=result.best_epoch, val_accuracy=result.val_accuracy,
                             seconds=round(result.seconds, 2), sizes=ctx.net_sizes)
    publish({built: path}, manifest_of(path), record)
    log.info("%s baseline: best validation accuracy %.4f at epoch %d (%.0f s) → %s", name,
             result.val_accuracy, result.best_epoch + 1, result.seconds, path)
    return path
