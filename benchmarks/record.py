"""A benchmark's findings as a JSON record, so that docs/performance.md's table is rendered from committed
files (``<!-- results:benchmarks:performance -->``, :func:`apd.docs.render_performance`) rather than typed.

Each ``bench_*.py`` script takes ``--out FILE``; with it, the rows it reports (what was timed, the measured
ratio or rate formatted from this run's numbers, the target where there is one) are written together with
the command, the commit, the machine and its load average before the run. ``make bench`` writes them to
``artifacts/benchmarks/``; copying them to ``docs/results/benchmarks/`` and running ``make docs`` publishes
them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

from apd.pipeline.layout import PIPELINE_STAGES
from apd.pipeline.runtime import machine


def commit() -> str:
    """HEAD's hash, with ``+changes`` when the working tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def run_header() -> dict:
    """Where and when a timing starts: the commit (:func:`commit`), the UTC time, and the machine without
    a thread count (each timing sets its own), with its GPU where there is one and its load average now,
    before the timing."""
    where = {key: value for key, value in machine(torch.device("cpu")).items() if key != "threads"}
    if torch.cuda.is_available():
        where["gpu"] = torch.cuda.get_device_name(0)
    return {"commit": commit(), "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {**where, "load_average_before": [round(x, 2) for x in os.getloadavg()]}}


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="write the measured rows as a JSON record here")


def parse_threads_and_out(description: str, default_threads: int | None = None) -> argparse.Namespace:
    """``[THREADS] [--out FILE]`` of the prediction benchmarks; sets torch's thread count to THREADS, or to
    ``default_threads`` when it is not given (torch's own count when that is None too)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("threads", type=int, nargs="?", help="torch threads (1 is fairer on a shared machine)")
    add_out_argument(parser)
    args = parser.parse_args()
    if args.threads or default_threads:
        torch.set_num_threads(args.threads or default_threads)
    return args


class BenchmarkRecord:
    """The rows one benchmark run reports, the pipeline stage whose cost they measure (one of
    :data:`~apd.pipeline.layout.PIPELINE_STAGES`), and where and when it ran (taken when the record is made,
    so the load average is the one before the timings)."""

    def __init__(self, stage: str) -> None:
        if stage not in PIPELINE_STAGES:
            raise ValueError(f"stage must be one of {', '.join(PIPELINE_STAGES)}, got {stage!r}")
        script = Path(sys.argv[0]).name
        self.header = {"script": script, "stage": stage, "command": " ".join([script, *sys.argv[1:]]),
                       **run_header()}
        self.rows: list[dict[str, str]] = []

    def add(self, what: str, measured: str, target: str = "") -> None:
        """One row of the Performance table: ``measured`` is formatted from this run's numbers."""
        self.rows.append({"what": what, "measured": measured, "target": target})

    def write(self, path: Path | None) -> None:
        """Write the record to ``path`` (nothing when it is None)."""
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**self.header, "rows": self.rows}, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {path}")
