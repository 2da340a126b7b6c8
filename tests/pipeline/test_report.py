"""Report rendering: table layout and numbers, CSV round trips, figures present or skipped, CLI entry."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from apd.config import PipelineConfig
from apd.errors import ArtifactError
from apd.pipeline.comparison_tables import yardstick_table
from apd.pipeline.figures import write_figures
from apd.pipeline.report import run_report, write_report
from apd.pipeline.runtime import RunContext
from apd.pipeline.table_format import format_duration, spoken_list
from apd.pipeline.tables import render_tables
from tests.report_helpers import METHODS, OOD_SETS, SCORES_GIVEN, full_results

FULL_FIGURES = {"hist_variation_ratio", "hist_bald", "reliability", "sgld_first_layer", "storage_share",
                "distillation"}


def minimal_results() -> dict:
    """The same without any optional section (no MoG, APD share, fidelity, adversarial, storage, timing)."""
    results = full_results()
    for key in ("mog", "apd_share", "fidelity", "adversarial", "adversarial_whitebox", "storage", "timing"):
        del results[key]
    return results


def write_scores(path: Path, methods: list[str], scores: list[str], first_layer: bool) -> None:
    """A scores.h5 as the evaluator writes it, with seeded random scores and predictives."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as fh:
        fh["test_labels"] = rng.integers(0, 10, size=200).astype(np.int64)
        for method in methods:
            fh[f"{method}/test_probs"] = rng.dirichlet(np.full(10, 0.3), size=200).astype(np.float32)
            for score in scores:
                fh[f"{method}/in/{score}"] = rng.random(100).astype(np.float32)
                for name in OOD_SETS:
                    fh[f"{method}/out/{name}/{score}"] = (rng.random(100) + 0.5).astype(np.float32)
        if first_layer:
            fh["sgld_first_layer"] = rng.standard_normal((16, 8, 8)).astype(np.float32)


def write_generator_json(path: Path) -> Path:
    history = [{"step": step, "criterion": 1.0 / step, "kl": 0.5 / step, "bald_gap": 0.5 / step,
                "accuracy": 0.5 + step / 1000, "wasserstein": 5.0 / step} for step in (100, 200, 300)]
    path.write_text(json.dumps({"history": history, "selection": {"kept_step": 300}, "sgld_val_accuracy": 0.97}))
    return path


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("full")
    eval_dir = root / "eval"
    eval_dir.mkdir()
    write_scores(eval_dir / "scores.h5", METHODS, SCORES_GIVEN, first_layer=True)
    markdown = write_report(eval_dir, full_results(), write_generator_json(root / "generator.json"))
    return eval_dir, markdown


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def section(markdown: str, heading: str) -> str:
    """The text from the heading line that starts with ``heading`` up to the next heading."""
    start = markdown.index(f"\n{heading}") + 1
    following = [i for i in (markdown.find("\n#", start),) if i >= 0]
    return markdown[start:following[0] if following else len(markdown)]


def table_line(markdown: str, first_cells: str) -> str:
    """The Markdown table row that starts with ``| first_cells |`` (exactly one must exist)."""
    lines = [line for line in markdown.splitlines() if line.startswith(f"| {first_cells} |")]
    assert len(lines) == 1, f"{len(lines)} rows start with {first_cells!r}"
    return lines[0]


def test_header_and_accuracy_table():
    markdown = render_tables(full_results())
    assert markdown.startswith("# APD evaluation: demo\n")
    assert "digits (train 1,000 / val 300 / test 497)" in markdown
    assert "networks per draw: SGD 1, MC dropout 200, SGLD 100, APD 100" in markdown
    assert "ID:OOD = 1:1 (497 in-distribution inputs, 497 per OOD set)" in markdown
    accuracy = section(markdown, "## Accuracy")
    assert table_line(accuracy, "SGLD") == ("| SGLD | 0.9760 ± 0.0012 | 0.1000 ± 0.0100 | 0.0500 ± 0.0020 | "
                                            "0.0200 ± 0.0030 |")


