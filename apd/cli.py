"""Command line: ``apd sample|distill|evaluate|report|info --config PIPELINE`` (or ``python -m apd``), and
``apd experiment NAME --config PIPELINE`` for the studies in :mod:`apd.experiments`; PIPELINE is a TOML file
or the name of a pipeline shipped with the package (``digits``, the default: ``apd/pipelines/digits.toml``).

User errors (bad config, missing data, bad artifacts, divergence, a CUDA device that is not there or that
runs out of memory) end in one line on stderr and exit code 2; Ctrl-C exits with 130 (SIGTERM with 143)
and leaves every artifact resumable. This module imports neither torch nor the stages when it is imported:
:func:`main` takes over Ctrl-C and SIGTERM first (:mod:`apd.interrupts`) and imports them afterwards, so
that a Ctrl-C while torch is still being imported ends in the same one line. Those imports complete before
a Ctrl-C that came meanwhile raises: one raised inside an import that runs through native code (pybind11's
``exec``) leaves CPython to end the process by SIGINT whatever :func:`main` returns, and torch half-imported.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from apd._version import __version__
from apd.config import config_hash
from apd.config_load import load_config
from apd.errors import ApdError, ArtifactError, ConfigError, device_failures_are_errors
from apd.experiments.studies import BY_NAME, STUDIES, resolve, study
from apd.interrupts import (
    exit_code,
    ignore_signals,
    interrupted,
    interrupts_deferred,
    noting_interrupts,
    raise_if_interrupted,
)
from apd.pipeline.locks import artifact_lock

if TYPE_CHECKING:
    from apd.pipeline.runtime import RunContext

log = logging.getLogger("apd")
# Once the interpreter exits, a late Ctrl-C or SIGTERM could only cut its exit handlers short
atexit.register(ignore_signals)

# Stage commands: name → (module, function, help). Modules are imported only when their command runs.
STAGES = {
    "sample": ("apd.pipeline.sample", "run_sample", "SGLD posterior samples into HDF5, plus SGD and MC-dropout"),
    "distill": ("apd.pipeline.distill", "run_distill", "train the APD generator on the samples (WGAN-GP)"),
    "evaluate": ("apd.pipeline.evaluate", "run_evaluate", "compare every method; write tables and figures"),
    "report": ("apd.pipeline.report", "run_report", "re-render tables and figures from results.json"),
    "toy2d-figure": ("apd.pipeline.toy2d_figure", "run_toy2d_figure",
                     "2-D pipelines: each method's predictive and BALD over the plane (figures/toy2d.png)"),
}
READ_ONLY = ("info",)  # commands that only read: they take the artifact lock shared


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apd", description="Adversarial Posterior Distillation pipeline.")
    parser.add_argument("--version", action="version", version=f"apd {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default="digits",
                        help="pipeline: a TOML file, or a shipped pipeline's name (digits, fashion-fc1, …)")
    common.add_argument("--data-dir", help="directory with the dataset's IDX files (overrides the config)")
    common.add_argument("--device", help="cpu, cuda, cuda:N or auto (overrides the config)")
    common.add_argument("--artifacts", default="artifacts", help="root directory for artifacts")
    common.add_argument("--force", action="store_true", help="redo the stage even if it is complete")
    common.add_argument("--quiet", action="store_true",
                        help="no progress bars and no results printed: warnings and errors only")
    common.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (TOML syntax), e.g. --set distill.steps=5000")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        """A subcommand with the common options, ``help_text`` as its description and defaults in its help."""
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text[0].upper() + help_text[1:],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    for name, (_, _, help_text) in STAGES.items():
        stage = command(name, help_text)
        if name == "report":
            stage.add_argument("--docs", action="store_true",
                               help="render the results regions of README.md and docs/*.md from docs/results/")
            stage.add_argument("--check", action="store_true", help="with --docs: fail if a document would change")
            stage.add_argument("--publish", action="store_true", help="copy the pipeline's results JSON and figures "
                               "into docs/results/NAME/ and docs/figures/NAME/ (then `make docs`)")
    reproduce = command("reproduce", "run the pipeline afresh in ARTIFACTS/reproduce and compare its tables with "
                        "docs/results/NAME/results.json")
    reproduce.add_argument("--committed", help="results.json to compare with (None: docs/results/NAME/results.json)")
    command("info", "print the resolved config, data sizes and artifacts")
    experiment = command("experiment", "run a study on the pipeline's samples: " + ", ".join(BY_NAME))
    experiment.add_argument("name", metavar="NAME", help="; ".join(f"{s.name}: {s.help}" for s in STUDIES))
    experiment.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                            help="an experiment option (TOML syntax), e.g. --option max_seconds=600")
    return parser


def info(ctx: RunContext) -> None:
    """Print the resolved config, dataset sizes and shapes, the target net's size and artifacts present."""
    from apd.nets import ParamSpec

    cfg, data = ctx.cfg, ctx.data
    spec = ParamSpec.from_module(ctx.network())
    print(f"pipeline   {cfg.name}  ({cfg.source}, config hash {config_hash(cfg)})")
    print(f"device     {ctx.device}")
    print(f"dataset    {data.name}: " + ", ".join(f"{k} {v:,}" for k, v in data.sizes().items())
          + (f"; images {data.image_shape[0]}×{data.image_shape[1]}" if data.image_shape else
             f"; {data.num_features} features") + f", {data.num_classes} classes, "
          f"fingerprint {data.fingerprint()}")
    print(f"network    {spec.describe()}: {spec.numel:,} parameters")
    present = sorted(p for p in ctx.out_dir.rglob("*") if p.is_file()) if ctx.out_dir.is_dir() else []
    print(f"artifacts  {ctx.out_dir}: " + ("none yet" if not present else f"{len(present)} files"))
    for path in present:
        print(f"           {path.relative_to(ctx.out_dir)}  ({path.stat().st_size:,} bytes)")
    _print_leftovers(ctx, [path.relative_to(ctx.out_dir) for path in present])
    _print_sgld_diagnostics(ctx)
    _print_reference_stability(ctx)
    print("config     " + json.dumps(cfg.to_dict(), indent=2).replace("\n", "\n           "))


