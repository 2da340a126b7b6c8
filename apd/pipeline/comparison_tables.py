"""The report's tables that set the methods against SGLD and against each other: every method at its own
and at a common ensemble size, the kept-samples yardstick and its storage curve, how the peers' settings were
chosen, and adversarial-example detection (gray-box across methods, white-box on each).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apd.evaluation.yardstick import (
    FIXED,
    RANK_RULE,
    ranked,
    summary_standings,
    wins_over_kept,
)
from apd.metrics import Stat
from apd.pipeline.results import accuracy, kept_keys, mean_auroc, set_aurocs
from apd.pipeline.table_format import (
    MISSING,
    UNDEFINED,
    Table,
    format_gap,
    format_number,
    format_sample_count,
    markdown_table,
    mean_std,
    method_label,
    methods_in_order,
    ordered,
    score_label,
    win_mark,
)

ADVERSARIAL_SCORE_ORDER = ("entropy", "bald", "model_variance")  # the scores of the paper's adversarial study


def _plain(value: float | dict | Stat | None, digits: int) -> str:
    """The mean of a stored value (:meth:`~apd.metrics.Stat.of`); "n/a" where undefined."""
    stat = Stat.of(value)
    return UNDEFINED if stat is None else format_number(stat.mean, digits)



def _mean_and_std(value: dict | None) -> tuple[float | None, float | None]:
    """A stored summary's mean and std (:meth:`~apd.metrics.Stat.of`) as CSV fields; (None, None) where undefined."""
    stat = Stat.of(value)
    return (None, None) if stat is None else (stat.mean, stat.std)


QUALITY_NOTE = ("Gaps to SGLD (the yardstick, `apd/evaluation/yardstick.py`): worst per-set AUROC gap = max over the "
                "OOD sets of SGLD's AUROC − the method's, in percent points (positive: below SGLD on some set); NLL "
                "gap = NLL − SGLD's NLL (nats); KL = mean over test inputs of KL(SGLD's predictive ‖ the method's), "
                "SGLD's predictive over {samples} stored samples.")  # results written before two-sided gaps
GAPS_NOTE = ("Gaps to SGLD (the yardstick, `apd/evaluation/yardstick.py`), smaller is better: worst per-set "
             "AUROC gap = max over the OOD sets of |SGLD's AUROC − the method's|, in percent points (above or "
             "below SGLD alike); NLL gap = {nll}; KL = mean over the inputs of KL(SGLD's predictive ‖ the "
             "method's), on the test inputs and (OOD) on each OOD set, averaged over the sets; BALD per input = mean "
             "over the inputs of |the method's BALD − SGLD's| (nats), likewise; SGLD's predictive and BALD over "
             "{samples} stored samples. {draws}")
PER_DRAW = dict(nll="|NLL − SGLD's NLL| (nats, above or below alike)",
                draws="A method's gaps are the means over its runs of each run's gap (one draw of its ensemble, as "
                      "each random subset is one draw of kept samples).")
# results written before the gaps per draw: AUROC gaps of the runs' mean, NLL gap signed
OF_THE_MEAN = dict(nll="NLL − SGLD's NLL (nats, signed)",
                   draws="These results were written before gaps per draw: a method's AUROC gaps are those of its "
                         "mean AUROC over the runs, smaller than the mean of its runs' gaps wherever its draws "
                         "scatter about SGLD's value, where each random subset is one draw, so its percentile ranks "
                         "lean in its favour (SGLD's own ensemble, whose runs' mean is the reference, has AUROC gaps "
                         "of 0); `apd evaluate` run again gives the gaps per draw and the two-sided NLL gap.")
REPLICATED_NOTE = (" A method distilled with several generator seeds shows seed 0's values; its ✓ means that every "
                   "seed wins, \"(k of K)\" that k of its K seeds do, and its wins are those every seed wins, then "
                   "each seed's count (every seed: the table of generator seeds).")


def replicated_note(results: dict) -> str:
    """:data:`REPLICATED_NOTE` for results with several generator seeds, else nothing."""
    return REPLICATED_NOTE if results.get("replicates") else ""


