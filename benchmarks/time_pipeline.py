"""How long a pipeline takes end to end, as ``make sample distill evaluate`` runs it: each stage as its own
``apd`` process (imports included) into a fresh artifact directory, timed by the wall clock.

Run: ``.venv/bin/python benchmarks/time_pipeline.py [--config pipelines/digits.toml] [--out FILE]`` with
the venv built and nothing else on the machine. It prints each stage's wall-clock time and the parts its
manifests record (SGLD sampling and its diagnostics, each baseline and peer, alignment and GAN training,
evaluation), and with ``--out`` writes them as JSON together with the machine, its load average before the
run and the commit (after every stage, so that a run stopped midway keeps the stages it finished), so that
docs/performance.md's end-to-end row is rendered from a committed file
(``<!-- results:digits:end-to-end -->``, published next to the pipeline's results). The artifacts go to
``--artifacts`` (a directory that must not exist yet, kept for ``apd report --publish``) or to a temporary
directory removed afterwards: the project's own are never touched. The total is the stages' wall clocks
summed. ``--resume`` goes on with a run that stopped (a machine lent for less time than the pipeline takes):
the stages its ``--out`` record has not finished, in its ``--artifacts``, at the same commit, the stage it
stopped in run again from its start (``--force``: not from its checkpoint), so that every stage's time is
that of one whole run; the record notes when and on what load each resumption started. A fix made while the
run was stopped is another commit: ``--across-commits`` resumes at it all the same, and the record names the
commit each resumption ran at (rendered beside the run's own), for the reader to judge whether the fix
touched a stage timed before it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import run_header

from apd.pipeline.layout import PIPELINE_STAGES


def recorded_parts(artifacts: Path) -> dict[str, float]:
    """The seconds each stage's manifests record for its parts."""
    def seconds(name: str, *keys: str) -> float | None:
        path = artifacts / name
        if not path.is_file():
            return None
        value = json.loads(path.read_text())
        for key in keys:
            value = value.get(key, {}) if isinstance(value, dict) else {}
        return value if isinstance(value, (int, float)) else None

    parts = {
        "sampling": seconds("samples.json", "seconds"),
        "diagnostics": seconds("samples.json", "diagnostics", "seconds"),
        **{f"baseline {path.stem}": seconds(f"baselines/{path.name}", "seconds")
           for path in sorted((artifacts / "baselines").glob("*.json"))},
        "alignment": seconds("generator.json", "alignment", "seconds"),
        **{_distillation_part(path): seconds(path.name, "seconds")
           for path in sorted(artifacts.glob("generator*.json"), key=lambda p: (p.name != "generator.json", p.name))},
        "evaluation": seconds("eval/evaluate.json", "seconds"),
    }
    return {name: round(value, 2) for name, value in parts.items() if value is not None}


def _distillation_part(manifest: Path) -> str:
    """The part a generator's manifest times: its seed's training ("distillation" for seed 0,
    "distillation, seed1", …), or that of the seeds it trained with as one batch, named once for them all."""
    group = json.loads(manifest.read_text()).get("trained_with_seeds")
    if group is not None:
        return f"distillation, seeds {', '.join(map(str, group))} as one batch"
    seed = manifest.stem.removeprefix("generator").removeprefix("-")
    return f"distillation, {seed}" if seed else "distillation"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="pipelines/digits.toml")
    parser.add_argument("--out", type=Path, help="write the timing as JSON here")
    parser.add_argument("--artifacts", type=Path, help="a new directory for the artifacts, kept afterwards")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the stopped run whose record is --out and whose artifacts are --artifacts")
    parser.add_argument("--across-commits", action="store_true",
                        help="with --resume: go on at this commit though the run started at another")
    args = parser.parse_args()
    record = {"config": args.config, **run_header(), "stages": {}}
    if args.across_commits and not args.resume:
        parser.error("--across-commits goes with --resume")
    if args.resume:
        record = resumed_record(parser, args, record)
    elif args.artifacts is not None and args.artifacts.exists():
        parser.error(f"--artifacts {args.artifacts}: exists already; the timing starts from nothing")
    with contextlib.ExitStack() as stack:
        root = str(args.artifacts) if args.artifacts else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="apd-timing-"))
        record["unfinished"] = stopped_in = next(s for s in PIPELINE_STAGES if s not in record["stages"])
        write(record, args.out)
        for position, stage in enumerate(PIPELINE_STAGES):
            if stage in record["stages"]:
                continue
            again = ["--force"] if args.resume and stage == stopped_in else []  # timed whole, not from its checkpoint
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "apd", stage, "--config", args.config, "--artifacts", root,
                            "--quiet", *again], check=True)
            record["stages"][stage] = round(time.perf_counter() - t0, 2)
            record["parts"] = recorded_parts(next(Path(root).glob("*/samples.json")).parent)
            print(f"{stage}: {record['stages'][stage]:.1f} s", flush=True)
            if position + 1 < len(PIPELINE_STAGES):
                record["unfinished"] = PIPELINE_STAGES[position + 1]
                write(record, args.out)  # a run stopped later keeps the stages it finished
        del record["unfinished"]
        record["total"] = round(sum(record["stages"].values()), 2)
    for part, value in record["parts"].items():
        print(f"  {part}: {value:.1f} s")
    print(f"total: {record['total']:.1f} s ({record['total'] / 60:.2f} min)")
    write(record, args.out)
    if args.out:
        print(f"wrote {args.out}")
    return 0


def resumed_record(parser: argparse.ArgumentParser, args: argparse.Namespace, header: dict) -> dict:
    """The stopped run's record (``--out``), to go on with in its ``--artifacts`` at ``header``'s commit (another
    only with ``--across-commits``, then named in the resumption), with ``header``'s start and load average
    added to its resumptions; anything else is a parser error."""
    if args.out is None or args.artifacts is None or not args.out.is_file() or not args.artifacts.is_dir():
        parser.error("--resume needs --out, the stopped run's record, and --artifacts, its artifacts")
    record = json.loads(args.out.read_text())
    if "unfinished" not in record:
        parser.error(f"--resume: {args.out} is the record of a finished run")
    if record["config"] != args.config or (record["commit"] != header["commit"] and not args.across_commits):
        parser.error(f"--resume: {args.out} times {record['config']} at {record['commit']}, not "
                     f"{args.config} at {header['commit']} (--across-commits goes on at this commit)")
    resumption = {"stage": record["unfinished"], "started": header["started"],
                  "load_average_before": header["machine"]["load_average_before"]}
    if header["commit"] != record["commit"]:
        resumption["commit"] = header["commit"]
    return record | {"resumed": [*record.get("resumed", []), resumption]}


def write(record: dict, path: Path | None) -> None:
    """The record as JSON at ``path`` (nothing when it is None), replaced whole."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
