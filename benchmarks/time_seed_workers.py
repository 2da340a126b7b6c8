"""``apd distill`` of a pipeline's generator seeds on P worker processes against Q, side by side: the
stage's wall clock, as ``make distill`` runs it (its own ``apd`` process, imports, alignment and checks
included).

Three seeds on two one-thread workers run in two rounds (seeds 0 and 1, then seed 2 alone while the other
core idles); three workers on the two cores run them in one, the kernel sharing the cores between the
processes. A seed's generator does not depend on the worker count (``tests/pipeline/test_pipeline.py``),
so only the wall clock can differ. Run on a pipeline whose ``apd sample`` is complete::

    .venv/bin/python benchmarks/time_seed_workers.py --config pipelines/fashion-fc1.toml \
        --artifacts ARTIFACTS --steps 3000

The stage runs in a scratch artifact directory that links to the pipeline's sample store, so the
pipeline's own generators are never touched; ``--steps`` shortens every seed's training alike (the ratio
of rounds does not depend on it; the share of the alignment, which every worker makes for itself, does).
Takes a few minutes per run on fcNN1. It needs a sampled pipeline, so ``make bench`` (whose scripts make
their own data) does not run it; its record goes to ``docs/results/benchmarks/`` like theirs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import BenchmarkRecord, add_out_argument

from apd.config_load import load_config
from apd.pipeline.layout import Layout, manifest_of


def scratch_pipeline(layout: Layout, scratch_root: Path) -> None:
    """A scratch artifact directory for ``layout``'s pipeline under ``scratch_root``: links to its sample
    store's files and a copy of its manifest, nothing else."""
    target = scratch_root / layout.root.name
    target.mkdir(parents=True)
    for path in layout.root.glob("samples*.h5"):
        (target / path.name).symlink_to(path.resolve())
    manifest = manifest_of(layout.samples)
    shutil.copyfile(manifest, target / manifest.name)


def distill_seconds(config: str, root: Path, workers: int, steps: int) -> float:
    """Wall-clock seconds of ``apd distill --force`` on ``workers`` processes and ``steps`` generator steps."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "apd", "distill", "--config", config, "--artifacts", str(root), "--force",
                    "--quiet", "--set", f"distill.workers={workers}", "--set", f"distill.steps={steps}"], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="pipelines/fashion-fc1.toml")
    parser.add_argument("--artifacts", type=Path, required=True, help="the artifacts root of a sampled pipeline")
    parser.add_argument("--steps", type=int, default=3000, help="generator steps of every seed")
    parser.add_argument("--workers", type=int, nargs=2, default=[2, 3], metavar=("P", "Q"))
    add_out_argument(parser)
    args = parser.parse_args()
    cfg = load_config(args.config)
    layout = Layout(args.artifacts / cfg.name)
    if not manifest_of(layout.samples).is_file():
        parser.error(f"--artifacts {args.artifacts}: no complete `apd sample` of {cfg.name} there")
    record = BenchmarkRecord("distill")
    with tempfile.TemporaryDirectory(prefix="apd-seed-workers-") as scratch:
        scratch_pipeline(layout, Path(scratch))
        seconds = {workers: distill_seconds(args.config, Path(scratch), workers, args.steps)
                   for workers in args.workers}
    (p, q), seeds = args.workers, cfg.distill.seeds
    for workers, value in seconds.items():
        print(f"{seeds} seeds on {workers} workers: {value:.1f} s")
    record.add(f"`apd distill` of {cfg.name}'s {seeds} generator seeds ({args.steps:,} steps each, one thread per "
               f"worker): {q} worker processes against {p} (`time_seed_workers.py`)",
               f"{seconds[p] / seconds[q]:.2f}× faster ({seconds[q]:.0f} s against {seconds[p]:.0f} s)")
    print(record.rows[-1]["measured"])
    record.write(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
