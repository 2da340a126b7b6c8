"""``apd sample``: SGLD posterior samples into ``samples.h5``, plus the SGD and MC-dropout baselines.

Each chain starts from its own seeded initialisation (``sgld.init``; streams ``("chain", c, "init" |
"batches" | "noise")``) and runs ``sgld.iterations`` SGLD steps on minibatches
(:class:`apd.data.MinibatchOrder`); after ``burn_in`` iterations every ``thin``-th iterate (within the
sampling phase of the step-size schedule) is appended to the store with the minibatch mean
log-likelihood at exactly those weights.

**One worker** (``sgld.workers = 1``, the default) runs the chains one after another into
``samples.partial.h5``. **Several workers** (``sgld.workers`` > 1 on this machine, or the processes of a
``torchrun`` launch; :mod:`apd.pipeline.distributed`) each run chains c ≡ rank (mod workers), one
compute thread each, into their own shard ``samples-RANK.partial.h5``; when all have finished, rank 0
checks every shard, joins them into ``samples.h5`` as an HDF5 virtual dataset ordered by chain
(:func:`~apd.samplers.store_join.join_stores`: no sample copied, chain ids global) and publishes the shards and
the joined store under one manifest that holds every file's digest. Chain c's samples do not depend on
the number of workers: the joined store equals the one-worker store row for row.

Each store being built has a checkpoint beside it (``*.ckpt.pt``: the running chain's net and optimizer
with its noise generator, iteration, store length, running ensemble), written every
``checkpoint_every`` iterations and when a chain ends, so an interrupted run, or a worker that dies,
resumes where its checkpoint left it and stores exactly the samples an uninterrupted run would. Before
publishing, the convergence diagnostics (:mod:`apd.samplers.diagnostics`: rank-normalised split R-hat
and bulk/tail ESS in function space, on the training log-likelihood and on the top weight principal
components) are computed on the finished store, logged, stored in the manifest and drawn in
``diagnostics.png``. Only a finished store replaces ``samples.h5`` (then its manifest), so a failure, a
divergence or a kill never touches a complete store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import socket
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
from apd.pipeline.distributed import Group, process_group, spawn, torchrun_env, worker_device
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.manifests import load_checkpoint, manifest_record
from apd.pipeline.peers import train_peers
from apd.pipeline.runtime import RunContext, machine
from apd.pipeline.stage import publish, reusable
from apd.samplers.baselines import train_baseline
from apd.samplers.chain import ChainSeeds, SGLDChain, is_thinned_sample, thinned_count
from apd.samplers.diagnostics import diagnose, summary_lines
from apd.samplers.sgld import prefetch_pays
from apd.samplers.store import SampleStore
from apd.samplers.store_disk import FREE_MARGIN
from apd.samplers.store_join import join_stores

log = logging.getLogger(__name__)

PREFETCH_SETTINGS = {"auto": None, "on": True, "off": False}  # config value -> SGLD(prefetch_noise=...)
MONITOR_SIZE = 1000  # validation images the running-ensemble accuracy on the progress bar is measured on
BASELINES = ("sgd", "mcdropout")
DISK_MARGIN = 1.1  # free disk asked for, relative to the store's expected size
# Diagnostics: ArviZ's statistics on whole arrays (apd.samplers.rank_stats, engine "numpy"), equal to
# ArviZ's own to 1e-15 (tested) and 3-7x faster; training images of the log-likelihood quantity.
DIAGNOSTICS_ENGINE = "numpy"
DIAGNOSTICS_TRAIN_IMAGES = 1000
# What a run leaves beside the store it published: partial stores, checkpoints, shards, the probe join.
_STALE = re.compile(r"samples(-\d+)?\.(partial\.h5|ckpt\.pt)|samples-\d+\.h5|samples\.probe\.h5|"
                    r"diagnostics\.partial\.png")
STORE_CHECK_BYTES = 2**28  # rows read at a time when a store is checked before reuse


def run_sample(ctx: RunContext) -> None:
    """The whole stage: SGLD samples, then the two baselines; complete parts are reused. Under ``torchrun``
    only rank 0 trains the baselines."""
    sample_sgld(ctx)
    env = torchrun_env()
    if env is not None and env.rank != 0:
        return
    for name in BASELINES:
        train_and_save_baseline(ctx, name)
    train_peers(ctx)


def chain_seeds(ctx: RunContext, chain: int) -> ChainSeeds:
    """Chain ``chain``'s initialisation, minibatch and noise streams (:mod:`apd.pipeline.seeds`)."""
    return ChainSeeds(*(ctx.seed("chain", chain, stream) for stream in ("init", "batches", "noise")))


