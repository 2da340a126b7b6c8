"""Generated results regions: rendering, the paper's data file, staleness, and the reproduce comparison."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from apd.cli import main
from apd.docs import documents, render_docs, render_document, render_table
from apd.errors import ArtifactError
from apd.reproduce import differences, where_they_part
from tests.report_helpers import full_results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path):
    """A project root with one pipeline's committed results and the paper's data file."""
    (tmp_path / "docs" / "results" / "demo").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "demo" / "results.json").write_text(json.dumps(full_results()))
    (tmp_path / "docs" / "paper-numbers.json").write_text((ROOT / "docs" / "paper-numbers.json").read_text())
    return tmp_path


def test_regions_are_rendered_and_prose_is_left_alone(project):
    text = ("Prose with 1.23 stays.\n<!-- results:demo:storage -->\nstale 9.99\n<!-- end -->\nMore prose.\n"
            "<!-- results:paper:accuracy -->\n<!-- end -->\n")
    rendered = render_document(text, project)
    assert rendered.startswith("Prose with 1.23 stays.\n<!-- results:demo:storage -->\n| method |")
    assert "stale 9.99" not in rendered and "| APD | 1,670,000 | 6.4 MiB | 21 |" in rendered
    assert "More prose.\n" in rendered
    assert "| fcNN1 784-100-10 | 0.973 | 0.979 | 0.978 |" in rendered
    assert render_document(rendered, project) == rendered  # rendering twice changes nothing


def test_one_score_block_and_paper_tables(project):
    bald = render_table("demo", "ood-bald", project)
    assert "### Score: BALD" in bald and "variation ratio" not in bald
    assert "| notMNIST | 55.4 / 60.9 / 48.3 | 88.0 / 87.2 / 82.1 | 98.1 / 97.8 / 98.3 | 97.8 / 97.4 / 98.1 |" in (
        render_table("paper", "ood-max_prob", project))
    assert "| SGLD | PGD | 56.91 | 84.98 | 82.80 |" in render_table("paper", "adversarial", project)
    with pytest.raises(ArtifactError, match="unknown results table 'bogus'"):
        render_table("demo", "bogus", project)


def test_check_reports_a_stale_document_and_writing_fixes_it(project):
    (project / "README.md").write_text("<!-- results:demo:timing -->\nold\n<!-- end -->\n")
    assert render_docs(project, check=True) == [project / "README.md"]
    assert "old" in (project / "README.md").read_text()  # --check writes nothing
    assert render_docs(project) == [project / "README.md"]
    assert render_docs(project, check=True) == []


def test_a_results_file_that_does_not_render_leaves_every_document_as_it_was(project):
    (project / "README.md").write_text("<!-- results:demo:timing -->\nold\n<!-- end -->\n")
    (project / "docs" / "a.md").write_text("<!-- results:demo:storage -->\nold\n<!-- end -->\n")
    (project / "docs" / "b.md").write_text("<!-- results:broken:precision -->\nold\n<!-- end -->\n")
    (project / "docs" / "results" / "broken").mkdir()
    (project / "docs" / "results" / "broken" / "precision.json").write_text("{")
    before = {path: path.read_text() for path in documents(project)}
    with pytest.raises(ArtifactError, match="precision.json: not valid JSON"):
        render_docs(project)
    assert {path: path.read_text() for path in documents(project)} == before
    assert sorted(p.name for p in project.rglob("*.tmp")) == []


def test_inline_values_are_rendered_from_results_files_with_their_formats(project):
    results = project / "docs" / "results" / "demo"
    (results / "samples.json").write_text(json.dumps({"burn_in": {"burn_in": 1990, "rhat": 1.04191},
                                                      "seconds": [12.0, 3725.4], "name": "fcNN1",
                                                      "kept": {"29 int4": {"k": 29, "gap": 1.25}}}))
    text = ("Dropped <!-- value:demo:samples.burn_in.burn_in -->old<!-- /value --> samples, R-hat "
            "<!-- value:demo:samples.burn_in.rhat:.3f --><!-- /value -->, in "
            "<!-- value:demo:samples.seconds.1:duration -->1 h<!-- /value --> on "
            "<!-- value:demo:samples.name -->x<!-- /value -->, accuracy "
            "<!-- value:demo:results.accuracy.apd.acc.mean:.1% -->90 %<!-- /value -->; a key with spaces: "
            "<!-- value:demo:samples.kept.29 int4.k --><!-- /value -->, "
            "<!-- value:demo:samples.kept.29 int4.gap:.1f --><!-- /value -->.\n")
    rendered = render_document(text, project)
    percent = 100 * json.loads((results / "results.json").read_text())["accuracy"]["apd"]["acc"]["mean"]
    assert rendered == ("Dropped <!-- value:demo:samples.burn_in.burn_in -->1,990<!-- /value --> samples, R-hat "
                        "<!-- value:demo:samples.burn_in.rhat:.3f -->1.042<!-- /value -->, in "
                        "<!-- value:demo:samples.seconds.1:duration -->1 h 2 min<!-- /value --> on "
                        "<!-- value:demo:samples.name -->fcNN1<!-- /value -->, accuracy "
                        f"<!-- value:demo:results.accuracy.apd.acc.mean:.1% -->{percent:.1f} %<!-- /value -->; "
                        "a key with spaces: <!-- value:demo:samples.kept.29 int4.k -->29<!-- /value -->, "
                        "<!-- value:demo:samples.kept.29 int4.gap:.1f -->1.2<!-- /value -->.\n")
    assert render_document(rendered, project) == rendered


@pytest.mark.parametrize(("value", "message"), [
    ("samples.burn_in.rhat", "field 'burn_in.rhat': missing or of the wrong type for value 'samples.burn_in.rhat' "
                             "(TypeError: a float needs a format (:SPEC))"),
    ("samples.burn_in.steps", "field 'burn_in.steps': missing or of the wrong type"),
    ("samples.seconds.2:.1f", "field 'seconds': missing or of the wrong type for value 'samples.seconds.2' (Index"),
])
def test_an_inline_value_that_cannot_be_rendered_is_one_error_naming_file_and_field(project, value, message):
    path = project / "docs" / "results" / "demo" / "samples.json"
    path.write_text(json.dumps({"burn_in": {"rhat": 1.04191}, "seconds": [12.0, 3725.4]}))
    with pytest.raises(ArtifactError) as err:
        render_document(f"R-hat <!-- value:demo:{value} -->1.04<!-- /value -->\n", project)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


@pytest.mark.parametrize(("file", "change", "table", "field"), [
    ("results.json", lambda d: d.update(machine=5), "machine", "'machine'"),
    ("results.json", lambda d: d["accuracy"]["apd"]["acc"].update(mean="high"), "accuracy", "'accuracy.apd.acc.mean'"),
    ("samples.json", lambda d: d.pop("diagnostics"), "diagnostics", "'diagnostics'"),
])
def test_a_field_of_the_wrong_type_is_one_error_naming_file_and_field(project, file, change, table, field):
    path = project / "docs" / "results" / "demo" / file
    data = json.loads(path.read_text()) if path.is_file() else {"diagnostics": {}}
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as err:
        render_document(f"<!-- results:demo:{table} -->\n<!-- end -->\n", project)
    assert str(err.value).startswith(f"{path}: field {field}: missing or of the wrong type")


def test_committed_documents_match_the_committed_results():
    """README.md and docs/*.md are exactly what `make docs` renders from docs/results/."""
    assert render_docs(ROOT, check=True) == []


def test_every_published_choice_of_distiller_names_the_machine_store_and_training_it_was_judged_on():
    """A pipeline's choice.json (benchmarks/choose_distiller.py --json) records where the one rule was applied,
    so that its page need not say it: the machine, the digests of the store's files and of its samples, and
    the machine and thread count each candidate's generator was trained on (a GAN trained on another number
    of threads can come out another generator)."""
    records = sorted((ROOT / "docs" / "results").glob("*/choice.json"))
    assert records
    for path in records:
        record = json.loads(path.read_text())
        made = record.get("provenance") or {}
        assert made.get("machine", {}).get("cpu") and made.get("store_files") and made.get("store_samples"), path
        assert all((row.get("trained_on") or {}).get("threads") for row in record["rows"]), path


