"""``apd sample``: SGLD posterior samples into ``samples.h5``, plus the SGD and MC-dropout baselines.

Each chain starts from its own seeded initialisation (``sgld.init``; streams ``("chain", c, "init" |
"batches" | "noise")``) and runs ``sgld.iterations`` SGLD steps on minibatches
(:class:`apd.data.MinibatchOrder`); after ``burn_in`` iterations every ``thin``-th iterate (within the
sampling phase of the step-size schedule) is appended to the store with the minibatch mean
log-likelihood at exactly those weights.

A process steps all its chains together as one batch (:class:`apd.samplers.chain.SGLDChains`), appending
one row per chain at each kept iteration. **One worker** (``sgld.workers = 1``) holds every chain, writes
``samples.partial.h5`` and publishes it reordered by chain (:func:`~apd.samplers.store_join.
repack_by_chain`). **Several workers** (``sgld.workers`` > 1 on this machine, at
most one per GPU on CUDA, or the processes of a ``torchrun`` launch; :mod:`apd.pipeline.distributed`)
each hold chains c ≡ rank (mod workers), one compute thread each on a CPU. When all have finished, rank 0
checks every shard, joins them into ``samples.h5`` as an HDF5 virtual dataset ordered by chain
(:func:`~apd.samplers.store_join.join_stores`: no sample copied, chain ids global) and publishes the shards and
the joined store under one manifest that holds every file's digest. Chain c's samples do not depend on
the number of workers or on how many chains share its step: the joined store equals the one-worker store
row for row (to the float rounding of batched products).

Each store being built has a checkpoint beside it (``*.ckpt.pt``: the chains' weights and noise generators,
iteration, store length, running ensemble), written every ``checkpoint_every`` iterations and at the end,
so an interrupted run, or a worker that dies, resumes where its checkpoint left it and stores exactly the
samples an uninterrupted run would. Before
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
import shutil
from pathlib import Path

import torch

from apd.config import config_hash
from apd.errors import ArtifactError, ConfigError, DivergenceError
from apd.io import nonfinite_tensor, save_torch_atomic
from apd.nets import ParamSpec
from apd.pipeline.distributed import process_group, spawn, torchrun_env, worker_device
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.manifests import manifest_record
from apd.pipeline.parallel import portable, split_work
from apd.pipeline.peers import PEERS, peer_complete
from apd.pipeline.runtime import RunContext
from apd.pipeline.sample_chains import run_chains
from apd.pipeline.sample_publish import publish_samples
from apd.pipeline.sample_workers import death_notice, sample_shard, spawned_worker
from apd.pipeline.stage import publish, reusable, weights_load
from apd.samplers.baselines import train_baseline
from apd.samplers.store import SampleStore
from apd.samplers.store_disk import FREE_MARGIN
from apd.schedules import thinned_count

log = logging.getLogger(__name__)

BASELINES = ("sgd", "mcdropout")
# independent pieces of the baselines' work, each trained in order: SWAG continues the SGD network. Dealt
# round robin (split_work), two workers train SGD, SWAG and MC dropout on one and the deep ensemble, the
# longest piece on LeNet-5 and fcNN2, on the other
BASELINE_PIECES = (("sgd", "swag"), ("ensemble",), ("mcdropout",))
DISK_MARGIN = 1.1  # free disk asked for, relative to the store's expected size
STORE_CHECK_BYTES = 2**28  # rows read at a time when a store is checked before reuse


def run_sample(ctx: RunContext) -> None:
    """The whole stage: SGLD samples, then the two baselines and the peers; complete parts are reused. The
    baselines and peers train on up to ``sgld.workers`` processes (:func:`~apd.pipeline.parallel.split_work`;
    SWAG after the SGD network it continues). Under ``torchrun`` only rank 0 trains them, in turn."""
    sample_sgld(ctx)
    env = torchrun_env()
    if env is None or env.rank == 0:
        train_all_baselines(ctx, 1 if env is not None else ctx.cfg.sgld.workers)


def train_all_baselines(ctx: RunContext, workers: int) -> None:
    """The pieces of :data:`BASELINE_PIECES` not complete yet, on up to ``workers`` processes."""
    todo = [piece for piece in BASELINE_PIECES if not all(complete_baseline(ctx, name) for name in piece)]
    split_work(ctx, train_baselines, todo, workers, "baselines", "sample")


def train_baselines(ctx: RunContext, pieces: list[tuple[str, ...]]) -> None:
    """The baselines and peers of ``pieces`` (names of :data:`BASELINE_PIECES`), each piece's in order."""
    for piece in pieces:
        for name in piece:
            if name in BASELINES:
                train_and_save_baseline(ctx, name)
            elif name in ctx.cfg.evaluate.methods:
                PEERS[name](ctx)


