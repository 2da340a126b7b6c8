"""The baselines ``apd sample`` trains after the SGD network, for the peers ``apd evaluate`` compares APD
with: a deep ensemble and SWAG, each an artifact beside the other baselines.

- ``baselines/ensemble.pt``: ``{"members": [M, D]}``, M = ``peers.ensemble_members`` networks trained
  as the SGD baseline, member m from the named streams ``("ensemble", m, "init" | "batches")``
  (:func:`apd.posteriors.ensemble.train_deep_ensemble`);
- ``baselines/swag.pt``: SWAG's moments ``{"mean", "variance", "deviations"}`` (float32) collected from
  SGD continued from ``baselines/sgd.pt`` at the constant learning rate of ``peers.swag_lrs`` with the
  lowest validation NLL (:func:`apd.posteriors.swag.choose_swag_lr`; only the validation split takes part),
  minibatches from the stream ``("swag", "batches")``; its manifest records every rate's validation NLL.

Both manifests carry the stage key ``peers`` (config sections seed, data, net, baselines, peers); SWAG's
also names the SGD baseline's manifest as its input, so a new SGD network redoes SWAG. The Laplace
approximations and Stein thinning are fit by ``apd evaluate`` itself (:mod:`apd.pipeline.methods`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from apd.config import config_hash
from apd.io import load_torch, save_torch_atomic
from apd.pipeline.layout import manifest_of, partial_of
from apd.pipeline.manifests import manifest_digest, manifest_record
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import publish, reusable
from apd.posteriors.ensemble import train_deep_ensemble
from apd.posteriors.swag import choose_swag_lr

log = logging.getLogger(__name__)

STAGE = "peers"


def peer_complete(ctx: RunContext, name: str) -> bool:
    """Whether peer ``name``'s artifact (module docstring) is complete for this configuration and, for SWAG,
    for the SGD network it continued."""
    if name == "swag" and not manifest_of(ctx.layout.baseline("sgd")).is_file():
        return False
    return reusable(ctx, ctx.layout.baseline(name), STAGE, _inputs(ctx, name))


def _inputs(ctx: RunContext, name: str) -> dict:
    return {"sgd": manifest_digest(manifest_of(ctx.layout.baseline("sgd")))} if name == "swag" else {}


def train_ensemble(ctx: RunContext) -> Path:
    path = ctx.layout.baseline("ensemble")
    if peer_complete(ctx, "ensemble"):
        return path
    cfg, data, device = ctx.cfg, ctx.data, ctx.device
    members = cfg.peers.ensemble_members
    seeds = [(ctx.seed("ensemble", m, "init"), ctx.seed("ensemble", m, "batches")) for m in range(members)]
    started = time.perf_counter()
    vectors = train_deep_ensemble(ctx.net_sizes, cfg.baselines, data.x_train.to(device), data.y_train.to(device),
                                  data.x_val.to(device), data.y_val.to(device), seeds,
                                  conv=cfg.net.conv)
    seconds = time.perf_counter() - started
    built = partial_of(path)
    save_torch_atomic(built, {"members": torch.stack(vectors).cpu()})
    record = manifest_record(STAGE, config_hash(cfg, STAGE), {}, method="ensemble", members=members,
                             **ctx.net_record, seconds=round(seconds, 2))
    publish({built: path}, manifest_of(path), record)
    log.info("deep ensemble: %d networks (%.0f s) → %s", members, seconds, path)
    return path


def train_swag(ctx: RunContext) -> Path:
    path, sgd = ctx.layout.baseline("swag"), ctx.layout.baseline("sgd")
    inputs = _inputs(ctx, "swag")
    if peer_complete(ctx, "swag"):
        return path
    cfg, p, data, device = ctx.cfg, ctx.cfg.peers, ctx.data, ctx.device
    net = ctx.network()
    net.load_state_dict(load_torch(sgd))
    net = net.to(device)
    started = time.perf_counter()
    choice = choose_swag_lr(net, data.x_train.to(device), data.y_train.to(device), data.x_val.to(device),
                            data.y_val.to(device), p.swag_lrs, p.swag_epochs, rank=p.swag_rank,
                            samples=p.swag_val_samples, batch_size=cfg.baselines.batch_size,
                            weight_decay=cfg.baselines.weight_decay, seed=ctx.seed("swag", "batches"),
                            snapshots_per_epoch=p.swag_snapshots_per_epoch, scale=p.swag_scale)
    seconds = time.perf_counter() - started
    post = choice.posterior
    built = partial_of(path)
    save_torch_atomic(built, {"mean": post.mean.cpu(), "variance": (post.std**2).cpu(),
                              "deviations": post.deviations.cpu()})
    val_nll = {f"{lr:g}": (nll if nll != float("inf") else None) for lr, nll in choice.val_nll.items()}
    record = manifest_record(STAGE, config_hash(cfg, STAGE), inputs, method="swag", lr=choice.lr,
                             val_nll=val_nll, rank=post.rank, scale=p.swag_scale, epochs=p.swag_epochs,
                             **ctx.net_record, seconds=round(seconds, 2))
    publish({built: path}, manifest_of(path), record)
    grid = ", ".join(f"{lr} → {'diverged' if nll is None else f'{nll:.4f}'}" for lr, nll in val_nll.items())
    log.info("SWAG: learning rate %g of %s by validation NLL (%s), rank %d (%.0f s) → %s", choice.lr,
             list(p.swag_lrs), grid, post.rank, seconds, path)
    return path


PEERS = {"ensemble": train_ensemble, "swag": train_swag}  # what trains each peer's artifact
