"""Tables of an evaluation: Markdown and CSV from ``results.json``.

Each table is built once as a :class:`Table` holding both its Markdown and its CSV rows, so the two
cannot disagree. The layouts follow the tables of Wang et al. (ICML 2018) (``docs/design.md`` lists
them). Sections whose data are absent are left out; a score a method cannot have (one network has no
BALD) is "n/a", never a number.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apd.io import write_text_atomic
from apd.pipeline.methods import METHODS, label

METHOD_ORDER = tuple(METHODS)
SCORE_ORDER = ("variation_ratio", "bald", "entropy", "max_prob", "model_variance")
SCORE_LABELS = {"variation_ratio": "variation ratio", "bald": "BALD", "entropy": "predictive entropy",
                "max_prob": "max probability", "model_variance": "model variance"}
ADVERSARIAL_SCORE_ORDER = ("entropy", "bald", "model_variance")  # the scores of the paper's adversarial study
HISTOGRAM_SCORES = ("variation_ratio", "bald")
ACCURACY_COLUMNS = (("acc", "accuracy"), ("nll", "NLL"), ("brier", "Brier"), ("ece", "ECE"))
DETECTION_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr95")
FIDELITY_COLUMNS = (("weight_std_ratio", "weight std ratio"), ("bald_ratio", "BALD ratio"),
                    ("nn_distance", "NN distance"), ("heldout_nn_distance", "held-out NN distance"),
                    ("nn_ratio", "NN ratio"))
MOG_COLUMNS = ("model", "components", "parameters", "in_sgld_samples", "accuracy", "accuracy_std",
               "accuracy_share", "bald_auroc", "bald_auroc_std", "bald_auroc_share")
MISSING = "—"
UNDEFINED = "n/a"  # a score the method cannot have (e.g. BALD of one network)


@dataclass(frozen=True)
class Table:
    """One section of the report: its Markdown for ``tables.md`` and the same numbers as CSV rows."""

    name: str  # CSV file stem
    title: str
    markdown: str
    columns: list[str]
    rows: list[list[Any]]


# ---------------------------------------------------------------------------------------------- formatting


def ordered(keys: Iterable[str], preferred: Sequence[str]) -> list[str]:
    """The distinct ``keys``: those in ``preferred`` first, in its order, then the rest as they came."""
    distinct = list(dict.fromkeys(keys))
    rank = {key: i for i, key in enumerate(dict.fromkeys(preferred))}
    return sorted(distinct, key=lambda key: (rank.get(key, len(rank)), distinct.index(key)))


def methods_in_order(results: dict, present: Iterable[str]) -> list[str]:
    """Methods in the order results.json asks for (then the usual order, then any others)."""
    return ordered(present, [*results.get("methods", []), *METHOD_ORDER])


def method_label(method: str) -> str:
    return label(method)


def score_label(score: str) -> str:
    return SCORE_LABELS.get(score, score)


def format_number(value: float | None, digits: int) -> str:
    """``value`` with ``digits`` decimals; an absent or non-finite value is a dash."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:.{digits}f}"


def _mean_std(stat: dict | None, digits: int) -> str:
    if stat is None:
        return MISSING
    return f"{format_number(stat.get('mean'), digits)} ± {format_number(stat.get('std'), digits)}"


def _percent_of(share: float | None) -> str:
    """A fraction of SGLD's value as a percentage with one decimal (0.993 → 99.3)."""
    return MISSING if share is None else format_number(100.0 * share, 1)


