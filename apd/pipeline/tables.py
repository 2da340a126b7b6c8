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
    draws = mog[0]["draws"] if mog else 0
    note = (f"Each mixture row: one EM fit, mean ± std (ddof 0) over {draws} fresh draws of its ensemble; BALD "
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


def _gap(value: float | dict | None, digits: int = 1) -> str:
    """A signed gap (plain or ``{"mean", "std"}``); "n/a" where undefined (one network has no BALD)."""
    if value is None:
        return UNDEFINED
    if isinstance(value, dict):
        return f"{value['mean']:+.{digits}f} ±{format_number(value['std'], digits)}"
    return f"{value:+.{digits}f}" if math.isfinite(value) else MISSING


def _plain(value: float | dict | None, digits: int) -> str:
    if value is None:
        return UNDEFINED
    return format_number(value["mean"] if isinstance(value, dict) else value, digits)


QUALITY_NOTE = ("Gaps to SGLD (the yardstick, `apd/evaluation/yardstick.py`): worst per-set AUROC gap = max over the "
                "OOD sets of SGLD's AUROC − the method's, in percent points (positive: below SGLD on some set); NLL "
                "gap = NLL − SGLD's NLL (nats); KL = mean over test inputs of KL(SGLD's predictive ‖ the method's), "
                "SGLD's predictive over {samples} stored samples.")


def members_table(results: dict) -> Table | None:
    """Every method at its own ensemble size (the main tables' draws) and at ``networks`` members where it
    can draw that many (a kept set, an ensemble or one network cannot: n/a)."""
    q, at = results.get("quality"), results.get("at_networks")
    if not q:
        return None
    methods = methods_in_order(results, q)
    at = at or {}
    networks = next((row["members"] for row in at.values() if row), None)
    acc = results.get("accuracy", {})

    def mean_bald(m: str) -> float | None:
        values = [per_set["bald"][m]["auroc"]["mean"] for per_set in results.get("ood", {}).values()
                  if per_set.get("bald", {}).get(m) is not None]
        return float(np.mean(values)) if values and len(values) == len(results["ood"]) else None

    body, rows = [], []
    for m in methods:
        own = q[m]
        cells = [method_label(m), format_sample_count(own["in_sgld_samples"]), f"{own['members']:,}",
                 _plain(acc[m]["acc"], 4), _plain(acc[m]["nll"], 3), _plain(mean_bald(m), 1), _gap(own["bald_gap"]),
                 _gap(own["max_prob_gap"]), _gap(own["nll_gap"], 3), _plain(own["kl"], 4)]
        row = at.get(m)
        cells += ([UNDEFINED] * 4 if row is None else
                  [_plain(row["acc"], 4), _plain(row["nll"], 3), _plain(row["mean_bald_auroc"], 1),
                   _gap(row.get("bald_gap"))])
        body.append(cells)
        rows.append([m, own["in_sgld_samples"], own["members"], acc[m]["acc"]["mean"], acc[m]["nll"]["mean"],
                     mean_bald(m), own["bald_gap"], own["max_prob_gap"], own["nll_gap"], own["kl"],
                     None if row is None else row["acc"]["mean"], None if row is None else row["nll"]["mean"],
                     None if row is None else row["mean_bald_auroc"]["mean"],
                     None if row is None or row.get("bald_gap") is None else row["bald_gap"]["mean"]])
    header = ["method", "storage (SGLD samples)", "members", "accuracy", "NLL", "mean BALD AUROC",
              "worst BALD gap", "worst max-prob gap", "NLL gap", "KL", f"accuracy @{networks}", f"NLL @{networks}",
              f"mean BALD AUROC @{networks}", f"worst BALD gap @{networks}"]
    samples = results.get("yardstick", {}).get("reference", {}).get("kl_samples", "?")
    note = (f"Each method at its own ensemble size (the draws of the tables above) and at {networks} members where "
            "it can draw that many (n/a: a fixed set of fewer members). " + QUALITY_NOTE.format(samples=samples)
            + "\n\n")
    return Table("members", "Every method against SGLD, at its own size and at a common size", note + markdown_table(
        header, body), ["method", "in_sgld_samples", "members", "acc", "nll", "mean_bald_auroc", "bald_gap",
                        "max_prob_gap", "nll_gap", "kl", "acc_at_networks", "nll_at_networks",
                        "mean_bald_auroc_at_networks", "bald_gap_at_networks"], rows)


def yardstick_table(results: dict) -> Table | None:
    """The kept-samples yardstick: each method of storage S against ⌈S⌉ SGLD samples simply kept (evenly
    spaced; random subsets for the spread), on the worst per-set BALD AUROC gap, the NLL gap and the KL."""
    y, q = results.get("yardstick"), results.get("quality") or {}
    if not y:
        return None
    kept = y.get("kept", {})
    body, rows = [], []
    for m in methods_in_order(results, y.get("equal_storage", {})):
        entry = y["equal_storage"][m]
        row = kept.get(str(entry["k"]))
        if row is None:
            continue
        even, rand, own = row["evenly_spaced"], row["random"], q.get(m, {})
        body.append([method_label(m), format_sample_count(entry["in_sgld_samples"]), str(entry["k"]),
                     _gap(own.get("bald_gap")), _gap(even["bald_gap"]), _gap(rand["bald_gap"]),
                     _gap(own.get("nll_gap"), 3), _gap(even["nll_gap"], 3), _gap(rand["nll_gap"], 3),
                     _plain(own.get("kl"), 4), _plain(even["kl"], 4), _mean_std(rand["kl"], 4)])
        rows.append([m, entry["in_sgld_samples"], entry["k"], own.get("bald_gap"), even["bald_gap"],
                     None if rand["bald_gap"] is None else rand["bald_gap"]["mean"],
                     None if rand["bald_gap"] is None else rand["bald_gap"]["std"], own.get("nll_gap"),
                     even["nll_gap"], rand["nll_gap"]["mean"], rand["nll_gap"]["std"], own.get("kl"), even["kl"],
                     rand["kl"]["mean"], rand["kl"]["std"]])
    if not body:
        return None
    subsets = next(iter(kept.values()))["subsets"] if kept else 0
    note = (f"For each method of storage S: the method, ⌈S⌉ kept SGLD samples evenly spaced over the store, and the "
            f"mean ± std over {subsets} random subsets of ⌈S⌉ samples. A compressed posterior is useful where it "
            "beats the kept samples. " + QUALITY_NOTE.format(samples=y["reference"]["kl_samples"]) + "\n\n")
    header = ["method", "S", "⌈S⌉", "BALD gap: method", "kept", "random", "NLL gap: method", "kept", "random",
              "KL: method", "kept", "random"]
    return Table("yardstick", "The kept-samples yardstick at equal storage", note + markdown_table(header, body),
                 ["method", "in_sgld_samples", "k", "bald_gap", "kept_bald_gap", "random_bald_gap",
                  "random_bald_gap_std", "nll_gap", "kept_nll_gap", "random_nll_gap", "random_nll_gap_std", "kl",
                  "kept_kl", "random_kl", "random_kl_std"], rows)


def kept_curve_table(results: dict) -> Table | None:
    """Storage against quality for k kept SGLD samples (k of ``evaluate.yardstick_sizes``)."""
    curve = (results.get("yardstick") or {}).get("curve")
    if not curve:
        return None
    body, rows = [], []
    for row in curve:
        even, rand = row["evenly_spaced"], row["random"]
        body.append([str(row["k"]), _plain(even["acc"], 4), _plain(even["nll"], 3), _plain(even["mean_bald_auroc"], 1),
                     _gap(even["bald_gap"]), _gap(even["max_prob_gap"]), _gap(even["nll_gap"], 3),
                     _plain(even["kl"], 4), _gap(rand["bald_gap"]), _gap(rand["max_prob_gap"]),
                     _gap(rand["nll_gap"], 3), _mean_std(rand["kl"], 4)])
        rows.append([row["k"], even["acc"], even["nll"], even["mean_bald_auroc"], even["bald_gap"],
                     even["max_prob_gap"], even["nll_gap"], even["kl"],
                     *(None if rand[key] is None else rand[key][stat]
                       for key in ("bald_gap", "max_prob_gap", "nll_gap", "kl") for stat in ("mean", "std"))])
    note = ("k SGLD samples kept evenly spaced over the store (storage k), then the mean ± std over random subsets "
            "of k. " + QUALITY_NOTE.format(samples=results["yardstick"]["reference"]["kl_samples"]) + "\n\n")
    header = ["k", "accuracy", "NLL", "mean BALD AUROC", "worst BALD gap", "worst max-prob gap", "NLL gap", "KL",
              "random: BALD gap", "max-prob gap", "NLL gap", "KL"]
    return Table("kept_curve", "Kept SGLD samples: storage against quality", note + markdown_table(header, body),
                 ["k", "acc", "nll", "mean_bald_auroc", "bald_gap", "max_prob_gap", "nll_gap", "kl",
                  "random_bald_gap", "random_bald_gap_std", "random_max_prob_gap", "random_max_prob_gap_std",
                  "random_nll_gap", "random_nll_gap_std", "random_kl", "random_kl_std"], rows)


def peers_table(results: dict) -> Table | None:
    """What fitting each peer chose, and on which data: SWAG's learning rate, the Laplace approximations'
    prior precisions and scales, the kept and Stein-thinned samples."""
    peers = results.get("peers")
    if not peers:
        return None
    body, rows = [], []

    def add(method: str, setting: str, value: str, data: str) -> None:
        body.append([method_label(method), setting, value, data])
        rows.append([method, setting, value, data])

    if "kept" in peers:
        add("kept", "samples kept", str(peers["kept"]["k"]), "⌈APD's storage⌉; " + peers["kept"]["rule"])
    if "stein" in peers:
        st = peers["stein"]
        add("stein", "samples kept", f"{st['k']} of {st['candidates']:,} candidates",
            f"greedy kernel Stein discrepancy, full-training-set gradients ({st['seconds']:.1f} s)")
    if "swag" in peers:
        sw = peers["swag"]
        grid = ", ".join(f"{lr}: {'diverged' if v is None else format_number(v, 3)}"
                         for lr, v in (sw.get("val_nll") or {}).items())
        add("swag", "constant learning rate", f"{sw['lr']:g}", f"lowest validation NLL ({grid})")
        add("swag", "rank, scale", f"{sw['rank']}, {sw['scale']:g}", "fixed (Maddox et al., 2019)")
    for name in ("laplace-kfac", "laplace-ll", "laplace-glm"):
        if name not in peers:
            continue
        la = peers[name]
        if name != "laplace-glm":
            add(name, "prior precision", ", ".join(f"{g} {p:.3g}" for g, p in
                                                    zip(la["prior_groups"], la["prior_precision"], strict=True)),
                "marginal likelihood of the training split, one per parameter tensor")
        grid = ", ".join(f"{t:g}: {format_number(v, 3)}" for t, v in zip(la["scales"], la["val_nll"], strict=True))
        rule = ("lowest validation NLL" if la["nll_tolerance"] == 0 else
                f"widest within {la['nll_tolerance']:g} nats of the lowest validation NLL "
                f"(the lowest alone: {la['lowest_val_nll_scale']:g})")
        add(name, "posterior scale τ", f"{la['scale']:g}", f"{rule}; NLL by τ: {grid}")
    note = "Nothing here saw the test split or an OOD set.\n\n"
    return Table("peers", "How the peers' settings were chosen", note + markdown_table(
        ["method", "setting", "value", "chosen on"], body), ["method", "setting", "value", "chosen_on"], rows)


TABLE_BUILDERS = (accuracy_table, ood_table, mean_auroc_table, storage_table, members_table, yardstick_table,
                  kept_curve_table, mog_table, fidelity_table, peers_table, adversarial_table, timing_table)


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
