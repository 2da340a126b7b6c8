"""The report's tables that set the methods against SGLD and against each other: every method at its own
and at a common ensemble size, the kept-samples yardstick and its storage curve, how the peers' settings were
chosen, and adversarial-example detection (gray-box across methods, white-box on each).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from apd.evaluation.yardstick import margins_over_kept, mean_of
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
)

ADVERSARIAL_SCORE_ORDER = ("entropy", "bald", "model_variance")  # the scores of the paper's adversarial study


def _plain(value: float | dict | None, digits: int) -> str:
    if value is None:
        return UNDEFINED
    return format_number(mean_of(value), digits)


QUALITY_NOTE = ("Gaps to SGLD (the yardstick, `apd/evaluation/yardstick.py`): worst per-set AUROC gap = max over the "
                "OOD sets of SGLD's AUROC − the method's, in percent points (positive: below SGLD on some set); NLL "
                "gap = NLL − SGLD's NLL (nats); KL = mean over test inputs of KL(SGLD's predictive ‖ the method's), "
                "SGLD's predictive over {samples} stored samples.")


def kept_comparisons(y: dict, method: str) -> list[tuple[str, float, dict]]:
    """The kept samples one method of the yardstick ``y`` is set against, as (their size: "K" float32 samples
    or "K PRECISION", the method's storage S, their :func:`~apd.evaluation.yardstick.kept_samples` row):
    ⌈S⌉ float32 samples, and for a method stored at a lower precision the samples that precision buys."""
    entry, kept = y["equal_storage"][method], y.get("kept", {})
    found = [(str(entry["k"]), kept.get(str(entry["k"])))]
    if "at_precision" in entry:
        found.append((entry["at_precision"]["key"], kept.get(entry["at_precision"]["key"])))
    return [(size, entry["in_sgld_samples"], row) for size, row in found if row is not None]


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
                 _plain(acc[m]["acc"], 4), _plain(acc[m]["nll"], 3), _plain(mean_bald(m), 1),
                 format_gap(own["bald_gap"]), format_gap(own["max_prob_gap"]), format_gap(own["nll_gap"], 3),
                 _plain(own["kl"], 4)]
        row = at.get(m)
        cells += ([UNDEFINED] * 4 if row is None else
                  [_plain(row["acc"], 4), _plain(row["nll"], 3), _plain(row["mean_bald_auroc"], 1),
                   format_gap(row.get("bald_gap"))])
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
        for size, worth, row in kept_comparisons(y, m):
            even, rand, own = row["evenly_spaced"], row["random"], q.get(m, {})
            body.append([method_label(m), format_sample_count(worth), size,
                         format_gap(own.get("bald_gap")), format_gap(even["bald_gap"]), format_gap(rand["bald_gap"]),
                         format_gap(own.get("nll_gap"), 3), format_gap(even["nll_gap"], 3),
                         format_gap(rand["nll_gap"], 3), _plain(own.get("kl"), 4), _plain(even["kl"], 4),
                         mean_std(rand["kl"], 4)])
            rows.append([m, worth, size, own.get("bald_gap"), even["bald_gap"],
                         None if rand["bald_gap"] is None else rand["bald_gap"]["mean"],
                         None if rand["bald_gap"] is None else rand["bald_gap"]["std"], own.get("nll_gap"),
                         even["nll_gap"], rand["nll_gap"]["mean"], rand["nll_gap"]["std"], own.get("kl"), even["kl"],
                         rand["kl"]["mean"], rand["kl"]["std"]])
    if not body:
        return None
    subsets = next(iter(kept.values()))["subsets"] if kept else 0
    note = (f"For each method of storage S: the method, ⌈S⌉ kept SGLD samples evenly spaced over the store, and the "
            f"mean ± std over {subsets} random subsets of ⌈S⌉ samples. A method stored at a lower precision is also "
            "set against the samples that precision buys with S (e.g. \"15 int8\": 15 samples, each stored at 8 "
            "bits). A compressed posterior is useful where it beats the kept samples. "
            + QUALITY_NOTE.format(samples=y["reference"]["kl_samples"]) + "\n\n")
    header = ["method", "S", "⌈S⌉", "BALD gap: method", "kept", "random", "NLL gap: method", "kept", "random",
              "KL: method", "kept", "random"]
    return Table("yardstick", "The kept-samples yardstick at equal storage", note + markdown_table(header, body),
                 ["method", "in_sgld_samples", "k", "bald_gap", "kept_bald_gap", "random_bald_gap",
                  "random_bald_gap_std", "nll_gap", "kept_nll_gap", "random_nll_gap", "random_nll_gap_std", "kl",
                  "kept_kl", "random_kl", "random_kl_std"], rows)


def _margin_cell(margin: dict | None, digits: int = 1) -> str:
    if margin is None:
        return UNDEFINED
    return (f"{margin['over_kept']:+.{digits}f} / {margin['over_random']:+.{digits}f} "
            f"±{format_number(margin['random_std'], digits)}" + (" ✓" if margin["beats"] else ""))


def kept_margins_table(results: dict) -> Table | None:
    """Each method of storage S against its ⌈S⌉ kept SGLD samples per OOD set, for BALD and max_prob, and on
    the NLL (:func:`apd.evaluation.yardstick.margins_over_kept`); None for results whose yardstick does not
    hold the kept samples' per-set AUROCs."""
    y, ood, acc = results.get("yardstick") or {}, results.get("ood", {}), results.get("accuracy", {})
    kept, sets = y.get("kept", {}), sorted(ood)
    if not kept or "auroc" not in next(iter(kept.values()))["evenly_spaced"]:
        return None
    def aurocs(m: str) -> dict:
        return {score: {name: None if (d := ood[name].get(score, {}).get(m)) is None else d["auroc"]["mean"]
                        for name in sets} for score in ("bald", "max_prob")}

    def sgld_wins(row: dict) -> str:  # the reference itself against the same kept samples
        if "sgld" not in acc:
            return UNDEFINED
        found = margins_over_kept(aurocs("sgld"), acc["sgld"]["nll"]["mean"], row)
        return f"{found['wins']}/{found['compared']}"

    body, rows = [], []
    for m in methods_in_order(results, y.get("equal_storage", {})):
        own = aurocs(m)
        for size, worth, row in kept_comparisons(y, m):
            found = margins_over_kept(own, acc[m]["nll"]["mean"], row)
            for score in ("bald", "max_prob"):
                body.append([method_label(m), format_sample_count(worth), size,
                             score_label(score), *(_margin_cell(found["auroc"][score][name]) for name in sets),
                             _margin_cell(found["nll"], 3) if score == "bald" else "",
                             f"{found['wins']}/{found['compared']}" if score == "bald" else "",
                             sgld_wins(row) if score == "bald" else ""])
                rows += [[m, worth, size, score, name,
                          *((None,) * 4 if (g := found["auroc"][score][name]) is None else
                            (g["over_kept"], g["over_random"], g["random_std"], g["beats"]))] for name in sets]
            if found["nll"] is not None:
                g = found["nll"]
                rows.append([m, worth, size, "nll", "test", g["over_kept"], g["over_random"], g["random_std"],
                             g["beats"]])
    if not body:
        return None
    note = ("Each method of storage S against ⌈S⌉ SGLD samples simply kept (and, stored at a lower precision, "
            "against the samples that precision buys): per OOD set, the method's AUROC minus "
            "that of the evenly spaced samples / minus the mean over the random subsets, ± the subsets' std "
            "(percent points; NLL: the kept samples' NLL minus the method's, nats), so positive means the method is "
            "better; ✓ where both margins exceed that std. Wins: the comparisons beaten, of those defined. SGLD's "
            "wins: the same count for SGLD's own ensemble against the same kept samples, the most a method that "
            "matched SGLD could win.\n\n")
    header = ["method", "S", "⌈S⌉", "score", *sets, "NLL", "wins", "SGLD's wins"]
    return Table("kept_margins", "Against the kept samples, set by set", note + markdown_table(header, body),
                 ["method", "in_sgld_samples", "k", "score", "set", "over_kept", "over_random", "random_std", "beats"],
                 rows)


def kept_curve_table(results: dict) -> Table | None:
    """Storage against quality for k kept SGLD samples (k of ``evaluate.yardstick_sizes``)."""
    curve = (results.get("yardstick") or {}).get("curve")
    if not curve:
        return None
    body, rows = [], []
    for row in curve:
        even, rand = row["evenly_spaced"], row["random"]
        body.append([str(row["k"]), _plain(even["acc"], 4), _plain(even["nll"], 3), _plain(even["mean_bald_auroc"], 1),
                     format_gap(even["bald_gap"]), format_gap(even["max_prob_gap"]), format_gap(even["nll_gap"], 3),
                     _plain(even["kl"], 4), format_gap(rand["bald_gap"]), format_gap(rand["max_prob_gap"]),
                     format_gap(rand["nll_gap"], 3), mean_std(rand["kl"], 4)])
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