def test_reproduce_lists_the_cells_that_differ_at_printed_precision():
    committed = full_results()
    same = copy.deepcopy(committed)
    same["accuracy"]["sgld"]["acc"]["mean"] += 1e-6  # below the printed 4 decimals
    same["timing"]["total"] = 999.0  # timings are not compared
    assert differences(committed, same) == []
    changed = copy.deepcopy(committed)
    changed["accuracy"]["sgld"]["acc"]["mean"] = 0.5
    lines = differences(committed, changed)
    assert len(lines) == 1 and "accuracy" in lines[0] and "'0.9760 ± 0.0012'" in lines[0]


def test_reproduce_says_whether_the_samples_or_the_machine_part_the_runs():
    machine = {"cpu": "Xeon", "cores": 2, "threads": 2, "torch": "2.13.0+cpu", "device": "cpu"}
    committed = {**full_results(), "samples_digest": "ab12", "machine": machine}
    same_samples = {**committed, "machine": {**machine, "threads": 1}}
    assert where_they_part(committed, same_samples) == [
        "samples: the same as the committed ones (digest ab12); the differences arise after sampling",
        "machine: threads 2 → 1"]
    other = {**committed, "samples_digest": "cd34"}
    assert where_they_part(committed, other) == [
        "samples: not the committed ones (digest cd34, committed ab12); the differences start in sampling",
        "machine: the committed results' processor, threads and torch"]
    older = {key: value for key, value in committed.items() if key not in ("samples_digest", "machine")}
    assert where_they_part(older, other)[0].startswith("samples: not comparable")
    assert where_they_part(older, other)[1].startswith("machine: cores ? → 2; cpu ? → Xeon")


