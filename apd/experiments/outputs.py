"""What every study leaves: ``experiments/STEM.json`` (its results), ``STEM.md`` (its table) and
``STEM.png`` (its figure), each written atomically, the table printed; and the one way a study runs from
its ``--option`` strings to those files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from apd.experiments.options import plan_from_options
from apd.io import write_json_atomic, write_text_atomic
from apd.pipeline.runtime import RunContext


def write_study(out: Path, stem: str, results: dict, render: Callable[[dict], str],
                draw: Callable[[dict, Path], None]) -> str:
    """Write ``results`` as JSON, ``render(results)`` as Markdown and ``draw(results, png)`` under ``out``;
    print and return the Markdown."""
    write_json_atomic(out / f"{stem}.json", results)
    markdown = render(results)
    write_text_atomic(out / f"{stem}.md", markdown)
    draw(results, out / f"{stem}.png")
    print(markdown)
    return markdown


def run_study(ctx: RunContext, options: list[str], plan: type, compute: Callable[[RunContext, Any], dict], stem: str,
              render: Callable[[dict], str], draw: Callable[[dict, Path], None]) -> dict:
    """``compute(ctx, plan)`` for the ``plan`` dataclass built from ``options``
    (:func:`~apd.experiments.options.plan_from_options`), written by :func:`write_study` under
    ``ctx.layout.experiments``; returns the results."""
    results = compute(ctx, plan_from_options(options, plan))
    write_study(ctx.layout.experiments, stem, results, render, draw)
    return results
