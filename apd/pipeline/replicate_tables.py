"""The report's table of a method distilled with several generator seeds (:mod:`apd.pipeline.replicates`):
each seed's values, their mean ± std (ddof 1) across the seeds, each seed's percentile rank among the
random kept subsets on every gap to SGLD, and how many seeds win; then the verdict in plain words,
written from the same numbers.
"""

from __future__ import annotations

from apd.pipeline.comparison_tables import GAP_DIGITS, GAP_LABELS
from apd.pipeline.table_format import (
    MISSING,
    UNDEFINED,
    Table,
    format_gap,
    format_number,
    format_sample_count,
    markdown_table,
    method_label,
    spoken_list,
)

VALUE_ROWS = (("acc", "accuracy", 4), ("nll", "NLL", 3), ("mean_bald_auroc", "mean BALD AUROC", 1))


def _spread(value: dict | None, digits: int, signed: bool = False) -> str:
    """``mean ± std`` over the seeds (sample std)."""
    if value is None:
        return UNDEFINED
    mean = f"{value['mean']:+.{digits}f}" if signed else format_number(value["mean"], digits)
    return f"{mean} ± {format_number(value['std'], digits)}"


def verdict(method: str, entry: dict, size: str, worth: float, subsets: int) -> str:
    """One paragraph: on which gaps to SGLD ``method`` wins against its kept samples of ``size`` for every seed
    and for only some, its percentile rank on each (mean ± std over the seeds) and the set-by-set
    comparisons every seed wins."""
    found, seeds = entry["against"][size], entry["seeds"]
    label = method_label(method)
    counts = {key: found["beats"][key] for key in GAP_LABELS}
    every = [GAP_LABELS[key] for key, count in counts.items() if count == seeds]
    some = [f"{GAP_LABELS[key]} ({count} of {seeds})" for key, count in counts.items()
            if count is not None and 0 < count < seeds]
    if not every and not some:
        wins = "on no summary for any seed"
    elif not every:
        wins = f"on no summary for every seed; for some, on {spoken_list(some)}"
    else:
        wins = f"on {spoken_list(every)} for every seed" + (f", and on {spoken_list(some)} for some" if some else "")
    ranks = "; ".join(f"{GAP_LABELS[key]} {_spread(found['percentile'][key], 1)}" for key in GAP_LABELS
                      if found["percentile"][key] is not None)
    return (f"Across its {seeds} generator seeds, {label} ({format_sample_count(worth)} SGLD samples' worth) wins "
            f"against its kept samples \"{size}\" {wins}. Its percentile rank among the {subsets} random subsets "
            f"stratified by chain, mean ± std over the seeds: {ranks}. Set by set, {found['wins_every_seed']} of the "
            f"{found['compared']} comparisons are won by every seed (each seed's wins: "
            f"{', '.join(map(str, found['wins']))}).")


def replicates_table(results: dict) -> Table | None:
    """Every replicated method (``results["replicates"]``): one row per value (accuracy, NLL, mean BALD AUROC)
    and per gap to SGLD against each of its kept-samples rows, each seed's number, the mean ± std across the
    seeds, each seed's percentile rank and how many seeds win (✓: every one); then :func:`verdict`."""
    replicates = results.get("replicates")
    if not replicates:
        return None
    blocks, rows = [], []
    for method, entry in replicates.items():
        seeds, per_seed = entry["seeds"], entry["per_seed"]
        body = []
        for key, name, digits in VALUE_ROWS:
            values = [format_number(s[key], digits) if s[key] is not None else UNDEFINED for s in per_seed]
            body.append([name, MISSING, *values, _spread(entry["values"][key], digits), "", "", ""])
            rows.append([method, key, "", *(s[key] for s in per_seed), *_csv(entry["values"][key]), None, None, None])
        verdicts = []
        storage = results["yardstick"]["equal_storage"][method]
        for size, found in entry["against"].items():
            for key in GAP_DIGITS:
                digits, count = GAP_DIGITS[key], found["beats"][key]
                standing = [s["against"][size]["standings"][key] for s in per_seed]
                values = [format_gap(s[key], digits) for s in per_seed]
                ranks = UNDEFINED if count is None else ", ".join(f"{st['percentile']:.1f}" for st in standing)
                body.append([GAP_LABELS[key], size, *values, _spread(entry["values"][key], digits, signed=True), ranks,
                             _spread(found["percentile"][key], 1),
                             UNDEFINED if count is None else f"{count} of {seeds}" + (" ✓" if count == seeds else "")])
                rows.append([method, key, size, *(s[key] for s in per_seed), *_csv(entry["values"][key]),
                             *_csv(found["percentile"][key]), count])
            body.append(["set by set", size, *(f"{w}/{found['compared']}" for w in found["wins"]), "", "", "",
                         f"{found['wins_every_seed']}/{found['compared']} won by every seed"])
            rows.append([method, "set_by_set_wins", size, *found["wins"], None, None, None, None,
                         found["wins_every_seed"]])
            subsets = results["yardstick"]["kept"][size]["subsets"]
            verdicts.append(verdict(method, entry, size, storage["in_sgld_samples"], subsets))
        header = ["summary", "kept", *(f"seed {s['seed']}" for s in per_seed), "mean ± std", "percentile rank by seed",
                  "percentile mean ± std", "seeds that win"]
        heading = f"### {method_label(method)}\n\n" if len(replicates) > 1 else ""
        blocks.append(heading + markdown_table(header, body) + "\n\n" + "\n\n".join(verdicts))
    note = ("Each generator seed judged as the main tables judge seed 0, against the same kept samples: its "
            "values (means over the runs), their mean ± sample standard deviation across the seeds (ddof 1), each "
            "seed's percentile rank among the random subsets on every gap to SGLD, and how many seeds win that "
            "comparison; a win counts only where every seed wins (✓).\n\n")
    count = max(entry["seeds"] for entry in replicates.values())
    return Table("replicates", "Generator seeds", note + "\n\n".join(blocks),
                 ["method", "summary", "kept", *(f"seed_{k}" for k in range(count)), "mean", "std",
                  "percentile_mean", "percentile_std", "seeds_winning"], rows)


def _csv(value: dict | None) -> tuple:
    """A mean ± std's CSV fields."""
    return (None, None) if value is None else (value["mean"], value["std"])
