"""``apd sample``: SGLD posterior samples into ``samples.h5``, plus the SGD and MC-dropout baselines.

Each chain starts from its own seeded initialisation and runs ``sgld.iterations`` SGLD steps on
minibatches (:class:`apd.data.MinibatchOrder`); after ``burn_in`` iterations every ``thin``-th iterate
(within the sampling phase of the step-size schedule) is appended to the store. A checkpoint (net,
optimizer with its noise generator, iteration, store length, running ensemble) is written every
``checkpoint_every`` iterations, so an interrupted run resumes where the checkpoint left it and stores
exactly the samples an uninterrupted run would. A NaN or infinite loss or sample stops the run with a
:class:`DivergenceError`; every sample stored before it stays.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from apd import __version__
from apd.artifacts import is_complete, load_checkpoint, manifest_path, save_torch_atomic, write_manifest
from apd.baselines import train_baseline
from apd.config import SGLDConfig, config_hash
from apd.data import MinibatchOrder
from apd.errors import ArtifactError, DivergenceError
from apd.nets import ParamSpec, mlp
from apd.runtime import RunContext
from apd.sgld import SGLD, StepSchedule, make_schedule
from apd.store import SampleStore

log = logging.getLogger(__name__)

PREFETCH_SETTINGS = {"auto": None, "on": True, "off": False}  # config value -> SGLD(prefetch_noise=...)
MONITOR_SIZE = 1000  # validation images the running-ensemble accuracy on the progress bar is measured on


def samples_path(ctx: RunContext) -> Path:
    return ctx.out_dir / "samples.h5"


def baseline_path(ctx: RunContext, name: str) -> Path:
    return ctx.out_dir / "baselines" / f"{name}.pt"


def run_sample(ctx: RunContext) -> None:
    """The whole stage: SGLD samples, then the two baselines; complete parts are reused."""
    sample_sgld(ctx)
    for name, dropout in (("sgd", 0.0), ("mcdropout", ctx.cfg.baselines.dropout)):
        train_and_save_baseline(ctx, name, dropout)


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


def sample_sgld(ctx: RunContext) -> Path:
    """Run (or resume, or reuse) the SGLD chains into ``samples.h5``; returns its path."""
    cfg, s = ctx.cfg, ctx.cfg.sgld
    path, manifest = samples_path(ctx), manifest_path(samples_path(ctx))
    checkpoint = path.with_suffix(".ckpt.pt")
    stage_hash = config_hash(cfg, "sample")
    if not ctx.force and is_complete(manifest, stage_hash, {}):
        with SampleStore.open(path) as store:
            log.info("reusing %s (%d samples; --force to redo)", path, len(store))
        return path
    data, device = ctx.data, ctx.device
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    state = _ChainState()
    resumed = None if ctx.force else _load_checkpoint(checkpoint, stage_hash)
    manifest.unlink(missing_ok=True)
    if resumed is not None:
        state = resumed["state"]
        store = SampleStore.open(path, "a", expect_spec=spec)
        if len(store) < state.stored:
            store.close()
            raise ArtifactError(f"{path}: holds {len(store)} samples but its checkpoint recorded "
                                f"{state.stored}; delete both or run with --force")
        store.truncate(state.stored)
        log.info("resuming chain %d at iteration %d with %d samples stored", state.chain, state.iteration,
                 state.stored)
    else:
        checkpoint.unlink(missing_ok=True)
        meta = {"config": cfg.to_dict(), "config_hash": stage_hash, "version": __version__,
                "dataset": data.name, "data_fingerprint": data.fingerprint(), "num_data": len(data.y_train)}
        path.parent.mkdir(parents=True, exist_ok=True)
        store = SampleStore.create(path, spec, meta, compression=s.compression, overwrite=True)
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
    write_manifest(manifest, "sample", stage_hash, {}, samples=n_samples, dimension=spec.numel,
                   seconds=round(state.seconds, 2),
                   iterations_per_second=round(s.iterations * s.chains / max(state.seconds, 1e-9), 1),
                   monitor_ensemble_val_accuracy=accuracy)
    checkpoint.unlink(missing_ok=True)
    log.info("stored %d SGLD samples in %s (%.0f s); ensemble accuracy on %d validation images: %.4f",
             n_samples, path, state.seconds, len(y_monitor), accuracy)
    return path


def _monitor_accuracy(monitor_sum: Tensor | None, y: Tensor) -> float:
    if monitor_sum is None:
        return float("nan")
    return (monitor_sum.argmax(-1) == y).float().mean().item()


class SGLDChain:
    """One SGLD chain over a target MLP: its net, optimizer, schedule and minibatch order.

    Chain ``index`` of a config with seed s is initialised, batched and noised from seed 1000·s + index.
    """

    def __init__(self, ctx: RunContext, index: int, x_train: Tensor, y_train: Tensor) -> None:
        s = ctx.cfg.sgld
        self.index, self.x_train, self.y_train = index, x_train, y_train
        self.seed = ctx.cfg.seed * 1000 + index
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.net = mlp(ctx.net_sizes).to(ctx.device)
        self.optimizer = SGLD(self.net.parameters(), lr=s.lr, num_data=len(y_train),
                              prior_std=math.sqrt(s.prior_var), temperature=s.temperature, seed=self.seed,
                              prefetch_noise=PREFETCH_SETTINGS[ctx.cfg.prefetch_noise])
        self.schedule = make_schedule(s)
        self.temperature = s.temperature
        self.order = MinibatchOrder(len(y_train), s.batch_size, self.seed, ctx.device)

    def step(self, t: int) -> Tensor:
        """SGLD iteration t (0-based) on its minibatch; returns the minibatch mean NLL before the step."""
        self.schedule.apply(self.optimizer, t, self.temperature)
        idx = self.order.indices(t)
        loss = F.cross_entropy(self.net(self.x_train[idx]), self.y_train[idx])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def checked_vector(self, spec: ParamSpec, t: int, loss: Tensor, stored: int) -> Tensor:
        """θ_t as a flat vector, or a :class:`DivergenceError` when the loss or θ is not finite."""
        vec = spec.flatten(self.net)
        loss_value = loss.item()
        if not (math.isfinite(loss_value) and torch.isfinite(vec).all()):
            lr = self.optimizer.defaults["lr"]
            raise DivergenceError(f"SGLD diverged at iteration {t} of chain {self.index} (minibatch loss "
                                  f"{loss_value}); try a smaller sgld.lr (now {lr}); the {stored} samples "
                                  "stored before stay")
        return vec

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


def is_thinned_sample(s: SGLDConfig, schedule: StepSchedule, t: int) -> bool:
    """Whether iterate t is kept: past burn-in, every ``thin``-th, in the schedule's sampling phase."""
    return t >= s.burn_in and (t - s.burn_in + 1) % s.thin == 0 and schedule.is_sampling(t)