GAP_LABELS = {"bald_gap": "worst BALD gap", "max_prob_gap": "worst max-prob gap", "nll_gap": "NLL gap", "kl": "KL",
              "kl_ood": "KL (OOD)", "input_bald_gap": "BALD per input", "input_bald_gap_ood": "BALD per input (OOD)"}
GAP_DIGITS = {"bald_gap": 1, "max_prob_gap": 1, "nll_gap": 3, "kl": 4, "kl_ood": 4, "input_bald_gap": 4,
              "input_bald_gap_ood": 4}


def quality_note(results: dict) -> str:
    """The note on the gaps to SGLD that ``results`` were computed with: per draw where they hold
    ``set_gaps``, else of the runs' mean (two-sided AUROC gaps where they hold ``kl_ood``)."""
    samples = results.get("yardstick", {}).get("reference", {}).get("kl_samples", "?")
    rows = (results.get("quality") or {}).values()
    if any("set_gaps" in row for row in rows):
        return GAPS_NOTE.format(samples=samples, **PER_DRAW)
    if any("kl_ood" in row for row in rows):
        return GAPS_NOTE.format(samples=samples, **OF_THE_MEAN)
    return QUALITY_NOTE.format(samples=samples)


STORED_AS_COMPACTLY = ("A method stored at a lower precision is also set against the samples its storage S buys "
                       "stored as compactly: each rounded whole at that precision (e.g. \"15 int8\": 15 samples, "
                       "each stored at 8 bits) and, where the results have them, each stored at it as its deviation "
                       "from its chain's mean, the chains' means at the precision of the method's own mean (e.g. "
                       "\"25 int4 around chain means at int8\": their bytes counted).")


def seeds_against(results: dict, method: str, size: str) -> tuple[dict | None, int]:
    """A replicated method's comparisons with the kept samples of ``size`` across its generator seeds
    (:func:`apd.pipeline.replicates.across_seeds`) and the number of seeds; (None, 1) for one generator."""
    entry = (results.get("replicates") or {}).get(method)
    return (None, 1) if entry is None else (entry["against"].get(size), entry["seeds"])


def kept_comparisons(y: dict, method: str) -> list[tuple[str, float, dict]]:
    """The kept samples one method of the yardstick ``y`` is set against, as (their size: "K" float32 samples
    or "K PRECISION", the method's storage S, their :func:`~apd.evaluation.yardstick.kept_samples` row):
    ⌈S⌉ float32 samples, and for a method stored at a lower precision the samples that precision buys."""
    entry, kept = y["equal_storage"][method], y.get("kept", {})
    return [(size, entry["in_sgld_samples"], kept[size]) for size in kept_keys(entry) if size in kept]


def members_table(results: dict) -> Table | None:
    """Every method at its own ensemble size (the main tables' draws) and at ``networks`` members where it
    can draw that many (a kept set, an ensemble or one network cannot: n/a)."""
    q, at = results.get("quality"), results.get("at_networks")
    if not q:
        return None
    methods = methods_in_order(results, q)
    at = at or {}
    networks = next((row["members"] for row in at.values() if row), None)

    def mean_bald(m: str) -> float | None:
        return mean_auroc(results, m, "bald", every_set=True)

    extra = [key for key in ("kl_ood", "input_bald_gap", "input_bald_gap_ood") if key in q[methods[0]]]
    body, rows = [], []
    for m in methods:
        own = q[m]
        cells = [method_label(m), format_sample_count(own["in_sgld_samples"]), f"{own['members']:,}",
                 _plain(accuracy(results, m), 4), _plain(accuracy(results, m, "nll"), 3), _plain(mean_bald(m), 1),
                 format_gap(own["bald_gap"]), format_gap(own["max_prob_gap"]), format_gap(own["nll_gap"], 3),
                 _plain(own["kl"], 4), *(_plain(own[key], 4) for key in extra)]
        row = at.get(m)
        cells += ([UNDEFINED] * 4 if row is None else
                  [_plain(row["acc"], 4), _plain(row["nll"], 3), _plain(row["mean_bald_auroc"], 1),
                   format_gap(row.get("bald_gap"))])
        body.append(cells)
        at_means = [None if row is None or (stat := Stat.of(row.get(key))) is None else stat.mean
                    for key in ("acc", "nll", "mean_bald_auroc", "bald_gap")]
        rows.append([m, own["in_sgld_samples"], own["members"], accuracy(results, m).mean,
                     accuracy(results, m, "nll").mean, mean_bald(m), own["bald_gap"], own["max_prob_gap"],
                     own["nll_gap"], own["kl"], *(own[key] for key in extra), *at_means])
    header = ["method", "storage (SGLD samples)", "members", "accuracy", "NLL", "mean BALD AUROC",
              "worst BALD gap", "worst max-prob gap", "NLL gap", "KL", *(GAP_LABELS[key] for key in extra),
              f"accuracy @{networks}", f"NLL @{networks}", f"mean BALD AUROC @{networks}",
              f"worst BALD gap @{networks}"]
    note = (f"Each method at its own ensemble size (the draws of the tables above) and at {networks} members where "
            "it can draw that many (n/a: a fixed set of fewer members). " + quality_note(results) + "\n\n")
    return Table("members", "Every method against SGLD, at its own size and at a common size", note + markdown_table(
        header, body), ["method", "in_sgld_samples", "members", "acc", "nll", "mean_bald_auroc", "bald_gap",
                        "max_prob_gap", "nll_gap", "kl", *extra, "acc_at_networks", "nll_at_networks",
                        "mean_bald_auroc_at_networks", "bald_gap_at_networks"], rows)