def format_sample_count(value: float | None) -> str:
    """A number of SGLD samples' worth: three significant digits below 100, whole numbers above."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _human_bytes(count: int) -> str:
    """Bytes in binary units: 1536 → 1.5 KiB."""
    value, units = float(count), ("B", "KiB", "MiB", "GiB", "TiB")
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{count} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def format_duration(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60.0)
    hours, minutes = divmod(int(minutes), 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {rest:.0f} s" if minutes else f"{rest:.1f} s"


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------- tables


def _header(results: dict) -> str:
    sizes = results.get("sizes", {})
    ensemble = results.get("ensemble", {})
    lines = [f"# APD evaluation: {results.get('pipeline', '?')}", ""]
    lines.append(f"- dataset: {results.get('dataset', '?')} ("
                 + " / ".join(f"{split} {count:,}" for split, count in sizes.items()) + ")")
    lines.append(f"- runs: {results.get('runs', '?')}; networks per draw: "
                 + ", ".join(f"{method_label(m)} {ensemble[m]:,}" for m in methods_in_order(results, ensemble)))
    lines.append(f"- device: {results.get('device', '?')}; config hash {results.get('config_hash', '?')}")
    meta = results.get("ood_meta")
    ratio = (f"; ID:OOD = {meta['ratio_in_out']} ({meta['n_in']:,} in-distribution inputs, {meta['n_out']:,} "
             f"per OOD set), OOD inputs scaled ×{meta.get('scale', 1):g}" if meta else "")
    lines.append("- detection: the OOD (or adversarial) inputs are the positive class for AUROC and "
                 "AUPR-Out, the in-distribution inputs for AUPR-In; every score is higher = more uncertain"
                 + ratio + ".")
    return "\n".join(lines)


def accuracy_table(results: dict) -> Table | None:
    """Test-set accuracy, NLL, Brier score and ECE of each method's ensemble predictive, mean ± std over
    runs (the paper's accuracy table, Wang et al., 2018, extended with calibration)."""
    accuracy = results.get("accuracy")
    if not accuracy:
        return None
    methods = methods_in_order(results, accuracy)
    body = [[method_label(m), *(_mean_std(accuracy[m].get(key), 4) for key, _ in ACCURACY_COLUMNS)]
            for m in methods]
    note = ("Ensemble predictive on the test set, mean ± std over runs; accuracy as a fraction, NLL in nats, "
            "Brier summed over classes, ECE over equal-width confidence bins.\n\n")
    rows = [[m, key, stat["mean"], stat["std"]] for m in methods for key, _ in ACCURACY_COLUMNS
            if (stat := accuracy[m].get(key)) is not None]
    header = ["method", *(label for _, label in ACCURACY_COLUMNS)]
    return Table("accuracy", "Accuracy and calibration", note + markdown_table(header, body),
                 ["method", "metric", "mean", "std"], rows)


def _ood_scores(ood: dict) -> list[str]:
    return ordered((score for per_set in ood.values() for score in per_set), SCORE_ORDER)


def _detection_cell(metrics: dict | None, show_std: bool) -> str:
    """``AUROC / AUPR-Out / AUPR-In`` in percent (the paper's AUROC / AUPR+ / AUPR−), ± std on AUROC;
    "n/a" for a score the method cannot have."""
    if metrics is None:
        return UNDEFINED
    auroc = format_number(metrics["auroc"]["mean"], 1)
    if show_std:
        auroc += f" ±{format_number(metrics['auroc']['std'], 1)}"
    return " / ".join([auroc, *(format_number(metrics[key]["mean"], 1) for key in ("aupr_out", "aupr_in"))])


def ood_table(results: dict) -> Table | None:
    """OOD detection, one block per score (variation ratio first, then BALD, then the rest): rows are OOD
    sets, each method's cell is AUROC / AUPR-Out / AUPR-In in percent, as in Wang et al. (2018). The CSV
    is long: one row per (OOD set, score, method, metric) with mean and std."""
    ood = results.get("ood")
    if not ood:
        return None
    show_std = results.get("runs", 1) > 1
    blocks = ["Cells: AUROC" + (" ± std" if show_std else "") + " / AUPR-Out / AUPR-In, percent "
              "(the paper's AUROC / AUPR+ / AUPR−); the CSV also holds FPR at 95 % TPR and every std."]
    rows = []
    for score in _ood_scores(ood):
        sets = [name for name, per_set in ood.items() if score in per_set]
        methods = methods_in_order(results, (m for name in sets for m in ood[name][score]))
        body = [[name, *(_detection_cell(ood[name][score][m], show_std) if m in ood[name][score] else MISSING
                         for m in methods)] for name in sets]
        blocks.append(f"### Score: {score_label(score)}\n\n"
                      + markdown_table(["OOD set", *map(method_label, methods)], body))
        rows += [[name, score, m, metric, stat["mean"], stat["std"]] for name in sets for m in methods
                 if ood[name][score].get(m) is not None for metric in DETECTION_METRICS
                 if (stat := ood[name][score][m].get(metric)) is not None]
    return Table("ood", "Out-of-distribution detection", "\n\n".join(blocks),
                 ["ood_set", "score", "method", "metric", "mean", "std"], rows)


def mean_auroc_table(results: dict) -> Table | None:
    """The headline: per score and method, the AUROC averaged over the OOD sets,
    mean AUROC = (1/|S|) Σ_{o ∈ S} AUROC_o (percent; each AUROC_o is itself a mean over runs)."""
    ood = results.get("ood")
    if not ood:
        return None
    scores = _ood_scores(ood)
    methods = methods_in_order(results, (m for per_set in ood.values() for per_score in per_set.values()
                                 for m in per_score))
    means = {(score, m): float(np.mean(values)) for score in scores for m in methods
             if (values := [per_set[score][m]["auroc"]["mean"] for per_set in ood.values()
                            if per_set.get(score, {}).get(m) is not None])}
    body = [[score_label(score), *(format_number(means[(score, m)], 1) if (score, m) in means else UNDEFINED
                                   for m in methods)] for score in scores]
    note = f"AUROC in percent, averaged over the {len(ood)} OOD sets ({', '.join(ood)}).\n\n"
    rows = [[score, m, value] for (score, m), value in means.items()]
    return Table("mean_auroc", "Mean OOD AUROC", note + markdown_table(["score", *map(method_label, methods)], body),
                 ["score", "method", "mean_auroc"], rows)


def storage_table(results: dict) -> Table | None:
    """What each method stores: parameters, bytes, and parameters / D in SGLD samples' worth, where D is
    the size of one weight vector (the paper's storage comparison, Wang et al., 2018)."""
    storage = results.get("storage")
    if not storage:
        return None
    methods = methods_in_order(results, storage)
    body = [[method_label(m), f"{storage[m]['parameters']:,}", _human_bytes(storage[m]["bytes"]),
             format_sample_count(storage[m]["in_sgld_samples"])] for m in methods]
    markdown = markdown_table(["method", "parameters", "size", "SGLD samples' worth"], body)
    if "apd" in storage:
        apd = storage["apd"]
        markdown += (f"\n\nAPD's generator stores {apd['parameters']:,} parameters, as much as "
                     f"{format_sample_count(apd['in_sgld_samples'])} SGLD samples")
        sgld_ensemble = results.get("ensemble", {}).get("sgld")
        if sgld_ensemble and apd["in_sgld_samples"] > 0:
            markdown += (f": {sgld_ensemble / apd['in_sgld_samples']:.1f}× less than the {sgld_ensemble:,} "
                         "samples of an SGLD ensemble")
        markdown += "."
    rows = [[m, storage[m]["parameters"], storage[m]["bytes"], storage[m]["in_sgld_samples"]]
            for m in methods]
    return Table("storage", "Storage", markdown, ["method", "parameters", "bytes", "in_sgld_samples"], rows)


def mog_table(results: dict) -> Table | None:
    """Diagonal Gaussian mixtures with a growing number of components against APD: storage and the share
    of SGLD's accuracy and BALD AUROC each reaches (the paper's MoG study, Wang et al., 2018)."""
    mog, apd = results.get("mog") or [], results.get("apd_share")
    if not mog and not apd:
        return None
    rows = [[f"MoG-{r['components']}", r["components"], r["parameters"], r["in_sgld_samples"],
             r["accuracy"]["mean"], r["accuracy"]["std"], r["accuracy_share"], r["bald_auroc"]["mean"],
             r["bald_auroc"]["std"], r["bald_auroc_share"]] for r in mog]
    if apd:
        rows.append(["APD", None, apd["parameters"], apd["in_sgld_samples"], None, None, apd["accuracy_share"],
                     None, None, apd["bald_auroc_share"]])
    body = [[model, MISSING if k is None else str(k), f"{params:,}", format_sample_count(worth),
             MISSING if acc is None else f"{format_number(acc, 4)} ±{format_number(acc_sd, 4)}",
             _percent_of(acc_share),
             MISSING if bald is None else f"{format_number(bald, 1)} ±{format_number(bald_sd, 1)}",
             _percent_of(bald_share)]
            for model, k, params, worth, acc, acc_sd, acc_share, bald, bald_sd, bald_share in rows]
    header = ["model", "components", "parameters", "SGLD samples' worth", "accuracy", "accuracy (% of SGLD)",
              "BALD AUROC", "BALD AUROC (% of SGLD)"]
    fits = mog[0]["fits"] if mog else 0
    note = (f"Each mixture row: mean ± std (ddof 0) over {fits} fits with different seeds, one draw each; BALD "
            "AUROC in percent, averaged over the OOD sets; shares are relative to SGLD's own values.\n\n")
    return Table("mog", "Mixtures of Gaussians vs APD", note + markdown_table(header, body), list(MOG_COLUMNS),
                 rows)


def fidelity_table(results: dict) -> Table | None:
    """Weight-space fidelity to the SGLD samples: per-weight std and mean BALD as ratios to SGLD's own
    (1 = the same), and nearest-neighbour distances to the SGLD samples with held-out SGLD samples as the
    yardstick, NN ratio = NN distance / held-out NN distance."""
    fidelity = results.get("fidelity")
    if not fidelity:
        return None
    methods = methods_in_order(results, fidelity)
    body = [[method_label(m), *(format_number(fidelity[m].get(key), 3) for key, _ in FIDELITY_COLUMNS)]
            for m in methods]
    note = ("Ratios to SGLD's own values (1 = the same); an NN ratio well below 1 means the generated "
            "weights sit closer to the training samples than fresh SGLD samples do (memorisation).\n\n")
    rows = [[m, *(fidelity[m].get(key) for key, _ in FIDELITY_COLUMNS)] for m in methods]
    return Table("fidelity", "Fidelity to the SGLD samples", note + markdown_table(
        ["method", *(label for _, label in FIDELITY_COLUMNS)], body),
        ["method", *(key for key, _ in FIDELITY_COLUMNS)], rows)


def _adversarial_cells(results: dict) -> dict[tuple[str, str, str, str], dict]:
    """(setting, source, attack, target) → {SCORE: {"auroc"}, "accuracy"}; white-box source = target."""
    cells = {("gray-box", source, attack, target): cell
             for source, attacks in results.get("adversarial", {}).items()
             for attack, targets in attacks.items() for target, cell in targets.items()}
    cells.update({("white-box", target, attack, target): cell
                  for target, attacks in results.get("adversarial_whitebox", {}).items()
                  for attack, cell in attacks.items()})
    return cells


def _auroc_cell(cell: dict, score: str) -> str:
    """An adversarial cell's AUROC for ``score``: "n/a" where the target cannot have the score."""
    if score not in cell:
        return MISSING
    return UNDEFINED if cell[score] is None else format_number(cell[score]["auroc"], 2)


def _cell_scores(cells: Iterable[dict]) -> list[str]:
    return ordered((key for cell in cells for key in cell if key != "accuracy"), ADVERSARIAL_SCORE_ORDER)


def adversarial_table(results: dict) -> Table | None:
    """Adversarial-example detection as in Wang et al. (2018): gray-box attacks crafted on one weight
    sample of a source method, detected by each target method (rows source × attack, columns targets), one
    block per score, plus the targets' accuracy on the adversarial inputs; then white-box attacks on each
    target's own expected predictive. AUROC in percent, adversarial inputs positive."""
    cells = _adversarial_cells(results)
    if not cells:
        return None
    blocks = []
    gray = {key[1:]: cell for key, cell in cells.items() if key[0] == "gray-box"}
    if gray:
        pairs = _ordered_pairs(results, [(source, attack) for source, attack, _ in gray])
        targets = methods_in_order(results, (target for _, _, target in gray))

        def grid(value: Any) -> str:
            body = [[method_label(source), attack.upper(),
                     *(MISSING if (cell := gray.get((source, attack, t))) is None else value(cell)
                       for t in targets)] for source, attack in pairs]
            return markdown_table(["source", "attack", *map(method_label, targets)], body)

        for score in _cell_scores(gray.values()):
            blocks.append(f"### Gray-box, score: {score_label(score)} (AUROC %)\n\n" + grid(
                lambda cell, score=score: _auroc_cell(cell, score)))
        blocks.append("### Gray-box: target accuracy on the adversarial inputs\n\n" + grid(
            lambda cell: format_number(cell.get("accuracy"), 3)))
    white = {key[1:]: cell for key, cell in cells.items() if key[0] == "white-box"}
    if white:
        scores = _cell_scores(white.values())
        body = [[method_label(target), attack.upper(),
                 *(_auroc_cell(cell, s) for s in scores),
                 format_number(cell.get("accuracy"), 3)]
                for target, attack in _ordered_pairs(results, [(t, a) for _, a, t in white])
                for cell in [white[(target, attack, target)]]]
        blocks.append("### White-box (attack on the target's expected predictive)\n\n" + markdown_table(
            ["target", "attack", *(f"{score_label(s)} AUROC %" for s in scores), "accuracy"], body))
    rows = [[setting, source, attack, target, "auroc", score, cell[score]["auroc"]]
            for (setting, source, attack, target), cell in cells.items() for score in _cell_scores([cell])
            if cell.get(score) is not None]
    rows += [[setting, source, attack, target, "accuracy", "", cell["accuracy"]]
             for (setting, source, attack, target), cell in cells.items() if "accuracy" in cell]
    return Table("adversarial", "Adversarial-example detection", "\n\n".join(blocks),
                 ["setting", "source", "attack", "target", "metric", "score", "value"], rows)


def _ordered_pairs(results: dict, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Distinct (method, attack) pairs, grouped by method in the method order, attacks as they came."""
    distinct = list(dict.fromkeys(pairs))
    methods = methods_in_order(results, (method for method, _ in distinct))
    return sorted(distinct, key=lambda pair: (methods.index(pair[0]), distinct.index(pair)))


def timing_table(results: dict) -> Table | None:
    """Wall-clock seconds of each evaluation step, the total last."""
    timing = results.get("timing")
    if not timing:
        return None
    steps = methods_in_order(results, (k for k in timing if k != "total"))
    steps += ["total"] if "total" in timing else []
    body = [[method_label(step), f"{timing[step]:,.1f}", format_duration(timing[step])] for step in steps]
    return Table("timing", "Timing", markdown_table(["step", "seconds", "duration"], body), ["step", "seconds"],
                 [[step, timing[step]] for step in steps])


TABLE_BUILDERS = (accuracy_table, ood_table, mean_auroc_table, storage_table, mog_table, fidelity_table,
                  adversarial_table, timing_table)


def build_tables(results: dict) -> list[Table]:
    """Every table whose data ``results`` holds, in report order."""
    return [table for build in TABLE_BUILDERS if (table := build(results)) is not None]


def assemble(results: dict, tables: Sequence[Table]) -> str:
    return "\n\n".join([_header(results), *(f"## {t.title}\n\n{t.markdown}" for t in tables)]) + "\n"


def render_tables(results: dict) -> str:
    """The Markdown of ``tables.md``: a header (pipeline, data, runs, ensemble sizes, device, detection
    conventions) and every table laid out as in Wang et al. (2018), so the two can be read side by side."""
    return assemble(results, build_tables(results))


def write_csv(path: Path, table: Table) -> None:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(table.columns)
    writer.writerows(table.rows)
    write_text_atomic(path, text.getvalue())