def test_ood_blocks_order_and_cells():
    markdown = render_tables(full_results())
    positions = [markdown.index(f"### Score: {label}\n")
                 for label in ("variation ratio", "BALD", "predictive entropy")]
    assert positions == sorted(positions)
    bald_block = markdown[positions[1]:positions[2]]
    assert "| OOD set | SGD | MC dropout | SGLD | APD |" in bald_block
    # AUROC ± std / AUPR-Out / AUPR-In, as the paper's AUROC / AUPR+ / AUPR−
    assert table_line(bald_block, "gaussian").endswith("| 97.8 ±0.3 / 98.1 / 97.4 |")
    # SGD has no variation ratio (one network): n/a; MC dropout, first OOD set (mi 1, si 2):
    # 60 + 8 + 4 + 0 = 72 → "72.0 ±0.5 / 73.0 / 71.0"
    variation_block = markdown[positions[0]:positions[1]]
    assert table_line(variation_block, "gaussian").startswith("| gaussian | n/a | 72.0 ±0.5 / 73.0 / 71.0 |")
    entropy_block = markdown[positions[2]:]
    assert table_line(entropy_block, "gaussian").startswith("| gaussian | 60.0 ±0.5 / 61.0 / 59.0 |")
    assert "50.0" not in variation_block


def test_single_run_hides_std():
    results = full_results()
    results["runs"] = 1
    assert "| 97.8 / 98.1 / 97.4 |" in render_tables(results)


def test_mean_auroc_headline():
    markdown = render_tables(full_results())
    headline = section(markdown, "## Mean OOD AUROC")
    # APD BALD: (97.83 + 90.01) / 2 = 93.92; SGD has no BALD
    assert table_line(headline, "BALD") == "| BALD | n/a | 70.5 | 78.5 | 93.9 |"


def test_storage_mog_fidelity_timing_tables():
    markdown = render_tables(full_results())
    assert table_line(section(markdown, "## Storage"), "APD") == "| APD | 1,670,000 | 6.4 MiB | 21 |"
    assert "as much as 21 SGLD samples: 4.8× less than the 100 samples of an SGLD ensemble" in markdown
    assert table_line(markdown, "MoG-60") == ("| MoG-60 | 60 | 9,541,200 | 120 | 0.9720 ±0.0020 | 99.3 | 95.0 ±0.4 "
                                              "| 98.3 |")
    assert "| APD | — | 1,670,000 | 21 | — | 99.8 | — | 99.5 |" in markdown
    assert "| MoG | 1.010 | 1.100 | 13.000 | 14.000 | 0.929 |" in markdown
    assert table_line(markdown, "total") == "| total |  |  | 125.0 | 2 min 5 s |"
    assert table_line(section(markdown, "## Timing"), "APD") == "| APD | 2.0 | 3.5 | 5.5 | 5.5 s |"


def test_adversarial_tables_mirror_paper_layout():
    markdown = render_tables(full_results())
    entropy = section(markdown, "### Gray-box, score: predictive entropy")
    assert "| source | attack | MC dropout | SGLD | APD |" in entropy
    assert table_line(entropy, "MC dropout | FGSM") == "| MC dropout | FGSM | 89.53 | 94.01 | 91.70 |"
    assert table_line(entropy, "APD | PGD") == "| APD | PGD | 54.98 | 88.01 | 93.15 |"
    order = [markdown.index(f"### Gray-box, score: {label}") for label in
             ("predictive entropy", "BALD", "model variance")]
    assert order == sorted(order)
    accuracy = section(markdown, "### Gray-box: target accuracy")
    assert table_line(accuracy, "SGLD | FGSM") == "| SGLD | FGSM | 0.100 | 0.200 | 0.300 |"
    white = section(markdown, "### White-box")
    assert table_line(white, "SGLD | PGD") == "| SGLD | PGD | 71.00 | 66.00 | 61.00 | 0.200 |"


def test_absent_sections_are_left_out():
    markdown = render_tables(minimal_results())
    for title in ("## Storage", "## Mixtures", "## Fidelity", "## Adversarial", "## Timing"):
        assert title not in markdown
    assert "## Accuracy and calibration" in markdown and "### Score: BALD" in markdown


