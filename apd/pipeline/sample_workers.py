"""Sampling on several workers (processes spawned on this machine, or those of a ``torchrun`` launch): each
runs its chains c ≡ rank (mod workers) into its own shard, and rank 0 checks that every shard holds what its
worker reported before the shards are joined and published (:mod:`apd.pipeline.sample_publish`).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from pathlib import Path

import torch

from apd.errors import ArtifactError, device_failures_are_errors
from apd.nets import ParamSpec
from apd.pipeline.distributed import Group, process_group, worker_device
from apd.pipeline.layout import checkpoint_of, partial_of
from apd.pipeline.parallel import worker_context
from apd.pipeline.runtime import RunContext
from apd.pipeline.sample_chains import MONITOR_SIZE, Finished, run_chains
from apd.pipeline.sample_publish import publish_samples
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)


def death_notice(ctx: RunContext, rank: int, how: str) -> str:
    shard = partial_of(ctx.layout.shard(rank))
    return (f"sampling worker {rank} {how}; its shard {shard} keeps every sample up to its last checkpoint "
            "and the other workers' shards theirs: run the same command again to resume every chain")


def spawned_worker(rank: int, size: int, init_method: str, portable: dict) -> None:
    """A worker process started by :func:`~apd.pipeline.distributed.spawn` (one machine)."""
    ctx = worker_context(rank, size, portable, threads=1)
    ctx = dataclasses.replace(ctx, device_name=str(worker_device(ctx.device, rank)))
    spec = ParamSpec.from_module(ctx.network())
    with device_failures_are_errors("sample", ctx.device), process_group(rank, size, ctx.device, init_method) as group:
        sample_shard(ctx, spec, group, size)


def sample_shard(ctx: RunContext, spec: ParamSpec, group: Group, local_workers: int) -> None:
    """One worker of several: its chains into its shard, then (rank 0) the checked join and the publication."""
    s, layout = ctx.cfg.sgld, ctx.layout
    shard = layout.shard(group.rank)
    chains = list(range(group.rank, s.chains, group.size))
    finished = run_chains(ctx, spec, chains, partial_of(shard), checkpoint_of(shard), local_workers,
                           rank=group.rank)
    reports = group.gather(dataclasses.replace(finished, monitor_sum=None))
    total = finished.monitor_sum  # the running ensemble's summed probabilities on the monitor images
    if total is None:
        total = torch.zeros(len(ctx.data.y_val[:MONITOR_SIZE]), ctx.data.num_classes, device=ctx.device)
    total = group.sum(total)
    if group.rank != 0:
        log.info("worker %d: %d samples of chains %s in %s; rank 0 joins the shards", group.rank,
                 finished.samples, chains, partial_of(shard))
    else:
        reports[0] = dataclasses.replace(reports[0], monitor_sum=total)
        shards = [layout.shard(rank) for rank in range(group.size)]
        _check_shards(reports, shards)
        publish_samples(ctx, spec, reports, {partial_of(shard): shard for shard in shards})
    group.barrier()  # every worker leaves the group together, after the publication (a failed one stops all)


def _check_shards(reports: list[Finished], shards: list[Path]) -> None:
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