def test_reproduce_names_the_intel_kernels_where_samples_made_with_them_were_not_made_again():
    """Samples made on an Intel processor (or recorded with MKL's Intel kernels) and not made again by a run
    without those kernels: the list names `KERNELS=intel`; with them, or with the same samples, it does not."""
    xeon = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "threads": 1, "torch": "2.13.0+cpu", "device": "cpu"}
    committed = {**full_results(), "samples_digest": "ab12", "machine": xeon}
    amd = {**xeon, "cpu": "AMD EPYC", "kernels": "MKL non-Intel, OpenBLAS Haswell"}
    other_samples = {**committed, "samples_digest": "cd34", "machine": amd}
    assert "KERNELS=intel" in where_they_part(committed, other_samples)[-1]
    told_intel = {**other_samples, "machine": {**amd, "kernels": "MKL Intel, OpenBLAS SkylakeX"}}
    assert len(where_they_part(committed, told_intel)) == 2
    assert len(where_they_part(committed, {**other_samples, "samples_digest": "ab12"})) == 2
    recorded = {**committed, "machine": {**amd, "kernels": "MKL Intel, OpenBLAS SkylakeX"}}
    assert "KERNELS=intel" in where_they_part(recorded, other_samples)[-1]
    assert len(where_they_part({**committed, "machine": amd}, other_samples)) == 2


def test_apd_reproduce_runs_the_pipeline_afresh_and_matches_its_own_results(tiny_pipeline, tmp_path, capsys):
    """`apd reproduce` against the tiny pipeline's results: a run afresh in ARTIFACTS/reproduce, on the same
    machine, matches every table cell (exit 0) from the same samples; one cell changed in the committed file is
    named (exit 1)."""
    root, config = tiny_pipeline
    committed = root / "tiny" / "eval" / "results.json"
    args = ["reproduce", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]
    assert main([*args, "--committed", str(committed)]) == 0
    assert (tmp_path / "reproduce" / "tiny" / "eval" / "results.json").is_file()
    assert f"every table cell matches {committed}" in capsys.readouterr().out
    changed = json.loads(committed.read_text())
    changed["accuracy"]["sgld"]["acc"]["mean"] = 0.5
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    assert main([*args, "--committed", str(tmp_path / "changed.json")]) == 1
    out = capsys.readouterr().out
    assert "1 table cells differ" in out and "samples: the same as the committed ones" in out


def test_publish_copies_results_and_manifests_but_no_samples_or_weights(tiny_pipeline, tmp_path, monkeypatch):
    root, config = tiny_pipeline
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--publish", "--config", str(config), "--artifacts", str(root), "--quiet"]) == 0
    name = json.loads((root / "tiny" / "eval" / "results.json").read_text())["pipeline"]
    published = {p.name for p in (tmp_path / "docs" / "results" / name).iterdir()}
    assert {"results.json", "samples.json", "generator.json", "evaluate.json"} <= published
    assert not any(p.endswith((".h5", ".pt")) for p in published)
    assert (tmp_path / "docs" / "results" / name / "results.json").read_bytes() == (
        root / "tiny" / "eval" / "results.json").read_bytes()
    assert any((tmp_path / "docs" / "figures" / name).glob("*.png"))