def docs(check: bool) -> int:
    """``apd report --docs``: render every marked results region; with ``check``, exit 1 on a difference."""
    from apd.docs import render_docs

    changed = render_docs(Path.cwd(), check=check)
    for path in changed:
        print(f"{path}: {'differs from its results' if check else 'rendered'}", file=sys.stderr)
    return 1 if check and changed else 0


def reproduce(ctx: RunContext, committed: str | None) -> int:
    """``apd reproduce``: 0 when every table cell matches the committed results, else 1 and the differences."""
    from apd.reproduce import run_reproduce

    path = Path(committed) if committed else Path("docs/results") / ctx.cfg.name / "results.json"
    lines, context = run_reproduce(ctx, path)
    for line in lines:
        print(line)
    print(f"{len(lines)} table cells differ from {path}" if lines else f"every table cell matches {path}")
    if lines:
        for line in context:
            print(line)
    return 1 if lines else 0


# Work in progress an interrupted stage leaves (``*.partial*`` files and folders, ``*.ckpt.pt`` checkpoints), by
# the first part of its path: the stage that finishes it
LEFTOVER = re.compile(r"\.partial(\.|$)|\.ckpt\.pt$")
FINISHED_BY = {"samples": "sample", "baselines": "sample", "generator": "distill", "eval": "evaluate",
              "adversarial": "evaluate", "experiments": "experiment"}