def test_a_yardstick_written_before_percentile_ranks_gives_the_subsets_mean_and_std():
    """Results whose kept samples hold no percentile ranks (no "last" selection, written before them) are set
    out as they were: the method, the evenly spaced samples and the random subsets' mean ± std, per summary."""
    results = full_results()
    kept = {"k": 3, "subsets": 50, "evenly_spaced": {"bald_gap": 1.5, "nll_gap": 0.012, "kl": 0.0203},
            "random": {"bald_gap": {"mean": 2.25, "std": 0.5}, "nll_gap": {"mean": 0.031, "std": 0.004},
                       "kl": {"mean": 0.0412, "std": 0.0051}}}
    results["yardstick"] = {"kept": {"3": kept}, "equal_storage": {"apd": {"in_sgld_samples": 2.4, "k": 3}},
                            "reference": {"kl_samples": 200}}
    results["quality"] = {"apd": {"bald_gap": 0.75, "nll_gap": 0.021, "kl": 0.0302}}
    table = yardstick_table(results)
    assert table.rows == [["apd", 2.4, "3", 0.75, 1.5, 2.25, 0.5, 0.021, 0.012, 0.031, 0.004, 0.0302, 0.0203,
                           0.0412, 0.0051]]
    row = next(line for line in table.markdown.splitlines() if line.startswith("| APD"))
    assert [cell.strip() for cell in row.strip("|").split("|")] == [
        "APD", "2.4", "3", "+0.8", "+1.5", "+2.2 ±0.5", "+0.021", "+0.012", "+0.031 ±0.004", "0.0302", "0.0203",
        "0.0412 ± 0.0051"]
    assert "over 50 random subsets" in table.markdown and "SGLD's predictive over 200 stored samples" in table.markdown


def test_csvs_round_trip(full_report):
    eval_dir, _ = full_report
    ood = read_csv(eval_dir / "ood.csv")
    assert len(ood) == len(OOD_SETS) * (len(SCORES_GIVEN) * len(METHODS) - 2) * 4  # SGD: no BALD, no VR
    [apd_bald] = [r for r in ood if (r["ood_set"], r["score"], r["method"], r["metric"])
                  == ("gaussian", "bald", "apd", "auroc")]
    assert (float(apd_bald["mean"]), float(apd_bald["std"])) == (97.83, 0.31)
    accuracy = {(r["method"], r["metric"]): float(r["mean"]) for r in read_csv(eval_dir / "accuracy.csv")}
    assert len(accuracy) == 16 and accuracy["apd", "acc"] == pytest.approx(0.979, abs=1e-12)
    storage = {r["method"]: r for r in read_csv(eval_dir / "storage.csv")}
    assert int(storage["apd"]["bytes"]) == 6_680_000 and float(storage["sgld"]["in_sgld_samples"]) == 100.0
    mog = read_csv(eval_dir / "mog.csv")
    assert [r["model"] for r in mog] == ["MoG-1", "MoG-10", "MoG-60", "APD"]
    assert float(mog[2]["accuracy_share"]) == 0.993 and mog[3]["components"] == ""
    assert float(mog[3]["bald_auroc_share"]) == 0.995
    fidelity = {r["method"]: float(r["nn_ratio"]) for r in read_csv(eval_dir / "fidelity.csv")}
    assert fidelity == {"apd": 0.893, "mog": 0.929}
    key_columns = ("setting", "source", "attack", "target", "metric", "score")
    adversarial = {tuple(r[c] for c in key_columns): float(r["value"])
                   for r in read_csv(eval_dir / "adversarial.csv")}
    assert adversarial["gray-box", "sgld", "pgd", "apd", "auroc", "entropy"] == 82.80
    assert adversarial["white-box", "apd", "pgd", "apd", "accuracy", ""] == pytest.approx(0.3)
    assert len(adversarial) == 3 * 2 * 3 * 4 + 3 * 4
    means = {(r["score"], r["method"]): float(r["mean_auroc"]) for r in read_csv(eval_dir / "mean_auroc.csv")}
    assert means["bald", "apd"] == pytest.approx(93.92)
    timing = {r["step"]: r for r in read_csv(eval_dir / "timing.csv")}
    assert float(timing["total"]["seconds"]) == 125.0
    assert float(timing["apd"]["seconds"]) == 5.5  # loading 2.0 + judging 3.5
    assert float(timing["apd"]["loading_seconds"]) == 2.0 and float(timing["apd"]["judging_seconds"]) == 3.5
    assert float(timing["mog_growth"]["seconds"]) == 40.0 and timing["mog_growth"]["judging_seconds"] == ""


def test_full_report_writes_every_figure(full_report):
    eval_dir, markdown = full_report
    assert (eval_dir / "tables.md").read_text() == markdown == render_tables(full_results())
    pngs = {path.stem: path for path in (eval_dir / "figures").glob("*.png")}
    assert set(pngs) == FULL_FIGURES
    for path in pngs.values():
        assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_figures_without_their_data_are_skipped(tmp_path):
    """Only test predictives in scores.h5 (no scores, no first layer), no MoG and no generator history."""
    write_scores(tmp_path / "scores.h5", ["sgld"], [], first_layer=False)
    written = write_figures(tmp_path, minimal_results(), tmp_path / "no-generator.json")
    assert [path.name for path in written] == ["reliability.png"]
    assert all(path.read_bytes().startswith(b"\x89PNG") for path in written)
    assert write_figures(tmp_path / "empty", minimal_results()) == []
    assert not (tmp_path / "empty" / "figures").exists()


