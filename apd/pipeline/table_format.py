"""The cells and layout of the report's tables: :class:`Table` (one section's Markdown and the same numbers as
CSV rows, built once so the two cannot disagree), the order and labels of methods and scores, the formatting
of numbers, sizes and durations ("—" for an absent value, "n/a" for a score a method cannot have), Markdown
tables and CSV files.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apd.io import write_text_atomic
from apd.methods import ALL_METHODS, label
from apd.metrics import Stat

SCORE_ORDER = ("variation_ratio", "bald", "entropy", "max_prob", "model_variance")
SCORE_LABELS = {"variation_ratio": "variation ratio", "bald": "BALD", "entropy": "predictive entropy",
                "max_prob": "max probability", "model_variance": "model variance"}
HISTOGRAM_SCORES = ("variation_ratio", "bald")
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
    return ordered(present, [*results.get("methods", []), *ALL_METHODS])


def method_label(method: str) -> str:
    """A method's label (:func:`apd.methods.label`)."""
    return label(method)


def score_label(score: str) -> str:
    return SCORE_LABELS.get(score, score)


def format_number(value: float | None, digits: int) -> str:
    """``value`` with ``digits`` decimals; an absent or non-finite value is a dash."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:.{digits}f}"


def format_gap(value: float | Mapping | Stat | None, digits: int = 1) -> str:
    """A signed gap (a stored value, :meth:`~apd.metrics.Stat.of`: plain, mean ± std, or random subsets' mean
    and 5–95 % band); "n/a" where undefined (one network has no BALD)."""
    stat = Stat.of(value)
    if stat is None:
        return UNDEFINED
    if stat.band is not None:
        return f"{stat.mean:+.{digits}f} [{stat.band[0]:+.{digits}f}, {stat.band[1]:+.{digits}f}]"
    if stat.std is not None:
        return f"{stat.mean:+.{digits}f} ±{format_number(stat.std, digits)}"
    return f"{stat.mean:+.{digits}f}" if math.isfinite(stat.mean) else MISSING


def mean_std(value: Mapping | Stat | None, digits: int) -> str:
    """``mean ± std`` of a stored summary (:meth:`~apd.metrics.Stat.of`), or for random subsets with a 5–95 %
    band the mean and the band."""
    stat = Stat.of(value)
    if stat is None:
        return MISSING
    if stat.band is not None:
        return f"{format_number(stat.mean, digits)} [{format_number(stat.band[0], digits)}, " \
               f"{format_number(stat.band[1], digits)}]"
    return f"{format_number(stat.mean, digits)} ± {format_number(stat.std, digits)}"


def win_mark(beats: bool, winning: int | None = None, seeds: int = 1) -> str:
    """A comparison's mark: " ✓" for a win; for a method replicated over ``seeds`` generator seeds of which
    ``winning`` win, " ✓" only where every seed wins and " (k of K)" where only some do."""
    if winning is None:
        return " ✓" if beats else ""
    if winning == seeds:
        return " ✓"
    return f" ({winning} of {seeds})" if winning else ""


def percent_of(share: float | None) -> str:
    """A fraction of SGLD's value as a percentage with one decimal (0.993 → 99.3)."""
    return MISSING if share is None else format_number(100.0 * share, 1)


def format_sample_count(value: float | None) -> str:
    """A number of SGLD samples' worth: three significant digits below 100, whole numbers above."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def human_bytes(count: int) -> str:
    """Bytes in binary units: 1536 → 1.5 KiB."""
    value, units = float(count), ("B", "KiB", "MiB", "GiB", "TiB")
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{count} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def format_duration(seconds: float) -> str:
    """Seconds as people read them, rounded to what is shown: tenths of a second under a minute, whole
    seconds under an hour, whole minutes beyond (59.96 s is "1 min 0 s", never "60.0 s" or "0 min 60 s")."""
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min"


def spoken_list(items: Sequence[str]) -> str:
    """Items as prose: ``a``, ``a and b``, ``a, b and c``; empty for none."""
    return " and ".join(filter(None, [", ".join(items[:-1]), *items[-1:]]))


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def write_csv(path: Path, table: Table) -> None:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(table.columns)
    writer.writerows(table.rows)
    write_text_atomic(path, text.getvalue())