def _print_leftovers(ctx: RunContext, present: list[Path]) -> None:
    """Name the work in progress of an interrupted run among ``present`` (paths in the artifact folder) and
    the command that finishes it."""
    leftovers: dict[str, set[str]] = {}
    for path in present:
        part = next((p for p in path.parts if LEFTOVER.search(p)), None)
        stage = FINISHED_BY.get(re.split(r"[-.]", path.parts[0])[0])
        if part is not None and stage is not None:
            leftovers.setdefault(stage, set()).add(str(Path(*path.parts[:path.parts.index(part) + 1])))
    where = "" if ctx.artifacts_root == Path("artifacts") else f" --artifacts {ctx.artifacts_root}"
    for stage, names in leftovers.items():
        command = f"apd {stage} --config {ctx.cfg.source}{where}"
        if stage == "experiment":  # a study's options are not in its folder's name
            print(f"interrupted {', '.join(sorted(names))}: run the `apd experiment` command that was cut short "
                  "again to finish it (--force starts over)")
            continue
        print(f"interrupted {', '.join(sorted(names))}: run `{command}` to finish it (where the stage is "
              "complete, a run with --force was stopped: that keeps the complete one, --force starts over)")


def _print_sgld_diagnostics(ctx: RunContext) -> None:
    """The convergence diagnostics and the samples' digest recorded in the sample manifest, when there is one."""
    from apd.io import read_json
    from apd.pipeline.layout import manifest_of
    from apd.samplers.diagnostics import summary_lines

    manifest = manifest_of(ctx.layout.samples)
    if not manifest.is_file():
        return
    try:
        record = read_json(manifest)
        summary = record.get("diagnostics")
        if summary is None:
            return
        lines = summary_lines(summary)
        if summary.get("warning"):
            lines.append("warning: " + str(summary["warning"]))
    except ArtifactError as exc:
        print(f"sgld       {exc}")
        return
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:  # a manifest edited by hand
        print(f"sgld       {manifest}: not diagnostics this apd wrote ({type(exc).__name__}: {exc})")
        return
    print(f"sgld       {record.get('chains', 1)} chain(s) on {record.get('workers', 1)} worker(s); " + lines[0])
    for line in lines[1:]:
        print("           " + line.strip())
    if record.get("samples_digest"):
        print(f"           samples' digest {record['samples_digest']} (equal for the same samples in any file)")


def _print_reference_stability(ctx: RunContext) -> None:
    """Whether the reference's numbers are settled, from the evaluation's results, when there are some."""
    from apd.io import read_json
    from apd.pipeline.tables import stability_verdict

    if not ctx.layout.results.is_file():
        return
    try:
        stability = read_json(ctx.layout.results).get("reference_stability")
    except ArtifactError as exc:
        print(f"reference  {exc}")
        return
    if stability:
        print(f"reference  {stability_verdict(stability)}")


def _takes_lock(command: str) -> bool:
    """Every command takes the artifact lock, except the ``apd sample`` processes of a torchrun launch other
    than rank 0 (rank 0 holds it for them all; each writes only its own shard)."""
    from apd.pipeline.distributed import torchrun_env

    env = torchrun_env()
    return not (command == "sample" and env is not None and env.rank != 0)


def _study_that_starts_over(args: argparse.Namespace | None) -> bool:
    """Whether ``args`` ran a study that does not resume a run cut short (:attr:`Study.resumes`)."""
    chosen = BY_NAME.get(getattr(args, "name", None)) if getattr(args, "command", None) == "experiment" else None
    return chosen is not None and not chosen.resumes