def yardstick_table(results: dict) -> Table | None:
    """The kept-samples yardstick: each method of storage S against ⌈S⌉ SGLD samples simply kept. Results
    with percentile ranks (:func:`~apd.evaluation.yardstick.ranked`) get :func:`ranked_yardstick_table`;
    older ones the method, the evenly spaced samples and the random subsets' mean ± std on the worst per-set
    BALD AUROC gap, the NLL gap and the KL."""
    y, q = results.get("yardstick"), results.get("quality") or {}
    if not y:
        return None
    kept = y.get("kept", {})
    if kept and ranked(next(iter(kept.values()))):
        return ranked_yardstick_table(results)
    body, rows = [], []
    for m in methods_in_order(results, y.get("equal_storage", {})):
        for size, worth, row in kept_comparisons(y, m):
            even, rand, own = row["evenly_spaced"], row["random"], q.get(m, {})
            body.append([method_label(m), format_sample_count(worth), size,
                         format_gap(own.get("bald_gap")), format_gap(even["bald_gap"]), format_gap(rand["bald_gap"]),
                         format_gap(own.get("nll_gap"), 3), format_gap(even["nll_gap"], 3),
                         format_gap(rand["nll_gap"], 3), _plain(own.get("kl"), 4), _plain(even["kl"], 4),
                         mean_std(rand["kl"], 4)])
            rows.append([m, worth, size, own.get("bald_gap"), even["bald_gap"], *_mean_and_std(rand["bald_gap"]),
                         own.get("nll_gap"), even["nll_gap"], *_mean_and_std(rand["nll_gap"]), own.get("kl"),
                         even["kl"], *_mean_and_std(rand["kl"])])
    if not body:
        return None
    subsets = next(iter(kept.values()))["subsets"] if kept else 0
    note = (f"For each method of storage S: the method, ⌈S⌉ kept SGLD samples evenly spaced over the store, and the "
            f"mean ± std over {subsets} random subsets of ⌈S⌉ samples. " + STORED_AS_COMPACTLY
            + " A compressed posterior is useful where it beats the kept samples. "
            + quality_note(results) + "\n\n")
    header = ["method", "S", "⌈S⌉", "BALD gap: method", "kept", "random", "NLL gap: method", "kept", "random",
              "KL: method", "kept", "random"]
    return Table("yardstick", "The kept-samples yardstick at equal storage", note + markdown_table(header, body),
                 ["method", "in_sgld_samples", "k", "bald_gap", "kept_bald_gap", "random_bald_gap",
                  "random_bald_gap_std", "nll_gap", "kept_nll_gap", "random_nll_gap", "random_nll_gap_std", "kl",
                  "kept_kl", "random_kl", "random_kl_std"], rows)


