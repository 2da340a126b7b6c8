"""``apd reproduce``: run a pipeline afresh into a scratch directory and compare its results with the
committed ones (``docs/results/NAME/results.json``), number by number at the precision the tables print.

The comparison renders every table of ``tables.md`` (timing and machine excluded: they measure the
machine, not the method) from both results and lists each cell that differs. Printed precision is the
tolerance: a number identical to the digits shown passes; across machines with other thread counts,
BLAS or a GPU, a value lying on a rounding boundary can still flip its last digit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from apd.io import read_json
from apd.pipeline.distill import run_distill
from apd.pipeline.evaluate import run_evaluate
from apd.pipeline.runtime import RunContext
from apd.pipeline.sample import run_sample
from apd.pipeline.tables import build_tables

COMPARED_TABLES = ("accuracy", "ood", "mean_auroc", "storage", "mog", "fidelity", "adversarial")


def table_cells(results: dict) -> dict[tuple[str, int, int], str]:
    """(table, row, column) → cell text of every compared table's Markdown rows."""
    cells = {}
    for table in build_tables(results):
        if table.name not in COMPARED_TABLES:
            continue
        rows = [line for line in table.markdown.splitlines() if line.startswith("| ")]
        for i, line in enumerate(rows):
            for j, cell in enumerate(line.strip("|").split("|")):
                cells[(table.name, i, j)] = cell.strip()
    return cells


def differences(committed: dict, fresh: dict) -> list[str]:
    """One line per cell that differs (or exists on one side only)."""
    old, new = table_cells(committed), table_cells(fresh)
    lines = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            table, row, column = key
            lines.append(f"{table} row {row} column {column}: committed {old.get(key, '(none)')!r}, "
                         f"fresh {new.get(key, '(none)')!r}")
    return lines


def run_reproduce(ctx: RunContext, committed_path: Path) -> list[str]:
    """Run sample, distill and evaluate with ``ctx`` (a scratch artifacts root, emptied first) and compare
    with ``committed_path``; returns the differing cells."""
    committed = read_json(committed_path)
    shutil.rmtree(ctx.out_dir, ignore_errors=True)
    run_sample(ctx)
    run_distill(ctx)
    run_evaluate(ctx)
    return differences(committed, read_json(ctx.layout.results))