def test_publish_removes_an_evaluation_figure_this_evaluation_did_not_draw(tmp_path):
    """An evaluation figure published before (``stale``) and not drawn by the evaluation published now is
    removed; what the evaluation drew, and the other figures of the folder (a study's), are copied or kept."""
    from apd import docs
    from apd.pipeline.layout import Layout

    layout = Layout(tmp_path / "art")
    (layout.eval_dir / "figures").mkdir(parents=True)
    (layout.root / "samples.json").write_text("{}")
    layout.results.write_text("{}")
    (layout.eval_dir / "figures" / "reliability.png").write_bytes(b"drawn")
    published = tmp_path / "docs" / "figures" / "demo"
    published.mkdir(parents=True)
    for stem in ("storage_share", "reliability", "modes"):
        (published / f"{stem}.png").write_bytes(b"stale")
    docs.publish(layout, "demo", tmp_path)
    assert sorted(p.name for p in published.iterdir()) == ["modes.png", "reliability.png"]
    assert (published / "reliability.png").read_bytes() == b"drawn"


def test_publishing_an_evaluation_without_figures_is_one_clear_error(tmp_path):
    from apd import docs
    from apd.pipeline.layout import Layout

    layout = Layout(tmp_path / "art")
    layout.eval_dir.mkdir(parents=True)
    (layout.root / "samples.json").write_text("{}")
    layout.results.write_text("{}")
    with pytest.raises(ArtifactError, match="drew no figures; run `apd report` first"):
        docs.publish(layout, "demo", tmp_path)
    assert not (tmp_path / "docs").exists()


def test_publish_before_sampling_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--publish", "--config", str(ROOT / "pipelines" / "digits.toml"),
                 "--artifacts", str(tmp_path / "none"), "--quiet"]) == 2
    assert "run `apd sample` first" in capsys.readouterr().err


def test_diagnostics_come_from_the_sample_manifest_alone(project):
    """A pipeline whose evaluation has not run yet can still show its chains' convergence."""
    (project / "docs" / "results" / "demo" / "results.json").unlink()
    manifest = {"diagnostics": {"chains_used": 4, "draws_per_chain": 500, "warning": None, "families": {
        "function": {"quantities": 300, "rhat_median": 1.002, "rhat_max": 1.014, "frac_rhat_above_1.01": 0.017,
                     "frac_rhat_above_1.05": 0.0, "ess_bulk_median": 896.3, "ess_bulk_min": 539.3,
                     "ess_tail_median": 1451.1}}}}
    (project / "docs" / "results" / "demo" / "samples.json").write_text(json.dumps(manifest))
    table = render_table("demo", "diagnostics", project)
    assert table.startswith("4 chains × 500 draws each; no convergence warning")
    assert r"| p(y \| x) on validation inputs | 300 | 1.002 | 1.014 | 1.7 | 0.0 | 896 | 539 | 1,451 |" in table


def test_samplers_put_several_pipelines_sample_manifests_side_by_side(project):
    """One row per pipeline named in the region, each from that pipeline's sample manifest alone."""
    def manifest(rhat: float, ess: float, accuracy: float) -> dict:
        family = {"quantities": 300, "rhat_median": rhat, "rhat_max": rhat + 0.5, "frac_rhat_above_1.01": 1.0,
                  "frac_rhat_above_1.05": 0.25, "ess_bulk_median": ess, "ess_bulk_min": 1.0, "ess_tail_median": 2 * ess}
        return {"samples": 4000, "seconds": 600.0, "monitor_ensemble_val_accuracy": accuracy,
                "diagnostics": {"chains_used": 4, "draws_per_chain": 500,
                                "families": {"function": family, "log_lik": family, "weight_pcs": family}}}
    for name, values in {"slow": (1.154, 19.0, 0.891), "fast": (1.051, 60.4, 0.9)}.items():
        (project / "docs" / "results" / name).mkdir(parents=True)
        (project / "docs" / "results" / name / "samples.json").write_text(json.dumps(manifest(*values)))
    document = "<!-- results:slow,fast:samplers -->\nold\n<!-- end -->\n"
    rows = [line for line in render_document(document, project).splitlines() if line.startswith("| `")]
    assert rows == [
        r"| `slow` | 4 × 500 | 4,000 | 10 min 0 s | 1.154 / 1.654 | 100.0 | 25.0 | 19 | 38 | 1.154, 19 | 1.15, 19 "
        r"| 0.8910 |",
        r"| `fast` | 4 × 500 | 4,000 | 10 min 0 s | 1.051 / 1.551 | 100.0 | 25.0 | 60 | 121 | 1.051, 60 | 1.05, 60 "
        r"| 0.9000 |"]