def ranked_yardstick_table(results: dict) -> Table | None:
    """Each method of storage S against its ⌈S⌉ kept SGLD samples on every gap to SGLD
    (:func:`~apd.evaluation.yardstick.summary_standings`): the method's gap, the evenly spaced and the last
    samples' gaps, the random subsets' 5–95 % band, the method's percentile rank among the subsets, and ✓
    where it wins (a method with several generator seeds: seed 0's values, ✓ where every seed wins and "k of
    K" where some do)."""
    y, q = results["yardstick"], results.get("quality") or {}
    body, rows = [], []
    for m in methods_in_order(results, y.get("equal_storage", {})):
        for size, worth, row in kept_comparisons(y, m):
            seeds, count = seeds_against(results, m, size)
            for key, found in summary_standings(q.get(m, {}), row).items():
                digits = GAP_DIGITS[key]
                winning = None if seeds is None else seeds["beats"][key]
                beats = found is not None and (found["beats"] if seeds is None else winning == count)
                cells = ([UNDEFINED] * 5 if found is None else
                         [format_gap(found["gap"], digits), *(format_gap(g, digits) for g in found["fixed"]),
                          f"{format_gap(found['band'][0], digits)} … {format_gap(found['band'][1], digits)}",
                          f"{found['percentile']:.1f}" + win_mark(found["beats"], winning, count)])
                body.append([method_label(m), format_sample_count(worth), size, GAP_LABELS[key], *cells])
                rows.append([m, worth, size, key, *((None,) * 7 if found is None else
                                                    (found["gap"], *found["fixed"], *found["band"],
                                                     found["percentile"], beats))])
    if not body:
        return None
    subsets = next(iter(y["kept"].values()))["subsets"]
    note = (f"For each method of storage S, on each gap to SGLD: the method, ⌈S⌉ kept SGLD samples centred in equal "
            f"parts of each chain (evenly spaced) and the last samples of each chain, the 5–95 % band of {subsets} "
            "random subsets of ⌈S⌉ samples stratified by chain, and the method's percentile rank among those subsets. "
            + RANK_RULE + replicated_note(results) + " " + STORED_AS_COMPACTLY + " "
            + quality_note(results) + "\n\n")
    header = ["method", "S", "⌈S⌉", "gap", "method", "evenly spaced", "last", "random 5–95 %", "percentile rank"]
    return Table("yardstick", "The kept-samples yardstick at equal storage", note + markdown_table(header, body),
                 ["method", "in_sgld_samples", "k", "gap", "value", *(f"{name}_value" for name in FIXED),
                  "random_p5", "random_p95", "percentile", "wins"], rows)


def _margin_cell(margin: dict | None, digits: int = 1, winning: int | None = None, seeds: int = 1) -> str:
    """A set-by-set comparison: the gap, its percentile rank and ✓ for a win (of every seed's, ``winning`` of
    ``seeds`` for a replicated method: :func:`~apd.pipeline.table_format.win_mark`); older results' margins
    over the evenly spaced samples and the random subsets' mean ± their std."""
    if margin is None:
        return UNDEFINED
    if "percentile" in margin:
        return f"{margin['gap']:.{digits}f} ({margin['percentile']:.0f})" + win_mark(margin["beats"], winning, seeds)
    return (f"{margin['over_kept']:+.{digits}f} / {margin['over_random']:+.{digits}f} "
            f"±{format_number(margin['random_std'], digits)}" + (" ✓" if margin["beats"] else ""))


def _margin_values(margin: dict | None, winning: int | None = None, seeds: int = 1) -> tuple:
    """A comparison's CSV fields: gap, percentile rank, band and win (every seed's, ``winning`` of ``seeds``
    for a replicated method); older results' margins, std and win."""
    if margin is None:
        return (None,) * 4
    if "percentile" in margin:
        return (margin["gap"], margin["percentile"], *margin["band"],
                margin["beats"] if winning is None else winning == seeds)
    return margin["over_kept"], margin["over_random"], margin["random_std"], margin["beats"]