def test_minimal_report_writes_only_its_csvs(tmp_path):
    write_report(tmp_path, minimal_results())
    assert {path.name for path in tmp_path.glob("*.csv")} == {"accuracy.csv", "ood.csv", "mean_auroc.csv"}


def _context(tmp_path: Path) -> RunContext:
    return RunContext(cfg=PipelineConfig(name="demo", source="pipelines/demo.toml"), artifacts_root=tmp_path)


def test_run_report_without_results_names_the_evaluate_command(tmp_path):
    with pytest.raises(ArtifactError, match=r"run `apd evaluate --config pipelines/demo\.toml` first"):
        run_report(_context(tmp_path))


def test_run_report_renders_from_files(tmp_path, capsys):
    eval_dir = tmp_path / "demo" / "eval"
    eval_dir.mkdir(parents=True)
    results = copy.deepcopy(minimal_results())
    (eval_dir / "results.json").write_text(json.dumps(results))
    run_report(_context(tmp_path))
    printed = capsys.readouterr().out
    assert "| gaussian | n/a | 72.0 ±0.5 / 73.0 / 71.0 |" in printed
    assert (eval_dir / "tables.md").read_text() == render_tables(results)


def test_run_report_on_malformed_results_is_an_artifact_error(tmp_path):
    eval_dir = tmp_path / "demo" / "eval"
    eval_dir.mkdir(parents=True)
    (eval_dir / "results.json").write_text(json.dumps({"accuracy": {"sgld": {"acc": 0.9}}}))
    with pytest.raises(ArtifactError, match="malformed results"):
        run_report(_context(tmp_path))


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.04, "0.0 s"), (59.94, "59.9 s"), (59.96, "1 min 0 s"), (90.4, "1 min 30 s"), (479.84, "8 min 0 s"),
    (3599.4, "59 min 59 s"), (3599.6, "1 h 0 min"), (4180.7, "1 h 10 min"), (7170.0, "2 h 0 min"),
])
def test_durations_are_rounded_to_what_they_show(seconds, shown):
    assert format_duration(seconds) == shown


@pytest.mark.parametrize(("items", "spoken"), [
    ([], ""), (["2"], "2"), (["2", "4"], "2 and 4"), (["2", "4", "8"], "2, 4 and 8"),
])
def test_lists_read_as_prose(items, spoken):
    assert spoken_list(items) == spoken


def test_stability_table_gives_each_number_its_halves_and_says_whether_the_target_is_met():
    results = full_results()
    results["reference_stability"] = {
        "chains": 64, "samples": 2000,
        "numbers": {"nll": 0.3555, "auroc": {"gaussian": {"bald": 91.0, "max_prob": 80.0}}},
        "split_half": {"halves": [[0], [1]], "max_auroc_gap": 1.31, "nll_gap": 0.00013, "meets": False,
                       "target": {"auroc_points": 0.5, "nll_nats": 0.005},
                       "numbers": [{"nll": 0.35545, "auroc": {"gaussian": {"bald": 91.1, "max_prob": 80.655}}},
                                   {"nll": 0.35558, "auroc": {"gaussian": {"bald": 91.0, "max_prob": 79.345}}}],
                       "gaps": {"nll": 0.00013, "auroc": {"gaussian": {"bald": 0.1, "max_prob": 1.31}}}},
        "jackknife_se": {"nll": 0.0004, "auroc": {"gaussian": {"bald": 0.24, "max_prob": 0.35}}}}
    stability = section(render_tables(results), "## Is the reference settled?")
    assert ("64 chains, 2,000 samples: halves of the chains 1.31 AUROC points and 0.0001 nats apart at most "
            "(target 0.5 and 0.005: not met)") in stability
    assert table_line(stability, "max probability AUROC, gaussian") == (
        "| max probability AUROC, gaussian | 80.00 | 80.66 | 79.34 | 1.31 | 0.35 |")
    assert table_line(stability, "test NLL (nats)") == (
        "| test NLL (nats) | 0.3555 | 0.3554 | 0.3556 | 0.0001 | 0.0004 |")
    assert "## Is the reference settled?" not in render_tables(full_results())