def test_standing_sets_each_pipelines_reference_beside_apds_percentile_ranks(project):
    """A row for each set of kept samples stored as compactly as APD (rounded whole at its precision, and about
    their chains' means where the results have them; float32 where APD has no lower precision): the pipeline's
    chains, ESS and split halves beside each seed's percentile ranks against them; the AUROC and NLL ranks of
    an evaluation written before gaps per draw starred, and the star explained under the table."""
    around = "13 int8 around chain means at int8"

    def pipeline(name: str, chains: int, ess: float, stored: tuple[str, ...], stability: bool) -> None:
        family = {"ess_bulk_median": ess}
        ranks, other, third = ({key: {"values": values} for key in ("bald_gap", "max_prob_gap", "nll_gap", "kl")}
                               for values in ([0.0, 4.5, 100.0], [1.0, 1.0, 1.0], [2.0, 0.5, 96.0]))
        equal = {"k": 4, **({"at_precision": {"key": "15 int8"}} if stored else {}),
                 **({"around_means": {"key": around}} if around in stored else {})}
        against = {"4": {"percentile": other if stored else ranks}, "15 int8": {"percentile": ranks},
                   around: {"percentile": third}}
        results = {"storage": {"apd": {"in_sgld_samples": 3.796}}, "yardstick": {"equal_storage": {"apd": equal}},
                   "replicates": {"apd": {"seeds": 3, "against": against}},
                   "quality": {"apd": {"set_gaps": {}} if stability else {}}}  # the older one: no gaps per draw
        if stability:
            results["reference_stability"] = {"split_half": {"max_auroc_gap": 0.509, "nll_gap": 0.00074}}
        folder = project / "docs" / "results" / name
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps(results))
        (folder / "samples.json").write_text(json.dumps(
            {"diagnostics": {"chains_used": chains, "families": {"function": family}}}))
    pipeline("many", 64, 111.2, ("15 int8", around), stability=True)
    pipeline("rounded", 2, 15.0, ("15 int8",), stability=True)
    pipeline("few", 4, 897.6, (), stability=False)
    document = "<!-- results:many,rounded,few:standing -->\nold\n<!-- end -->\n"
    rendered = render_document(document, project).splitlines()
    rows = [line for line in rendered if line.startswith("| `")]
    ranks, starred = " | 0.0 / 4.5 / 100.0" * 4, " | 0.0 / 4.5 / 100.0 *" * 3 + " | 0.0 / 4.5 / 100.0"
    assert rows == [f"| `many` | 64 | 111 | 0.51 points, 0.0007 nats | 3.8 | 15 int8 | 3{ranks} |",
                    f"| `many` | 64 | 111 | 0.51 points, 0.0007 nats | 3.8 | {around} | 3"
                    + " | 2.0 / 0.5 / 96.0" * 4 + " |",
                    f"| `rounded` | 2 | 15 | 0.51 points, 0.0007 nats | 3.8 | 15 int8 | 3{ranks} |",
                    f"| `few` | 4 | 898 | — | 3.8 | 4 | 3{starred} |"]
    assert any(line.startswith("\\* An evaluation written before gaps per draw") for line in rendered)


