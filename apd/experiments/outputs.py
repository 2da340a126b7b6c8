"""What every study leaves: ``experiments/STEM.json`` (its results), ``STEM.md`` (its table) and
``STEM.png`` (its figure), each written atomically, the table printed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from apd.io import write_json_atomic, write_text_atomic


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