def kept_margins_table(results: dict) -> Table | None:
    """Each method of storage S against its ⌈S⌉ kept SGLD samples per OOD set, for BALD and max_prob, and on
    the NLL (:func:`apd.evaluation.yardstick.wins_over_kept`); None for results whose yardstick does not
    hold the kept samples' per-set AUROCs."""
    y, ood = results.get("yardstick") or {}, results.get("ood", {})
    kept, sets = y.get("kept", {}), sorted(ood)
    if not kept or "auroc" not in next(iter(kept.values()))["evenly_spaced"]:
        return None
    by_ranks = ranked(next(iter(kept.values())))
    reference = y["reference"]
    sgld_auroc = {"bald": reference["bald_auroc"], "max_prob": reference["max_prob_auroc"]}

    def wins(m: str, row: dict) -> dict:
        aurocs = {score: set_aurocs(results, m, score) for score in ("bald", "max_prob")}
        own = (results.get("quality") or {}).get(m, {})
        return wins_over_kept(own, aurocs, accuracy(results, m, "nll").mean, row, sgld_auroc)

    def sgld_wins(row: dict) -> str:  # the reference itself against the same kept samples
        if accuracy(results, "sgld", "nll") is None:
            return UNDEFINED
        found = wins("sgld", row)
        return f"{found['wins']}/{found['compared']}"

    body, rows = [], []
    for m in methods_in_order(results, y.get("equal_storage", {})):
        for size, worth, row in kept_comparisons(y, m):
            found = wins(m, row)
            seeds, count = seeds_against(results, m, size)
            by_set = None if seeds is None else seeds["set_by_set"]
            won = (f"{found['wins']}/{found['compared']}" if seeds is None else
                   f"{seeds['wins_every_seed']}/{seeds['compared']} (seeds: {', '.join(map(str, seeds['wins']))})")
            for score in ("bald", "max_prob"):
                body.append([method_label(m), format_sample_count(worth), size, score_label(score),
                             *(_margin_cell(found["auroc"][score][name], 1,
                                            None if by_set is None else by_set["auroc"][score][name], count)
                               for name in sets),
                             _margin_cell(found["nll"], 3, None if by_set is None else by_set["nll"], count)
                             if score == "bald" else "",
                             won if score == "bald" else "", sgld_wins(row) if score == "bald" else ""])
                rows += [[m, worth, size, score, name,
                          *_margin_values(found["auroc"][score][name],
                                          None if by_set is None else by_set["auroc"][score][name], count)]
                         for name in sets]
            if found["nll"] is not None:
                rows.append([m, worth, size, "nll", "test",
                             *_margin_values(found["nll"], None if by_set is None else by_set["nll"], count)])
    if not body:
        return None
    if by_ranks:
        note = ("Each method of storage S against ⌈S⌉ SGLD samples simply kept (and, stored at a lower precision, "
                "against the samples its storage buys stored as compactly): per OOD set, the method's absolute AUROC "
                "gap to SGLD (percent points; NLL: its NLL gap, nats) and in brackets its percentile rank among the "
                "random subsets; ✓ where it wins. " + RANK_RULE + replicated_note(results) + " Wins: the comparisons "
                "won, of those defined. SGLD's wins: the same count for SGLD's own ensemble against the same kept "
                "samples, the most a method that matched SGLD could win.\n\n")
        fields = ["gap", "percentile", "random_p5", "random_p95", "wins"]
    else:
        note = ("Each method of storage S against ⌈S⌉ SGLD samples simply kept (and, stored at a lower precision, "
                "against the samples its storage buys stored as compactly): per OOD set, the method's AUROC minus "
                "that of the evenly spaced samples / minus the mean over the random subsets, ± the subsets' std "
                "(percent points; NLL: the kept samples' NLL minus the method's, nats), so positive means the method "
                "is better; ✓ where both margins exceed that std. Wins: the comparisons beaten, of those defined. "
                "SGLD's wins: the same count for SGLD's own ensemble against the same kept samples, the most a "
                "method that matched SGLD could win.\n\n")
        fields = ["over_kept", "over_random", "random_std", "beats"]
    header = ["method", "S", "⌈S⌉", "score", *sets, "NLL", "wins", "SGLD's wins"]
    return Table("kept_margins", "Against the kept samples, set by set", note + markdown_table(header, body),
                 ["method", "in_sgld_samples", "k", "score", "set", *fields], rows)