def test_performance_table_is_rendered_from_the_benchmark_records(project):
    """docs/performance.md's rows come from the bench scripts' JSON records (benchmarks/record.py), in the
    pipeline's stage order (file order within a stage), followed by where and when each script ran."""
    folder = project / "docs" / "results" / "benchmarks"
    folder.mkdir()
    machine = {"cpu": "Some CPU", "cores": 2, "load_average_before": [0.1, 0.25, 1.0]}
    for name, stage, rows in (("a", "evaluate", [{"what": "prediction", "measured": "2.00×", "target": ""}]),
                              ("b", "sample", [{"what": "step ratio", "measured": "1.21", "target": "≤ 1.3"},
                                               {"what": "same, 2 threads", "measured": "1.40", "target": ""}]),
                              ("c", "sample", [{"what": "append", "measured": "1.8 %", "target": "≤ 5 %"}])):
        (folder / f"{name}.json").write_text(json.dumps(
            {"command": f"bench_{name}.py --out x.json", "stage": stage, "commit": "0123456789abcdef",
             "started": "2026-11-26T12:00:00", "machine": machine, "rows": rows}))
    lines = render_table("benchmarks", "performance", project).splitlines()
    assert lines[:6] == ["| stage | what | measured | target |", "|---|---|---|---|",
                         "| `apd sample` | step ratio | 1.21 | ≤ 1.3 |", "| `apd sample` | same, 2 threads | 1.40 |  |",
                         "| `apd sample` | append | 1.8 % | ≤ 5 % |", "| `apd evaluate` | prediction | 2.00× |  |"]
    run = " | `0123456789ab` | Some CPU (2 cores) | 0.10, 0.25, 1.00 | 2026-11-26 |"
    assert lines[-3:] == [f"| `bench_{name}.py --out x.json`" + run for name in "bca"]
    for path in folder.iterdir():
        path.unlink()
    with pytest.raises(ArtifactError, match="no benchmark records"):
        render_table("benchmarks", "performance", project)


