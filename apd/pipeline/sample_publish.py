"""Publishing the finished SGLD store(s): the convergence diagnostics computed on the finished store (or on a
probe join of the shards), logged and drawn in ``diagnostics.png``; several workers' shards joined into
``samples.h5`` as a virtual dataset; every file swapped in under one manifest, and what earlier runs left
beside it removed.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from apd.config import config_hash
from apd.nets import ParamSpec
from apd.pipeline.layout import manifest_of, partial_of
from apd.pipeline.manifests import manifest_record
from apd.pipeline.runtime import RunContext, machine
from apd.pipeline.sample_chains import MONITOR_SIZE, Finished, monitor_accuracy, store_meta
from apd.pipeline.stage import publish
from apd.samplers.burn_in import trace_burn_in
from apd.samplers.diagnostics import diagnose, summary_lines
from apd.samplers.store import SampleStore
from apd.samplers.store_digest import content_digest
from apd.samplers.store_join import join_stores, repack_by_chain

log = logging.getLogger(__name__)

# Diagnostics: ArviZ's statistics on whole arrays (apd.samplers.rank_stats, engine "numpy"), equal to
# ArviZ's own to 1e-15 (tested) and 3-7x faster; training images of the log-likelihood quantity.
DIAGNOSTICS_ENGINE = "numpy"
DIAGNOSTICS_TRAIN_IMAGES = 1000
# What a run leaves beside the store it published: partial stores, checkpoints, shards, the probe join.
_STALE = re.compile(r"samples(-\d+)?\.(partial\.h5|ckpt\.pt)|samples-\d+\.h5|samples\.probe\.h5|"
                    r"samples\.chains\.partial\.h5|diagnostics\.partial\.png")


def publish_samples(ctx: RunContext, spec: ParamSpec, reports: list[Finished], built: dict[Path, Path]) -> None:
    """Diagnose the finished store(s), then swap them in under one manifest (module docstring)."""
    cfg, s, layout = ctx.cfg, ctx.cfg.sgld, ctx.layout
    path = layout.samples
    figure = partial_of(layout.diagnostics_figure)
    if len(reports) == 1 and path in built.values():
        written = next(iter(built))
        diagnostics = _diagnose(ctx, spec, written, figure)
        files = built
        if len(reports[0].chains) > 1:  # rows interleaved by iteration: publish them ordered by chain
            repacked = path.with_name("samples.chains.partial.h5")
            repack_by_chain(written, repacked, s.compression)
            files = {repacked: path}
        samples_digest = _samples_digest(spec, next(iter(files)))
    else:
        meta = {**store_meta(ctx, list(range(s.chains)), reports[0].noise_source), "workers": len(reports)}
        probe = path.with_name("samples.probe.h5")  # the same join over the shards' names while unpublished
        join_stores(probe, list(built), meta=meta)
        try:
            diagnostics = _diagnose(ctx, spec, probe, figure)
            samples_digest = _samples_digest(spec, probe)
        finally:
            probe.unlink(missing_ok=True)
        joined = partial_of(path)
        join_stores(joined, list(built), names=[final.name for final in built.values()], meta=meta)
        files = {**built, joined: path}
    samples = sum(report.samples for report in reports)
    seconds = max(report.seconds for report in reports)
    monitor = reports[0].monitor_sum
    y_monitor = ctx.data.y_val[:MONITOR_SIZE]
    accuracy = monitor_accuracy(monitor if monitor is not None and monitor.any() else None, y_monitor)
    details = {"samples": samples, "dimension": spec.numel, "chains": s.chains, "workers": len(reports),
               "seconds": round(seconds, 2), "cpu_seconds": round(sum(report.cpu_seconds for report in reports), 2),
               "iterations_per_second": round(s.iterations * s.chains / max(seconds, 1e-9), 1),
               "monitor_ensemble_val_accuracy": accuracy, "diagnostics": diagnostics, "machine": machine(ctx.device),
               "samples_digest": samples_digest}
    if len(reports) > 1:
        details["shards"] = [{"file": final.name, "rank": report.rank, "host": report.host,
                              "chains": report.chains, "samples": report.samples, "seconds": round(report.seconds, 2),
                              "cpu_seconds": round(report.cpu_seconds, 2)}
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


def stored_burn_in(store: SampleStore) -> dict:
    """The burn-in the store's log-likelihood trace gives (:func:`apd.samplers.burn_in.trace_burn_in`), or
    ``{"error": …}`` where it cannot be read (no log-likelihood recorded, chains too short)."""
    try:
        return trace_burn_in(store.log_liks, store.chains)
    except ValueError as exc:
        return {"error": str(exc)}


def _samples_digest(spec: ParamSpec, store_path: Path) -> str:
    """The content digest of the store at ``store_path`` (:func:`apd.samplers.store_digest.content_digest`): what
    names the samples published, whatever file holds them."""
    with SampleStore.open(store_path, expect_spec=spec) as store:
        return content_digest(store)


def _diagnose(ctx: RunContext, spec: ParamSpec, store_path: Path, figure: Path) -> dict:
    """Convergence diagnostics of the store at ``store_path`` (logged; one warning when they fail)."""
    data, n = ctx.data, DIAGNOSTICS_TRAIN_IMAGES
    started = time.perf_counter()
    try:
        with SampleStore.open(store_path, expect_spec=spec) as store:
            summary = diagnose(spec, store, data.x_val, data.y_val, data.x_train[:n], data.y_train[:n],
                               figure_path=figure, engine=DIAGNOSTICS_ENGINE, device=ctx.device,
                               seed=ctx.seed("sample", "diagnostics"))
            summary["burn_in"] = stored_burn_in(store)
    except ValueError as exc:  # too few draws per chain
        log.warning("no convergence diagnostics: %s", exc)
        return {"error": str(exc)}
    summary["seconds"] = round(time.perf_counter() - started, 2)
    for line in summary_lines(summary):
        log.info("%s", line)
    if summary["warning"]:
        log.warning("warning: %s", summary["warning"])
    return summary