def kept_curve_table(results: dict) -> Table | None:
    """Storage against quality for k kept SGLD samples (k of ``evaluate.yardstick_sizes``): evenly spaced,
    the random subsets (mean ± std, or mean and 5–95 % band), and where the results hold them the last samples
    of each chain and the function-space gaps on the OOD sets."""
    curve = (results.get("yardstick") or {}).get("curve")
    if not curve:
        return None
    by_ranks = ranked(curve[0])
    extra = ["kl_ood", "input_bald_gap", "input_bald_gap_ood"] if by_ranks else []
    body, rows = [], []
    for row in curve:
        even, rand = row["evenly_spaced"], row["random"]
        last = [format_gap(row["last"]["bald_gap"]), format_gap(row["last"]["nll_gap"], 3),
                _plain(row["last"]["kl"], 4)] if by_ranks else []
        body.append([str(row["k"]), _plain(even["acc"], 4), _plain(even["nll"], 3), _plain(even["mean_bald_auroc"], 1),
                     format_gap(even["bald_gap"]), format_gap(even["max_prob_gap"]), format_gap(even["nll_gap"], 3),
                     _plain(even["kl"], 4), *(_plain(even[key], 4) for key in extra), *last,
                     format_gap(rand["bald_gap"]), format_gap(rand["max_prob_gap"]),
                     format_gap(rand["nll_gap"], 3), mean_std(rand["kl"], 4)])
        rows.append([row["k"], even["acc"], even["nll"], even["mean_bald_auroc"], even["bald_gap"],
                     even["max_prob_gap"], even["nll_gap"], even["kl"], *(even[key] for key in extra),
                     *((row["last"][key] for key in ("bald_gap", "nll_gap", "kl")) if by_ranks else ()),
                     *(value for key in ("bald_gap", "max_prob_gap", "nll_gap", "kl")
                       for value in _mean_and_std(rand[key]))])
    if by_ranks:
        note = ("k SGLD samples kept centred in equal parts of each chain (storage k), the last k of the chains (each "
                "chain's share from its end), then the mean and 5–95 % band over random subsets of k stratified by "
                "chain. " + quality_note(results) + "\n\n")
    else:
        note = ("k SGLD samples kept evenly spaced over the store (storage k), then the mean ± std over random "
                "subsets of k. " + quality_note(results) + "\n\n")
    header = ["k", "accuracy", "NLL", "mean BALD AUROC", "worst BALD gap", "worst max-prob gap", "NLL gap", "KL",
              *(GAP_LABELS[key] for key in extra), *(["last: BALD gap", "NLL gap", "KL"] if by_ranks else []),
              "random: BALD gap", "max-prob gap", "NLL gap", "KL"]
    return Table("kept_curve", "Kept SGLD samples: storage against quality", note + markdown_table(header, body),
                 ["k", "acc", "nll", "mean_bald_auroc", "bald_gap", "max_prob_gap", "nll_gap", "kl", *extra,
                  *(["last_bald_gap", "last_nll_gap", "last_kl"] if by_ranks else []),
                  "random_bald_gap", "random_bald_gap_std", "random_max_prob_gap", "random_max_prob_gap_std",
                  "random_nll_gap", "random_nll_gap_std", "random_kl", "random_kl_std"], rows)


def peers_table(results: dict) -> Table | None:
    """What fitting each peer chose, and on which data: SWAG's learning rate, the Laplace approximations'
    prior precisions and scales, the kept and Stein-thinned samples, the mode mixture's scale."""
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
    if "modes" in peers:
        mo = peers["modes"]
        add("modes", "modes, shares", f"{mo['modes']}: " + ", ".join(f"{w:g}" for w in mo["shares"]),
            "one per SGLD chain, weighted by its share of the stored samples")
        if "aligned" in mo:
            losses = mo["val_nll"]
            add("modes", "each chain's mean", ", ".join("aligned" if a else "as stored" for a in mo["aligned"]),
                f"as stored or over the chain's samples aligned as APD's are ({mo['align']}), whichever network "
                "has the lower validation NLL (" + "; ".join(
                    f"chain {m}: {s:.3f} as stored, {a:.3f} aligned"
                    for m, (s, a) in enumerate(zip(losses["as_stored"], losses["aligned"], strict=True))) + ")")
        add("modes", "spread scale α", f"{mo['scale']:g}",
            f"{mo['scale_rule']} (Kronecker factors with {mo['kronecker_rank']} input directions per layer)")
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