def test_benchmark_record_holds_the_run_and_its_rows(tmp_path, monkeypatch):
    """``BenchmarkRecord`` writes the command, the machine and the rows a script adds; nothing without --out."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_demo.py", "--reps", "3"])
    from record import BenchmarkRecord

    with pytest.raises(ValueError, match="stage must be one of sample, distill, evaluate"):
        BenchmarkRecord("train")
    record = BenchmarkRecord("distill")
    record.add("a ratio", "1.50×", "≥ 1.3×")
    record.write(None)
    assert not list(tmp_path.iterdir())
    record.write(tmp_path / "sub" / "demo.json")
    written = json.loads((tmp_path / "sub" / "demo.json").read_text())
    assert written["command"] == "bench_demo.py --reps 3" and written["script"] == "bench_demo.py"
    assert written["stage"] == "distill"
    assert written["rows"] == [{"what": "a ratio", "measured": "1.50×", "target": "≥ 1.3×"}]
    assert len(written["machine"]["load_average_before"]) == 3 and written["machine"]["cores"] >= 1


def test_end_to_end_timing_is_rendered_from_its_record(project):
    """docs/performance.md's end-to-end row comes from benchmarks/time_pipeline.py's JSON, never typed by hand."""
    record = {"config": "pipelines/digits.toml", "commit": "0123456789abcdef+changes",
              "machine": {"cpu": "Some CPU", "cores": 2, "load_average_before": [0.05, 0.5, 1.0]},
              "stages": {"sample": 125.0, "distill": 41.5, "evaluate": 112.25}, "total": 278.75,
              "parts": {"sampling": 86.7, "evaluation": 95.4}}
    (project / "docs" / "results" / "demo" / "end_to_end.json").write_text(json.dumps(record))
    table = render_table("demo", "end-to-end", project)
    assert table.startswith("`pipelines/digits.toml` at commit `0123456789ab+changes` on Some CPU (2 cores); "
                            "load average before the run 0.05, 0.50, 1.00;")
    assert "Recorded by the stages: sampling 1 min 27 s; evaluation 1 min 35 s." in table
    assert "| `apd sample` | 2 min 5 s |" in table
    assert "| total | **4 min 39 s** |" in table
    # resumed at the same commit, then at another: only the other is named
    record["resumed"] = [{"stage": "distill", "started": "2026-12-01T01:00:00+00:00", "load_average_before": [0.2]},
                         {"stage": "evaluate", "started": "2026-12-01T02:00:00+00:00", "load_average_before": [0.3],
                          "commit": "fedcba9876543210"}]
    (project / "docs" / "results" / "demo" / "end_to_end.json").write_text(json.dumps(record))
    table = render_table("demo", "end-to-end", project)
    assert table.startswith("`pipelines/digits.toml` at commit `0123456789ab+changes`, `apd evaluate` resumed at "
                            "`fedcba987654` on Some CPU (2 cores);")
    del record["resumed"]
    # on a GPU, a run stopped before its last stage: the card is named and the missing total said
    del record["total"]
    record["machine"]["gpu"] = "Some GPU"
    record["unfinished"] = "evaluate"
    del record["stages"]["evaluate"]
    (project / "docs" / "results" / "demo" / "end_to_end.json").write_text(json.dumps(record))
    table = render_table("demo", "end-to-end", project)
    assert " on Some GPU with Some CPU (2 cores);" in table
    assert "| total | not reached: the run stopped before `apd evaluate` finished |" in table


def test_pipelines_timed_end_to_end_are_rendered_side_by_side_with_their_targets(project):
    """The README's durations: one row per results folder, the target of a CPU-only pipeline and whether its
    total met it; a run stopped midway misses its target, a GPU run has none, a folder without a record says so."""
    from apd.docs import END_TO_END_TARGETS

    cpu = {"cpu": "Some CPU", "cores": 2, "load_average_before": [0.0, 0.0, 0.0]}
    records = {"fashion-fc1": {"machine": cpu, "stages": {"sample": 500.0, "distill": 300.0, "evaluate": 99.0},
                               "total": 899.0},
               "fashion-fc2": {"machine": cpu, "stages": {"sample": 1300.0}, "unfinished": "distill"},
               "fashion-lenet5": {"machine": {**cpu, "gpu": "Some GPU"}, "stages": {"sample": 60.0, "distill": 60.0,
                                                                                   "evaluate": 60.0}, "total": 180.0}}
    for name, record in records.items():
        (project / "docs" / "results" / name).mkdir(parents=True, exist_ok=True)
        (project / "docs" / "results" / name / "end_to_end.json").write_text(json.dumps(record))
    assert END_TO_END_TARGETS["fashion-fc1"] == 900
    rows = render_table("fashion-fc1,fashion-fc2,fashion-lenet5,nowhere", "durations", project).splitlines()[2:]
    assert rows == [
        "| `fashion-fc1` | Some CPU, 2 cores | 8 min 20 s | 5 min 0 s | 1 min 39 s | **14 min 59 s** | ≤ 15 min "
        "| — | met |",
        "| `fashion-fc2` | Some CPU, 2 cores | 21 min 40 s | — | — | stopped in `apd distill` | ≤ 20 min | — "
        "| not met |",
        "| `fashion-lenet5` | Some GPU | 1 min 0 s | 1 min 0 s | 1 min 0 s | **3 min 0 s** | ≤ 30 min | — | — |",
        "| `nowhere` | not timed yet | — | — | — | — | — | — | — |"]
    # a floor above the target says that no implementation could meet it; one below it leaves "not met" alone
    for name, seconds in (("fashion-fc2", 1500.0), ("fashion-fc1", 600.0)):
        (project / "docs" / "results" / name / "floor.json").write_text(json.dumps({"total": seconds}))
    rows = render_table("fashion-fc1,fashion-fc2", "durations", project).splitlines()[2:]
    assert rows[0].endswith("| ≤ 15 min | 10 min 0 s | met |")
    assert rows[1].endswith("| ≤ 20 min | 25 min 0 s | not met: the target is below the floor |")


def test_floors_are_rendered_part_by_part_beside_the_recorded_stages(project):
    """docs/performance.md's floors come from benchmarks/pipeline_floor.py's records: each counted part, each
    stage's floor beside its recorded wall clock and how many floors that is, the total, and the rates."""
    floor = {"commit": "0123456789abcdef", "started": "2026-01-02T03:04:05+00:00",
             "machine": {"cpu": "Some CPU", "cores": 2, "load_average_before": [0.5, 0.75, 1.0]},
             "rates": {"peak_flops": 2e11, "matmul_flops": 2e11, "conv_flops": 1.5e11, "draws_per_second": 5e8},
             "parts": [{"stage": "sample", "what": "SGLD products", "count": 1000, "flops": 3_000_000, "draws": 0,
                        "seconds": 15.0},
                       {"stage": "sample", "what": "noise", "count": 1000, "flops": 0, "draws": 79_510,
                        "seconds": 0.16},
                       {"stage": "evaluate", "what": "rows", "count": 10, "flops": 2e10, "draws": 0, "seconds": 1.0}],
             "stages": {"sample": 15.16, "evaluate": 1.0}, "total": 16.16}
    (project / "docs" / "results" / "demo" / "floor.json").write_text(json.dumps(floor))
    (project / "docs" / "results" / "demo" / "end_to_end.json").write_text(json.dumps(
        {"stages": {"sample": 60.64, "evaluate": 3.0}, "total": 63.64}))
    table = render_table("demo", "floors", project)
    assert "| `demo` | `apd sample` | SGLD products | 1,000 | 3.0 MFLOP | 15.0 s |  |" in table
    assert "| `demo` | `apd sample` | noise | 1,000 | 79,510 Gaussians | 0.2 s |  |" in table
    assert "| `demo` | `apd sample` | **the stage's floor** |  |  | 15.2 s | 1 min 1 s (4.0×) |" in table
    assert "| `demo` | `apd evaluate` | **the stage's floor** |  |  | 1.0 s | 3.0 s (3.0×) |" in table
    assert "| `demo` |  | **total** |  |  | **16.2 s** | 1 min 4 s |" in table
    assert ("| `demo` | `0123456789ab` | Some CPU (2 cores) | 0.50, 0.75, 1.00 | 200 GFLOP/s (matmul 200, conv2d "
            "150); 500 M Gaussians/s | 2026-01-02 |") in table