def complete_baseline(ctx: RunContext, name: str) -> bool:
    """Whether ``baselines/NAME.pt`` is complete for this configuration (a peer not compared counts as done)."""
    if name in BASELINES:
        path = ctx.layout.baseline(name)
        return reusable(ctx, path, "baselines", {}) and weights_load(path)
    return name not in ctx.cfg.evaluate.methods or peer_complete(ctx, name)


def check_batch_fits(ctx: RunContext, key: str, batch_size: int) -> None:
    """A :class:`ConfigError` where the minibatch of setting ``key`` exceeds the training split."""
    if batch_size > len(ctx.data.y_train):
        raise ConfigError(f"{ctx.cfg.source}: '{key}' ({batch_size}) is larger than the training split "
                          f"({len(ctx.data.y_train)} images)")


def check_sampling_fits(ctx: RunContext, spec: ParamSpec) -> None:
    """Fail before any work when a minibatch (the chains', the baselines') exceeds the training split or the
    store cannot fit on disk."""
    s = ctx.cfg.sgld
    check_batch_fits(ctx, "sgld.batch_size", s.batch_size)
    check_batch_fits(ctx, "baselines.batch_size", ctx.cfg.baselines.batch_size)
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
    spec = ParamSpec.from_module(ctx.network())
    check_sampling_fits(ctx, spec)
    if s.chains > 1 and s.init == "default":
        log.info("the %d chains start from PyTorch's initialisation, not over-dispersed: R-hat may look better "
                 "than it is (sgld.init = \"prior\" starts them from prior draws)", s.chains)
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
            sample_shard(ctx, spec, group, local)
    elif _local_workers(ctx) == 1:
        finished = run_chains(ctx, spec, list(range(s.chains)), partial_of(path), checkpoint_of(path), 1)
        publish_samples(ctx, spec, [finished], {partial_of(path): path})
    else:
        workers = _local_workers(ctx)
        log.info("sampling %d chains on %d workers", s.chains, workers)
        spawn(spawned_worker, workers, portable(ctx), on_death=lambda rank, how: death_notice(ctx, rank, how))
    return path


def _local_workers(ctx: RunContext) -> int:
    """Sampling processes on this machine: ``sgld.workers``, but on CUDA at most one per GPU, since a process
    steps all its chains as one batch and two processes on one card only take turns on it."""
    workers = ctx.cfg.sgld.workers
    if ctx.device.type == "cuda" and workers > torch.cuda.device_count():
        log.info("sampling on %d GPU%s: %d worker%s instead of sgld.workers = %d, each stepping its chains "
                 "together", torch.cuda.device_count(), "s" if torch.cuda.device_count() > 1 else "",
                 torch.cuda.device_count(), "s" if torch.cuda.device_count() > 1 else "", workers)
        return torch.cuda.device_count()
    return workers


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


def train_and_save_baseline(ctx: RunContext, name: str) -> Path:
    """Train the ``sgd`` or ``mcdropout`` baseline (or reuse it) into ``baselines/NAME.pt``."""
    cfg, b = ctx.cfg, ctx.cfg.baselines
    path = ctx.layout.baseline(name)
    if complete_baseline(ctx, name):
        return path
    dropout = b.dropout if name == "mcdropout" else 0.0
    check_batch_fits(ctx, "baselines.batch_size", b.batch_size)
    data, device = ctx.data, ctx.device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed("baseline", name, "init"))
        net = ctx.network(dropout).to(device)
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
                             seconds=round(result.seconds, 2), **ctx.net_record)
    publish({built: path}, manifest_of(path), record)
    log.info("%s baseline: best validation accuracy %.4f at epoch %d (%.0f s) → %s", name,
             result.val_accuracy, result.best_epoch + 1, result.seconds, path)
    return path