def make_chain(ctx: RunContext, chain: int, x_train: Tensor, y_train: Tensor, processes: int = 1) -> SGLDChain:
    """Chain ``chain`` on ``ctx.device``; ``processes``: sampling processes sharing this machine's cores
    (they decide whether ``prefetch_noise = "auto"`` draws the noise on a thread of its own)."""
    prefetch = PREFETCH_SETTINGS[ctx.cfg.prefetch_noise]
    if prefetch is None:
        prefetch = prefetch_pays(ctx.device, processes)
    return SGLDChain(ctx.net_sizes, ctx.cfg.sgld, chain, x_train, y_train, chain_seeds(ctx, chain), prefetch)


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


@dataclass
class _Finished:
    """One worker's finished store, as it reports it to rank 0."""

    rank: int
    host: str
    chains: list[int]
    samples: int
    bytes: int
    seconds: float
    monitor_sum: Tensor | None


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
    """Run (or resume, or reuse) the SGLD chains into ``samples.h5`` on one or several workers (module
    docstring); returns its path."""
    s = ctx.cfg.sgld
    path = ctx.layout.samples
    if reusable(ctx, path, "sample", {}) and _store_is_sound(path):
        return path
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    check_sampling_fits(ctx, spec)
    env = torchrun_env()
    if env is not None:
        if env.world_size > s.chains:
            raise ConfigError(f"{ctx.cfg.source}: torchrun started {env.world_size} workers for "
                              f"{s.chains} chains ('sgld.chains'); a worker runs whole chains")
        if env.world_size != s.workers and env.rank == 0:
            log.info("torchrun: %d workers ('sgld.workers' = %d applies without torchrun)", env.world_size,
                     s.workers)
        ctx = dataclasses.replace(ctx, device_name=str(worker_device(ctx.device, env.local_rank)))
        torch.set_num_threads(1)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
        with process_group(env.rank, env.world_size, ctx.device) as group:
            _sample_shard(ctx, spec, group, local)
    elif s.workers == 1:
        finished = _run_chains(ctx, spec, list(range(s.chains)), partial_of(path), checkpoint_of(path), 1)
        _publish_samples(ctx, spec, [finished], {partial_of(path): path})
    else:
        portable = {"cfg": ctx.cfg, "artifacts_root": ctx.artifacts_root, "data_dir": ctx.data_dir,
                    "device_name": ctx.device_name, "force": ctx.force, "quiet": ctx.quiet}
        log.info("sampling %d chains on %d workers", s.chains, s.workers)
        spawn(_spawned_worker, s.workers, portable, on_death=lambda rank, how: _death_notice(ctx, rank, how))
    return path


def _death_notice(ctx: RunContext, rank: int, how: str) -> str:
    shard = partial_of(ctx.layout.shard(rank))
    return (f"sampling worker {rank} {how}; its shard {shard} keeps every sample up to its last checkpoint "
            "and the other workers' shards theirs: run the same command again to resume every chain")


def _spawned_worker(rank: int, size: int, init_method: str, portable: dict) -> None:
    """A worker process started by :func:`~apd.pipeline.distributed.spawn` (one machine)."""
    quiet = portable["quiet"]
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, force=True,
                        format=f"worker {rank}/{size}: %(message)s")
    torch.set_num_threads(1)
    ctx = RunContext(**portable)
    ctx = dataclasses.replace(ctx, device_name=str(worker_device(ctx.device, rank)))
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    with process_group(rank, size, ctx.device, init_method) as group:
        _sample_shard(ctx, spec, group, size)