def _run_chain(ctx: RunContext, spec: ParamSpec, store: SampleStore, state: _ChainState, resumed: dict | None,
               checkpoint: Path, stage_hash: str, tensors: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
    """Run chain ``state.chain`` from ``state.iteration`` to the end, appending samples to ``store``."""
    s = ctx.cfg.sgld
    x_train, y_train, x_monitor, y_monitor = tensors
    chain = SGLDChain(ctx, state.chain, x_train, y_train)
    if resumed is not None:
        chain.load_state_dict(resumed)
    bar = ctx.progress(total=s.iterations, initial=state.iteration,
                       desc=f"SGLD chain {state.chain + 1}/{s.chains}", unit="it")
    started = time.perf_counter() - state.seconds  # state.seconds: time spent before this call
    with bar:
        for t in range(state.iteration, s.iterations):
            loss = chain.step(t)
            if is_thinned_sample(s, chain.schedule, t):
                vec = chain.checked_vector(spec, t, loss, len(store))
                store.append(vec, step=t, chain=state.chain, lr=chain.schedule.lr(t), log_lik=-loss.item())
                probs = _monitor_probs(chain.net, x_monitor)
                state.monitor_sum = probs if state.monitor_sum is None else state.monitor_sum + probs
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
    save_torch_atomic(path, {
        "config_hash": stage_hash, "net": chain.net.state_dict(), "optimizer": chain.optimizer.state_dict(),
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


def train_and_save_baseline(ctx: RunContext, name: str, dropout: float) -> Path:
    """Train the ``sgd`` or ``mcdropout`` baseline (or reuse it) into ``baselines/NAME.pt``."""
    cfg, b = ctx.cfg, ctx.cfg.baselines
    path = baseline_path(ctx, name)
    manifest = manifest_path(path)
    stage_hash = config_hash(cfg, "baselines")
    if not ctx.force and is_complete(manifest, stage_hash, {}):
        log.info("reusing %s (--force to redo)", path)
        return path
    manifest.unlink(missing_ok=True)
    data, device = ctx.data, ctx.device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 1000 + (7 if name == "sgd" else 11))
        net = mlp(ctx.net_sizes, dropout=dropout).to(device)
        mc_passes = b.mc_passes if dropout > 0 else 0
        result = train_baseline(
            net, b, data.x_train.to(device), data.y_train.to(device), data.x_val.to(device),
            data.y_val.to(device), seed=cfg.seed + 17, mc_passes=mc_passes,
            progress=lambda it: ctx.progress(it, desc=f"{name} epochs", unit="epoch"))
    save_torch_atomic(path, result.state_dict)
    write_manifest(manifest, "baselines", stage_hash, {}, method=name, dropout=dropout,
                   best_epoch=result.best_epoch, val_accuracy=result.val_accuracy,
                   seconds=round(result.seconds, 2), sizes=ctx.net_sizes)
    log.info("%s baseline: best validation accuracy %.4f at epoch %d (%.0f s) → %s", name,
             result.val_accuracy, result.best_epoch + 1, result.seconds, path)
    return path