def main(argv: list[str] | None = None) -> int:
    with noting_interrupts():  # first of all: from here on, Ctrl-C and SIGTERM end in one line
        name, args = "apd", None
        try:
            for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show a character gets its escape
                with contextlib.suppress(AttributeError, ValueError):
                    stream.reconfigure(errors="backslashreplace")
            args = build_parser().parse_args(argv)
            name = f"apd {args.command}"
            code = run(args)
            raise_if_interrupted()  # a Ctrl-C swallowed after the last safe point still ends in exit 130
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) or interrupted():  # C extensions may turn Ctrl-C into another error
                how = "interrupted" if exit_code() == 130 else "stopped by SIGTERM"
                again = ("the same command without --force resumes it (or, where the stage was complete, keeps "
                         "that; --force starts over)" if getattr(args, "force", False) else
                         "run the same command again to resume")
                if _study_that_starts_over(args):
                    again = "this study does not resume: the same command starts it over"
                print(f"{name}: {how}; {again}", file=sys.stderr)
                return _leaving(exit_code())
            if isinstance(exc, ApdError):
                print(f"{name}: error: {_one_line(exc)}", file=sys.stderr)
                return _leaving(2)
            if isinstance(exc, OSError):  # full disk, read-only file system, unreadable file
                where = f": {exc.filename}" if exc.filename else ""
                print(f"{name}: error: {_one_line(exc.strerror or exc)}{where}; complete artifacts "
                      "are unchanged", file=sys.stderr)
                return _leaving(2)
            raise
    return code


def run(args: argparse.Namespace) -> int:
    """The command ``args`` names, under the artifact lock; its exit code."""
    chosen = study(args.name) if args.command == "experiment" else None  # an unknown study: before any work
    with interrupts_deferred():  # torch is imported whole (module docstring)
        import torch

        from apd.pipeline.runtime import RunContext, make_current, setup_logging
    setup_logging(args.quiet)
    if args.command == "report" and args.docs:
        return docs(args.check)
    if args.command == "reproduce":
        args.artifacts = str(Path(args.artifacts) / "reproduce")
    ctx = RunContext(cfg=load_config(args.config, args.set), artifacts_root=Path(args.artifacts),
                     data_dir=args.data_dir, device_name=args.device, force=args.force, quiet=args.quiet)
    if ctx.cfg.threads:
        torch.set_num_threads(ctx.cfg.threads)
    if ctx.artifacts_root.exists() and not ctx.artifacts_root.is_dir():
        raise ArtifactError(f"--artifacts {ctx.artifacts_root}: not a directory")
    lock = artifact_lock(ctx.layout.lock, shared=args.command in READ_ONLY) if _takes_lock(args.command) \
        else contextlib.nullcontext()
    with lock, device_failures_are_errors(args.command, ctx.device):
        make_current(ctx.device)  # a busy card may fail here (CUDA 12 creates the card's context on choosing it)
        if args.command == "info":
            info(ctx)
        elif args.command == "reproduce":
            return reproduce(ctx, args.committed)
        elif args.command == "report" and args.publish:
            from apd.docs import publish

            for path in publish(ctx.layout, ctx.cfg.name, Path.cwd()):
                print(f"published {path.relative_to(Path.cwd())}")
        elif chosen is not None:
            if ctx.cfg.net.conv and not chosen.cnn_ok:
                raise ConfigError(f"{ctx.cfg.source}: `apd experiment {args.name}` is for MLPs; on a network "
                                  f"with 'net.conv' run {', '.join(s.name for s in STUDIES if s.cnn_ok)}")
            with interrupts_deferred():  # imported whole (module docstring)
                run_study = resolve(chosen.run)
            run_study(ctx, args.option)
        else:
            module, function, _ = STAGES[args.command]
            getattr(_imported(module), function)(ctx)
    return 0


def _imported(module: str) -> ModuleType:
    """``module``, imported whole even when a Ctrl-C comes meanwhile (it raises afterwards; module docstring)."""
    with interrupts_deferred():
        return importlib.import_module(module)


def _leaving(code: int) -> int:
    """``code``; and where HDF5 failed to write (a disk that filled under a store), the process is made
    to exit with it straight after the interpreter's exit handlers, before its final clean-up frees the
    broken HDF5 handles, which can crash it (:func:`apd.samplers.store_disk.hdf5_write_failed`)."""
    disk = sys.modules.get("apd.samplers.store_disk")
    if disk is not None and disk.hdf5_write_failed():
        atexit.register(_exit_now, code)
    return code


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _one_line(message: object) -> str:
    """A message on one line (HDF5's, for one, span several)."""
    return " ".join(str(message).split())
