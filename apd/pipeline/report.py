"""``apd report`` and what ``apd evaluate`` calls at its end: the tables (:mod:`apd.pipeline.tables`)
and figures (:mod:`apd.pipeline.figures`) of an evaluation, written from ``results.json`` and
``scores.h5`` without recomputing anything (each file replaced whole, so an interrupted report leaves
every file either as it was or as it is now)."""

from __future__ import annotations

from pathlib import Path

from apd.errors import ArtifactError
from apd.io import read_json, restore_directory, write_text_atomic
from apd.pipeline.figures import write_figures
from apd.pipeline.manifests import file_digest
from apd.pipeline.runtime import RunContext
from apd.pipeline.table_format import write_csv
from apd.pipeline.tables import assemble, build_tables, summary


def write_report(eval_dir: Path, results: dict, generator_json: Path | None = None, figures: bool = True) -> str:
    """Write ``tables.md``, one CSV per table (``accuracy``, ``ood`` (long), ``mean_auroc``, ``storage``,
    ``mog``, ``fidelity``, ``adversarial``, ``timing``, each when its data exist) and, with ``figures``, the
    figures into ``eval_dir``; return the Markdown."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    tables = build_tables(results)
    for table in tables:
        write_csv(eval_dir / f"{table.name}.csv", table)
    markdown = assemble(results, tables)
    write_text_atomic(eval_dir / "tables.md", markdown)
    if figures:
        write_figures(eval_dir, results, generator_json)
    return markdown


def run_report(ctx: RunContext) -> None:
    """``apd report``: render the tables and figures again from ``eval/results.json`` and print the tables
    (not with ``--quiet``)."""
    markdown = report_again(ctx)[1]
    if not ctx.quiet:
        print(markdown)


def print_summary(ctx: RunContext, results: dict) -> None:
    """Print the closing summary of an evaluation (:func:`apd.pipeline.tables.summary`), not with ``--quiet``."""
    if not ctx.quiet:
        print(summary(results, ctx.layout.eval_dir / "tables.md"))


def report_again(ctx: RunContext, figures: bool = True) -> tuple[dict, str]:
    """Render the tables and, with ``figures``, the figures again from ``eval/results.json`` (checked against the
    evaluation's manifest); returns the results and the Markdown of ``tables.md``."""
    layout = ctx.layout
    restore_directory(layout.eval_dir)
    results_path = layout.results
    if not results_path.is_file():
        raise ArtifactError(f"{results_path}: not found; run `apd evaluate --config {ctx.cfg.source}` first")
    recorded = read_json(layout.evaluate_manifest).get("files", {}) if layout.evaluate_manifest.is_file() else {}
    for name, digest in recorded.items() if isinstance(recorded, dict) else ():
        if file_digest(layout.eval_dir / name) != digest:
            raise ArtifactError(f"{layout.eval_dir / name}: changed since `apd evaluate` wrote it; run `apd evaluate "
                                f"--config {ctx.cfg.source} --force`")
    results = read_json(results_path)
    try:
        markdown = write_report(layout.eval_dir, results, layout.generator.with_suffix(".json"), figures)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{results_path}: malformed results ({type(exc).__name__}: {exc})") from None
    return results, markdown
