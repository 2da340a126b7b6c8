"""Tables of an evaluation: Markdown and CSV from ``results.json``.

The layouts follow the tables of Wang et al. (ICML 2018) (``docs/design.md`` lists them). Sections whose
data are absent are left out; a score a method cannot have (one network has no BALD) is "n/a", never a
number. This module holds the evaluation's own tables (accuracy, OOD detection, mean AUROC, storage,
mixtures of Gaussians, fidelity, timing) and assembles the report from them and from those of
:mod:`apd.pipeline.comparison_tables`; cells and layout are :mod:`apd.pipeline.table_format`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from apd.metrics import Stat
from apd.pipeline.comparison_tables import (
    adversarial_table,
    kept_curve_table,
    kept_margins_table,
    members_table,
    peers_table,
    yardstick_table,
)
from apd.pipeline.replicate_tables import replicates_table
from apd.pipeline.results import accuracy as stored_accuracy
from apd.pipeline.results import detection, mean_auroc
from apd.pipeline.table_format import (
    MISSING,
    SCORE_ORDER,
    UNDEFINED,
    Table,
    format_duration,
    format_number,
    format_sample_count,
    human_bytes,
    markdown_table,
    mean_std,
    method_label,
    methods_in_order,
    ordered,
    percent_of,
    score_label,
)

ACCURACY_COLUMNS = (("acc", "accuracy"), ("nll", "NLL"), ("brier", "Brier"), ("ece", "ECE"))
DETECTION_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr95")
FIDELITY_COLUMNS = (("weight_std_ratio", "weight std ratio"), ("bald_ratio", "BALD ratio"),
                    ("nn_distance", "NN distance"), ("heldout_nn_distance", "held-out NN distance"),
                    ("nn_ratio", "NN ratio"))
MOG_COLUMNS = ("model", "components", "parameters", "in_sgld_samples", "accuracy", "accuracy_std",
               "accuracy_share", "bald_auroc", "bald_auroc_std", "bald_auroc_share")


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
    body = [[method_label(m), *(mean_std(stored_accuracy(results, m, key), 4) for key, _ in ACCURACY_COLUMNS)]
            for m in methods]
    note = ("Ensemble predictive on the test set, mean ± std over runs; accuracy as a fraction, NLL in nats, "
            "Brier summed over classes, ECE over equal-width confidence bins.\n\n")
    rows = [[m, key, stat.mean, stat.std] for m in methods for key, _ in ACCURACY_COLUMNS
            if (stat := stored_accuracy(results, m, key)) is not None]
    header = ["method", *(label for _, label in ACCURACY_COLUMNS)]
    return Table("accuracy", "Accuracy and calibration", note + markdown_table(header, body),
                 ["method", "metric", "mean", "std"], rows)


def _ood_scores(ood: dict) -> list[str]:
    return ordered((score for per_set in ood.values() for score in per_set), SCORE_ORDER)


def _detection_cell(metrics: dict[str, Stat] | None, show_std: bool) -> str:
    """``AUROC / AUPR-Out / AUPR-In`` in percent (the paper's AUROC / AUPR+ / AUPR−), ± std on AUROC;
    "n/a" for a score the method cannot have."""
    if metrics is None:
        return UNDEFINED
    auroc = format_number(metrics["auroc"].mean, 1)
    if show_std:
        auroc += f" ±{format_number(metrics['auroc'].std, 1)}"
    return " / ".join([auroc, *(format_number(metrics[key].mean, 1) for key in ("aupr_out", "aupr_in"))])


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
        body = [[name, *(_detection_cell(detection(results, name, score, m), show_std) if m in ood[name][score]
                         else MISSING for m in methods)] for name in sets]
        blocks.append(f"### Score: {score_label(score)}\n\n"
                      + markdown_table(["OOD set", *map(method_label, methods)], body))
        rows += [[name, score, m, metric, stat.mean, stat.std] for name in sets for m in methods
                 if (found := detection(results, name, score, m)) is not None for metric in DETECTION_METRICS
                 if (stat := found.get(metric)) is not None]
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
    means = {(score, m): value for score in scores for m in methods
             if (value := mean_auroc(results, m, score)) is not None}
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
    body = [[method_label(m), f"{storage[m]['parameters']:,}", human_bytes(storage[m]["bytes"]),
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
             acc.mean, acc.std, r["accuracy_share"], bald.mean, bald.std, r["bald_auroc_share"]]
            for r in mog for acc, bald in [(Stat.of(r["accuracy"]), Stat.of(r["bald_auroc"]))]]
    if apd:
        rows.append(["APD", None, apd["parameters"], apd["in_sgld_samples"], None, None, apd["accuracy_share"],
                     None, None, apd["bald_auroc_share"]])
    body = [[model, MISSING if k is None else str(k), f"{params:,}", format_sample_count(worth),
             MISSING if acc is None else f"{format_number(acc, 4)} ±{format_number(acc_sd, 4)}",
             percent_of(acc_share),
             MISSING if bald is None else f"{format_number(bald, 1)} ±{format_number(bald_sd, 1)}",
             percent_of(bald_share)]
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
    framed = all("sgld_frame" in fidelity[m] for m in methods)
    columns = FIDELITY_COLUMNS + ((("sgld_frame", "SGLD samples"), ("bald_members", "BALD members")) if framed else ())
    body = [[method_label(m), *(fidelity[m].get(key) if key == "sgld_frame" else
                                format_number(fidelity[m].get(key), 0 if key == "bald_members" else 3)
                                for key, _ in columns)] for m in methods]
    note = ("Ratios to SGLD's own values (1 = the same); an NN ratio well below 1 means the generated "
            "weights sit closer to the SGLD samples than fresh SGLD samples do: memorised samples, or a spread "
            "narrower than SGLD's (read it beside the weight std ratio). "
            + ("Weights are set against SGLD's samples in the frame the method was fit in (aligned: hidden units "
               "permuted as `apd distill` aligns them; the raw samples hold permuted copies of a mode, which "
               "widen their per-weight spread), and a method's BALD against that of as many SGLD samples (BALD "
               "shrinks with fewer members)." if framed else
               "These results were written before the frames and sizes were matched: every method's weights are "
               "set against SGLD's samples as stored, so a method fit to aligned samples (APD, MoG, the mode "
               "mixture where `apd distill` aligns) is set against a per-weight spread that permuted copies of a "
               "mode widen, and the BALD ratio divides BALD at the method's own ensemble size by SGLD's at its "
               "own, which favours the larger ensemble.") + "\n\n")
    rows = [[m, *(fidelity[m].get(key) for key, _ in columns)] for m in methods]
    return Table("fidelity", "Fidelity to the SGLD samples", note + markdown_table(
        ["method", *(label for _, label in columns)], body),
        ["method", *(key for key, _ in columns)], rows)


def stability_verdict(stability: dict) -> str:
    """One line on whether the reference's numbers are settled: its chains and samples, the largest gap between
    the two halves of its chains over every AUROC and the NLL gap, against the target."""
    half, target = stability["split_half"], stability["split_half"]["target"]
    return (f"{stability['chains']} chains, {stability['samples']:,} samples: halves of the chains "
            f"{half['max_auroc_gap']:.2f} AUROC points and {half['nll_gap']:.4f} nats apart at most (target "
            f"{target['auroc_points']} and {target['nll_nats']}: {'met' if half['meets'] else 'not met'})")


def stability_table(results: dict) -> Table | None:
    """Whether SGLD's reference numbers are settled (:mod:`apd.evaluation.stability`): each number from all
    chains of the yardstick's reference, from either half of them, the halves' gap and the delete-one-chain
    jackknife standard error."""
    stability = results.get("reference_stability")
    if not stability:
        return None
    numbers, halves = stability["numbers"], stability["split_half"]["numbers"]
    gaps, errors = stability["split_half"]["gaps"], stability["jackknife_se"]
    rows = [["nll", None, None, numbers["nll"], *(h["nll"] for h in halves), gaps["nll"], errors["nll"]]]
    rows += [["auroc", name, score, value, *(h["auroc"][name][score] for h in halves), gaps["auroc"][name][score],
              errors["auroc"][name][score]]
             for name, scores in numbers["auroc"].items() for score, value in scores.items()]
    body = [["test NLL (nats)" if kind == "nll" else f"{score_label(score)} AUROC, {name}",
             *(format_number(v, 4 if kind == "nll" else 2) for v in values)] for kind, name, score, *values in rows]
    note = (f"The yardstick's SGLD reference: {stability_verdict(stability)}. Halves: the chains in a seeded "
            "random order, cut in two; SE: delete-one-chain jackknife.\n\n")
    return Table("stability", "Is the reference settled?", note + markdown_table(
        ["number", "all chains", "half A", "half B", "gap", "SE"], body),
        ["quantity", "set", "score", "all_chains", "half_a", "half_b", "gap", "jackknife_se"], rows)


def timing_table(results: dict) -> Table | None:
    """Wall-clock seconds of each evaluation step: per method, loading (or fitting) it and judging its
    draws; then the steps over all methods; the total last."""
    timing = results.get("timing")
    if not timing:
        return None
    loading = timing.get("loading", {})
    methods = set(results.get("methods", []))
    steps = methods_in_order(results, (k for k in timing if k not in ("total", "loading")))
    steps += ["total"] if "total" in timing else []
    rows = [[step, loading.get(step), timing[step], timing[step] + loading.get(step, 0.0)] for step in steps]
    body = [[method_label(step), "" if load is None else f"{load:,.1f}",
             f"{judged:,.1f}" if step in methods else "", f"{total:,.1f}", format_duration(total)]
            for step, load, judged, total in rows]
    return Table("timing", "Timing", markdown_table(["step", "loading s", "judging s", "seconds", "duration"], body),
                 ["step", "loading_seconds", "judging_seconds", "seconds"],
                 [[step, load, judged if step in methods else None, total] for step, load, judged, total in rows])


TABLE_BUILDERS = (accuracy_table, ood_table, mean_auroc_table, storage_table, stability_table, members_table,
                  yardstick_table, kept_margins_table, replicates_table, kept_curve_table, mog_table, fidelity_table,
                  peers_table, adversarial_table, timing_table)


def build_tables(results: dict) -> list[Table]:
    """Every table whose data ``results`` holds, in report order."""
    return [table for build in TABLE_BUILDERS if (table := build(results)) is not None]


def assemble(results: dict, tables: Sequence[Table]) -> str:
    return "\n\n".join([_header(results), *(f"## {t.title}\n\n{t.markdown}" for t in tables)]) + "\n"


def render_tables(results: dict) -> str:
    """The Markdown of ``tables.md``: a header (pipeline, data, runs, ensemble sizes, device, detection
    conventions) and every table laid out as in Wang et al. (2018), so the two can be read side by side."""
    return assemble(results, build_tables(results))


SUMMARY_METHODS = ("sgld", "apd")  # what the pipeline compares: the rows of a run's closing summary


def summary(results: dict, tables_md: object) -> str:
    """What ``apd evaluate`` prints at its end instead of ``tables.md``: SGLD's and APD's accuracy and mean OOD
    AUROC per score (those results.json holds), and where every table is (``tables_md``)."""
    lines = []
    shown = [f"{method_label(m)} {acc.mean:.4f}" for m in SUMMARY_METHODS
             if (acc := stored_accuracy(results, m)) is not None]
    if shown:
        lines.append("accuracy: " + ", ".join(shown))
    ood = results.get("ood") or {}
    for score in _ood_scores(ood):
        shown = [f"{method_label(m)} {value:.1f}" for m in SUMMARY_METHODS
                 if (value := mean_auroc(results, m, score)) is not None]
        if shown:
            lines.append(f"mean OOD AUROC, {score_label(score)}: " + ", ".join(shown))
    lines.append(f"every table: {tables_md}")
    return "\n".join(lines)

