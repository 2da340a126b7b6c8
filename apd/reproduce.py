"""``apd reproduce``: run a pipeline afresh into a scratch directory and compare its results with the
committed ones (``docs/results/NAME/results.json``), number by number at the precision the tables print.

The comparison renders every table of ``tables.md`` (timing and machine excluded: they measure the
machine, not the method) from both results and lists each cell that differs. Printed precision is the
tolerance: a number identical to the digits shown passes; across machines with other thread counts,
BLAS or a GPU, a value lying on a rounding boundary can still flip its last digit, and a sum taken in
another order can move a trained generator further. Where cells differ, :func:`where_they_part` says whether
the fresh store holds the committed samples (their digests, :mod:`apd.samplers.store_digest`) and how the
machines differ, so that a difference is traced to sampling or to what follows it; where samples made with
MKL's Intel kernels were not made again, it names ``KERNELS=intel`` (:mod:`apd.pipeline.kernels`).
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


def where_they_part(committed: dict, fresh: dict) -> list[str]:
    """Whether the fresh run sampled the committed samples (equal digests: the differences arise after
    sampling; unequal: they start in it; unknown for results made before the digest was recorded), and
    what differs between the machines that made the two (processor, cores, threads, torch, device)."""
    ours, theirs = fresh.get("samples_digest"), committed.get("samples_digest")
    if ours is None or theirs is None:
        lines = ["samples: not comparable (results made before the samples' digest was recorded)"]
    elif ours == theirs:
        lines = [f"samples: the same as the committed ones (digest {ours}); the differences arise after sampling"]
    else:
        lines = [f"samples: not the committed ones (digest {ours}, committed {theirs}); the differences start in "
                 "sampling"]
    old, new = committed.get("machine") or {}, fresh.get("machine") or {}
    changed = [f"{key} {old.get(key, '?')} → {new.get(key, '?')}" for key in sorted(set(old) | set(new))
               if old.get(key) != new.get(key)]
    lines.append("machine: " + ("; ".join(changed) if changed else "the committed results' processor, threads "
                                "and torch"))
    if ours != theirs and None not in (ours, theirs) and _intel_kernels(old) and not _intel_kernels(new):
        lines.append("kernels: the committed samples were made with MKL's Intel kernels and these were not; "
                     "`make reproduce KERNELS=intel` takes them on an x86 processor with AVX-512 (docs/results.md)")
    return lines


def _intel_kernels(machine: dict) -> bool:
    """Whether MKL took its Intel kernels on ``machine`` (those it takes on an Intel processor, where results made
    before the kernels were recorded say nothing else; :mod:`apd.pipeline.kernels`)."""
    kernels = machine.get("kernels")
    return kernels.startswith("MKL Intel") if kernels else "Intel" in machine.get("cpu", "")


def run_reproduce(ctx: RunContext, committed_path: Path) -> tuple[list[str], list[str]]:
    """Run sample, distill and evaluate with ``ctx`` (a scratch artifacts root, emptied first) and compare
    with ``committed_path``; returns the differing cells and :func:`where_they_part`."""
    committed = read_json(committed_path)
    shutil.rmtree(ctx.out_dir, ignore_errors=True)
    run_sample(ctx)
    run_distill(ctx)
    run_evaluate(ctx)
    fresh = read_json(ctx.layout.results)
    return differences(committed, fresh), where_they_part(committed, fresh)