def test_nothing_lost_matrix_is_rendered_from_its_record(project):
    """docs/reliability.md's scenario count and verdict come from benchmarks/nothing_lost.py's JSON: counts per
    group and in all, and each failed or skipped case with its reason."""
    record = {"command": "nothing_lost.py --out x.json", "commit": "0123456789abcdef",
              "started": "2026-01-02T03:04:05+00:00", "seconds": 1092.4,
              "machine": {"cpu": "Some CPU", "cores": 2, "load_average_before": [0.5, 0.75, 1.0]},
              "groups": {"race": {"cases": 2, "passed": 2, "failed": 0, "skipped": 0},
                         "disk": {"cases": 1000, "passed": 998, "failed": 1, "skipped": 1}},
              "failed": {"disk-full": ["exit 1, expected 2", "2 lines on stderr"]},
              "skipped": {"read-only": ["needs root"]}}
    (project / "docs" / "results" / "demo" / "nothing_lost.json").write_text(json.dumps(record))
    table = render_table("demo", "nothing-lost", project)
    assert table.startswith("`nothing_lost.py --out x.json` at commit `0123456789ab` on Some CPU (2 cores), "
                            "2026-01-02; load average before the run 0.50, 0.75, 1.00; 18 min 12 s.")
    assert "| race | 2 | 2 | 0 | 0 |" in table and "| disk | 1,000 | 998 | 1 | 1 |" in table
    assert "| all | **1,002** | **1,000** | **1** | **1** |" in table
    assert table.endswith("Failed: `disk-full` (exit 1, expected 2; 2 lines on stderr)\n\n"
                          "Skipped: `read-only` (needs root)")


# The documents themselves: a README a newcomer reads in minutes, links that lead somewhere, no issue numbers.
README_MAX_LINES = 200
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues?\s+#?[0-9]+\b")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered -1, -2, …"""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_readme_stays_short_and_keeps_the_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make sample distill evaluate" in text and "make test" in text


def test_every_relative_link_in_the_documents_resolves():
    """Every relative link (and image) in README.md and docs/*.md names an existing file, and its anchor,
    where it has one, a heading of that file."""
    broken = []
    for document in documents(ROOT):
        for target in LINK.findall(document.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            if not file.is_file():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_document_with_results_regions_is_rendered():
    """`make docs` renders README.md and docs/*.md; no other Markdown file may hold a results region."""
    holding = {path for path in ROOT.rglob("*.md")
               if not {".venv", ".git", "artifacts", "node_modules"} & set(path.relative_to(ROOT).parts)
               and "<!-- results:" in path.read_text()}
    assert holding <= set(documents(ROOT))


def test_no_document_or_module_cites_an_issue_number():
    """Documents and code say what was measured, not which tracker issue asked for it."""
    files = [*documents(ROOT), *(ROOT / "apd").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             *(ROOT / "tests").rglob("*.py"), *(ROOT / "pipelines").glob("*.toml"), ROOT / "Makefile"]
    citing = [f"{path.relative_to(ROOT)}: {match.group(0)!r}" for path in files
              for match in ISSUE_NUMBER.finditer(path.read_text())]
    assert citing == []


def test_the_pipelines_table_is_rendered_from_the_pipeline_files(project):
    """README's pipelines table: each shipped pipeline's settings and the samples they keep, from its file."""
    table = render_table("digits,toy2d", "pipelines", project)
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("|")[1].strip() for row in rows] == ["`digits`", "`toy2d`"]
    assert "4 chains from prior draws; lr 0.6, prior var 0.1, batch 100, 32,000 it, burn-in 2,000, thin 60 → " \
           "4 × 500 = 2,000 samples" in rows[0]
    assert "| ring, box |" in rows[1]