def _sample_shard(ctx: RunContext, spec: ParamSpec, group: Group, local_workers: int) -> None:
    """One worker of several: its chains into its shard, then (rank 0) the checked join and the publication."""
    s, layout = ctx.cfg.sgld, ctx.layout
    shard = layout.shard(group.rank)
    chains = list(range(group.rank, s.chains, group.size))
    finished = _run_chains(ctx, spec, chains, partial_of(shard), checkpoint_of(shard), local_workers,
                           rank=group.rank)
    reports = group.gather(dataclasses.replace(finished, monitor_sum=None))
    total = finished.monitor_sum if finished.monitor_sum is not None else torch.zeros(0)
    total = group.sum(total)
    if group.rank != 0:
        log.info("worker %d: %d samples of chains %s in %s; rank 0 joins the shards", group.rank,
                 finished.samples, chains, partial_of(shard))
        return
    reports[0] = dataclasses.replace(reports[0], monitor_sum=total)
    shards = [layout.shard(rank) for rank in range(group.size)]
    _check_shards(reports, shards)
    _publish_samples(ctx, spec, reports, {partial_of(shard): shard for shard in shards})


def _check_shards(reports: list[_Finished], shards: list[Path]) -> None:
    """Every worker's finished shard is here and holds the samples its worker reported; else one line
    that names the shard and says how to go on."""
    for report, shard in zip(reports, shards, strict=True):
        partial = partial_of(shard)
        chains = ", ".join(map(str, report.chains))
        what = f"worker {report.rank}'s shard {partial} (chains {chains}, written on {report.host})"
        if not partial.is_file():
            raise ArtifactError(f"{what} is missing here on {socket.gethostname()}: every worker must write "
                                "to one shared artifacts directory (--artifacts); then run the same command "
                                "again, each worker resumes from its own checkpoint")
        try:
            with SampleStore.open(partial) as store:
                rows = len(store)
        except ArtifactError as exc:
            rows, problem = -1, str(exc)
        else:
            problem = f"holds {rows} samples, its worker stored {report.samples}"
        if rows != report.samples:
            raise ArtifactError(f"{what} {problem}: delete it and {checkpoint_of(shard)} and run the same "
                                "command again to sample these chains afresh (the other workers' shards are kept)")


def _publish_samples(ctx: RunContext, spec: ParamSpec, reports: list[_Finished], built: dict[Path, Path]) -> None:
    """Diagnose the finished store(s), then swap them in under one manifest (module docstring)."""
    cfg, s, layout = ctx.cfg, ctx.cfg.sgld, ctx.layout
    path = layout.samples
    figure = partial_of(layout.diagnostics_figure)
    if len(reports) == 1 and path in built.values():
        diagnostics = _diagnose(ctx, spec, next(iter(built)), figure)
        files = built
    else:
        meta = {**_store_meta(ctx, list(range(s.chains))), "workers": len(reports)}
        probe = path.with_name("samples.probe.h5")  # the same join over the shards' names while unpublished
        join_stores(probe, list(built), meta=meta)
        try:
            diagnostics = _diagnose(ctx, spec, probe, figure)
        finally:
            probe.unlink(missing_ok=True)
        joined = partial_of(path)
        join_stores(joined, list(built), names=[final.name for final in built.values()], meta=meta)
        files = {**built, joined: path}
    samples = sum(report.samples for report in reports)
    seconds = max(report.seconds for report in reports)
    monitor = reports[0].monitor_sum
    y_monitor = ctx.data.y_val[:MONITOR_SIZE]
    accuracy = _monitor_accuracy(monitor if monitor is not None and monitor.numel() else None, y_monitor)
    details = {"samples": samples, "dimension": spec.numel, "chains": s.chains, "workers": len(reports),
               "seconds": round(seconds, 2),
               "iterations_per_second": round(s.iterations * s.chains / max(seconds, 1e-9), 1),
               "monitor_ensemble_val_accuracy": accuracy, "diagnostics": diagnostics, "machine": machine(ctx.device)}
    if len(reports) > 1:
        details["shards"] = [{"file": final.name, "rank": report.rank, "host": report.host,
                              "chains": report.chains, "samples": report.samples, "seconds": round(report.seconds, 2)}
                             for report, final in zip(reports, built.values(), strict=True)]
    publish(files, manifest_of(path), manifest_record("sample", config_hash(cfg, "sample"), {}, **details))
    if figure.is_file():
        os.replace(figure, layout.diagnostics_figure)
    _remove_stale(ctx, keep=set(files.values()))
    log.info("stored %d SGLD samples of %d chains in %s (%.0f s, %d worker%s); ensemble accuracy on %d validation "
             "images: %.4f", samples, s.chains, path, seconds, len(reports), "s" if len(reports) > 1 else "",
             len(y_monitor), accuracy)


