"""What every study leaves: ``experiments/STEM.json`` (its results, with where they were made:
:func:`provenance`), ``STEM.md`` (its table) and ``STEM.png`` (its figure), replaced together once all are
written, the table printed (not with ``--quiet``); and the one way a study runs from
its ``--option`` strings to those files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apd.config import config_hash
from apd.experiments.options import plan_from_options
from apd.experiments.studies import STUDIES
from apd.io import read_json, write_json_atomic, write_text_atomic, written_together
from apd.pipeline.finished_parts import FinishedParts, run_parts
from apd.pipeline.layout import manifest_of
from apd.pipeline.runtime import RunContext, machine


def write_study(out: Path, stem: str, results: dict, render: Callable[[dict], str],
                draw: Callable[[dict, Path], None], show: bool) -> str:
    """Write ``results`` as JSON, ``render(results)`` as Markdown and ``draw(results, png)`` under ``out``,
    replacing the three together once all are written (:func:`apd.io.written_together`); return the
    Markdown, printed when ``show``."""
    json_file, md_file, png_file = (out / f"{stem}.{suffix}" for suffix in ("json", "md", "png"))
    out.mkdir(parents=True, exist_ok=True)
    with written_together([json_file, md_file, png_file]) as built:
        write_json_atomic(built[json_file], results)
        markdown = render(results)
        write_text_atomic(built[md_file], markdown)
        draw(results, built[png_file])
    if show:
        print(markdown)
    return markdown


def provenance(ctx: RunContext) -> dict[str, Any]:
    """Where a study's results were made: the machine (:func:`~apd.pipeline.runtime.machine`), the digests of
    the sample store's files it read and the digest of the samples they hold
    (:func:`~apd.samplers.store_digest.content_digest`), as the store's manifest records them (None without
    one or, for the samples' digest, for a store published before it was recorded), so that a published
    study names the store it ran on rather than the docs saying so."""
    manifest = manifest_of(ctx.layout.samples)
    record = read_json(manifest) if manifest.is_file() else {}
    return {"machine": machine(ctx.device), "store_files": record.get("files"),
            "store_samples": record.get("samples_digest")}


def study_parts(ctx: RunContext, stem: str, plan: Any) -> FinishedParts:
    """The parts of the study ``stem`` under ``plan`` (a dataclass) that a run cut short finished, in
    ``experiments/STEM.partial/`` (:mod:`apd.pipeline.finished_parts`): taken by a run of the same study on the
    same pipeline configuration, store, apd version and machine, unless it starts over (``--force``)."""
    return run_parts(ctx, ctx.layout.experiments / f"{stem}.partial",
                     {"study": stem, "plan": dataclasses.asdict(plan), "config": config_hash(ctx.cfg),
                      **provenance(ctx)})


def run_study(ctx: RunContext, options: list[str], plan: type, compute: Callable[..., dict], stem: str,
              render: Callable[[dict], str], draw: Callable[[dict, Path], None]) -> dict:
    """``compute(ctx, plan)`` for the ``plan`` dataclass built from ``options``
    (:func:`~apd.experiments.options.plan_from_options`) with its :func:`provenance`, written by
    :func:`write_study` under ``ctx.layout.experiments``; returns the results. A study the registry says
    resumes (:attr:`~apd.experiments.studies.Study.resumes`) is computed as ``compute(ctx, plan, finished)``,
    ``finished`` its :func:`study_parts`, removed once written."""
    plan = plan_from_options(options, plan)
    finished = study_parts(ctx, stem, plan) if any(s.stem == stem and s.resumes for s in STUDIES) else None
    computed = compute(ctx, plan) if finished is None else compute(ctx, plan, finished)
    results = {**computed, "provenance": provenance(ctx)}
    write_study(ctx.layout.experiments, stem, results, render, draw, show=not ctx.quiet)
    if finished is not None:
        finished.remove()
    return results
