"""The study registry: the command line, ``apd report --docs`` and the list of studies in the docs iterate the
same rows, every function a row names exists, and every study module is in it."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest

from apd.cli import build_parser, main
from apd.docs import render_study, render_table, study_regions
from apd.experiments.studies import BY_NAME, STUDIES, resolve

ROOT = Path(__file__).resolve().parents[2]


def _experiment_parser() -> argparse.ArgumentParser:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices["experiment"]


def test_the_command_line_offers_every_study_with_its_help():
    parser = _experiment_parser()
    assert parser.description.endswith(": " + ", ".join(study.name for study in STUDIES))
    name = next(a for a in parser._actions if a.dest == "name")
    assert name.help == "; ".join(f"{study.name}: {study.help}" for study in STUDIES)


def test_an_unknown_study_is_one_line_and_exit_2(capsys):
    assert main(["experiment", "bogus", "--config", "digits"]) == 2
    err = capsys.readouterr().err
    assert err == f"apd experiment: error: unknown study 'bogus' (known: {', '.join(BY_NAME)})\n"


@pytest.mark.parametrize("study", STUDIES, ids=[study.name for study in STUDIES])
def test_every_function_a_row_names_exists(study):
    assert list(inspect.signature(resolve(study.run)).parameters) == ["ctx", "options"]
    assert len(inspect.signature(resolve(study.render)).parameters) == 1
    if study.summary is not None:
        assert len(inspect.signature(resolve(study.summary[1])).parameters) == 1


def test_every_study_module_is_registered():
    """A ``run_*(ctx, options)`` function of ``apd/experiments`` runs a study, and each is a row's."""
    runs = set()
    for path in (ROOT / "apd" / "experiments").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("run_") and [
                    arg.arg for arg in node.args.args] == ["ctx", "options"]:
                runs.add(f"apd.experiments.{path.stem}:{node.name}")
    assert runs == {study.run for study in STUDIES}


@pytest.mark.parametrize("study", STUDIES, ids=[study.name for study in STUDIES])
def test_the_docs_render_each_study_region_through_its_row(study):
    """Region TABLE of a study is its renderer on the published STEM.json; the docs' list names every study."""
    published = sorted((ROOT / "docs" / "results").glob(f"*/{study.stem}.json"))
    assert published, f"no published {study.stem}.json"
    pipeline = published[0].parent.name
    expected = resolve(study.render)(json.loads(published[0].read_text())).strip()
    assert render_study(pipeline, study.region, ROOT) == expected
    assert study.region in study_regions() and f"`apd experiment {study.name}`" in render_table("code", "studies", ROOT)


def test_region_names_that_are_no_study_are_left_to_the_other_tables():
    assert render_study("digits", "storage", ROOT) is None  # evaluate's storage table, not the study's
    assert render_study("digits", "modes-int4", ROOT) is None  # only a study with variants has them


@pytest.mark.parametrize(("name", "again"), [("frontier", "run the same command again to resume"),
                                             ("modes", "this study does not resume: the same command starts it over")])
def test_a_study_cut_short_says_whether_the_same_command_resumes_it(tiny_pipeline, tmp_path, monkeypatch, capsys,
                                                                   name, again):
    def cut_short(ctx, options):
        raise KeyboardInterrupt

    monkeypatch.setattr(BY_NAME[name].run.replace(":", "."), cut_short)  # module.function, as the CLI resolves it
    _, config = tiny_pipeline
    assert main(["experiment", name, "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == [f"apd experiment: interrupted; {again}"]


@pytest.mark.parametrize(("name", "each_part", "options"), [
    ("precision", "apd.experiments.precision.kept_row", ("budget=4", "steps=20", "precisions=['float32', 'int8']")),
    ("distillers", "apd.experiments.distillers.build",
     ("ranks=[4]", "residual_ranks=[]", "fitted_residual_ranks=[]", "kronecker_ranks=[]", "mog_components=[2]",
      "diagonal=false", "dense_steps=0", "subspace_steps=20")),
    ("storage", "apd.experiments.storage.judge_runs",
     ("mog_components=[1]", "ranks=[3]", "widths=[[8],[16]]", "steps=20", "peers=[]", "kept_sizes=[1,2]")),
])
def test_a_study_cut_short_takes_the_parts_it_finished_and_ends_as_an_uninterrupted_one(
        tiny_pipeline, tmp_path, monkeypatch, name, each_part, options):
    """A Ctrl-C in a study's second part (a precision's row, a distiller, a method of the storage study) keeps
    the parts before it in STEM.partial/ (the storage study's kept-samples curve too); the same command makes
    the rest and writes what an uninterrupted run writes, timings aside (the distillers share one stream of
    draws: a part taken sets it where making it left it)."""
    from tests.tiny_pipeline import copy_samples, without_timings

    module, function = each_part.rsplit(".", 1)
    real, made = getattr(importlib.import_module(module), function), []

    def making(*args, stop_at=None, **kwargs):
        if len(made) == stop_at:
            raise KeyboardInterrupt
        made.append(1)
        return real(*args, **kwargs)

    root, config = tiny_pipeline

    def argv(target):
        return ["experiment", name, "--config", str(config), "--artifacts", str(target), "--quiet",
                "--set", "evaluate.runs=1", *(arg for option in options for arg in ("--option", option))]

    for target in ("cut", "whole"):
        copy_samples(root, tmp_path / target)
    monkeypatch.setattr(each_part, lambda *a, **kw: making(*a, stop_at=1, **kw))
    assert main(argv(tmp_path / "cut")) == 130
    out = tmp_path / "cut" / "tiny" / "experiments"
    stem = BY_NAME[name].stem
    parts = 2 if name == "storage" else 1  # the first part (the storage study: its curve, then its first method)
    assert len(list((out / f"{stem}.partial").glob("*.json"))) == parts + 1  # and the key
    monkeypatch.setattr(each_part, making)
    assert main(argv(tmp_path / "cut")) == 0 and not (out / f"{stem}.partial").exists()
    resumed = len(made)
    assert main(argv(tmp_path / "whole")) == 0 and len(made) - resumed == resumed  # the resumed run took one part
    results = [json.loads((tmp_path / t / "tiny" / "experiments" / f"{stem}.json").read_text())
               for t in ("cut", "whole")]
    assert without_timings(results[0]) == without_timings(results[1])