def _remove_stale(ctx: RunContext, keep: set[Path]) -> None:
    """Drop what earlier runs left beside the published store: partial stores and checkpoints (all consumed
    now) and shards of a run with more workers."""
    for path in ctx.out_dir.iterdir():
        if _STALE.fullmatch(path.name) and path not in keep:
            path.unlink(missing_ok=True)


def _store_meta(ctx: RunContext, chains: list[int]) -> dict:
    data = ctx.data
    return {"config": ctx.cfg.to_dict(), "config_hash": config_hash(ctx.cfg, "sample"), "version": __version__,
            "dataset": data.name, "data_fingerprint": data.fingerprint(), "num_data": len(data.y_train),
            "chains": chains, "chain_seeds": {str(c): list(vars(chain_seeds(ctx, c)).values()) for c in chains}}


def _diagnose(ctx: RunContext, spec: ParamSpec, store_path: Path, figure: Path) -> dict:
    """Convergence diagnostics of the store at ``store_path`` (logged; one warning when they fail)."""
    data, n = ctx.data, DIAGNOSTICS_TRAIN_IMAGES
    started = time.perf_counter()
    try:
        with SampleStore.open(store_path, expect_spec=spec) as store:
            summary = diagnose(spec, store, data.x_val, data.y_val, data.x_train[:n], data.y_train[:n],
                               figure_path=figure, engine=DIAGNOSTICS_ENGINE, device=ctx.device,
                               seed=ctx.seed("sample", "diagnostics"))
    except ValueError as exc:  # too few draws per chain
        log.warning("no convergence diagnostics: %s", exc)
        return {"error": str(exc)}
    summary["seconds"] = round(time.perf_counter() - started, 2)
    for line in summary_lines(summary):
        log.info("%s", line)
    if summary["warning"]:
        log.warning("warning: %s", summary["warning"])
    return summary


def _monitor_accuracy(monitor_sum: Tensor | None, y: Tensor) -> float:
    if monitor_sum is None:
        return float("nan")
    return (monitor_sum.argmax(-1).cpu() == y).float().mean().item()


def _run_chains(ctx: RunContext, spec: ParamSpec, chains: list[int], partial: Path, checkpoint: Path,
                processes: int, rank: int = 0) -> _Finished:
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
        store = SampleStore.create(partial, spec, _store_meta(ctx, chains), compression=s.compression,
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
            state = _ChainState(state.index + 1, 0, len(store), state.monitor_sum, state.seconds)
            _save_checkpoint(checkpoint, stage_hash, chains, None, state)
        n_samples = len(store)
    return _Finished(rank, socket.gethostname(), chains, n_samples, partial.stat().st_size, state.seconds,
                     state.monitor_sum)


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
                accuracy = _monitor_accuracy(state.monitor_sum, y_monitor.cpu())
                ctx.show(bar, f"{where} iteration {done}/{s.iterations}", samples=len(store),
                         val_acc=f"{accuracy:.4f}")
            if done % s.checkpoint_every == 0 and done < s.iterations:
                _save_checkpoint(checkpoint, stage_hash, chains, chain, _ChainState(
                    state.index, done, len(store), state.monitor_sum, time.perf_counter() - started))
    state.seconds = time.perf_counter() - started


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
        "monitor_sum": state.monitor_sum, "seconds": state.seconds,
    })


def _load_checkpoint(path: Path, stage_hash: str, chains: list[int]) -> dict | None:
    """A checkpoint of this config and this worker's chains with its state, or None."""
    ckpt = load_checkpoint(path, config_hash=stage_hash, chains=chains)
    if ckpt is not None:
        ckpt["state"] = _ChainState(ckpt["index"], ckpt["iteration"], ckpt["stored"], ckpt["monitor_sum"],
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
