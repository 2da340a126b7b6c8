"""The one rule a distiller is chosen by (docs/design.md, "Choosing a distiller"), applied to candidates judged
on validation images and the OOD tuning pool only.

**Criterion**, per run r of fresh draws: c_r = KL + BALD per input + KL (OOD) + BALD per input (OOD), the four
function-space gaps to SGLD of :func:`apd.evaluation.yardstick.function_gaps` (nats; smaller is better); a
candidate's criterion is their mean over runs, c̄. **Tie-break**: the candidates with c̄ ≤ c̄* + s*, where c̄*
is the lowest mean and s* the population std over runs of that candidate's c_r, are tied; among them the one
with the least storage wins, then the one listed first. Only candidates within the storage budget compete.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from apd.evaluation.yardstick import FUNCTION_KEYS


def run_criterion(summary: dict) -> float:
    """c_r of one run's yardstick summary (:func:`apd.evaluation.yardstick.summarise`): the sum of its
    function-space gaps; a summary without OOD sets has no criterion (``ValueError``)."""
    missing = [key for key in FUNCTION_KEYS if summary.get(key) is None]
    if missing:
        raise ValueError(f"the criterion needs every function-space gap; {missing[0]} is undefined")
    return float(sum(summary[key] for key in FUNCTION_KEYS))


@dataclass(frozen=True)
class Candidate:
    """A distiller judged: its name, its storage (SGLD samples' worth) and its criterion c_r in each run."""

    name: str
    storage: float
    criteria: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.criteria))

    @property
    def std(self) -> float:
        return float(np.std(self.criteria))


def choose(candidates: Sequence[Candidate], budget: float = math.inf) -> dict:
    """The rule (module docstring) among ``candidates`` of at most ``budget`` storage: ``chosen`` (its name),
    ``lowest`` (the lowest mean criterion's), ``tied`` (the names within one std of it, in the order given)
    and ``threshold`` (c̄* + s*). No candidate within the budget is a ``ValueError``."""
    within = [c for c in candidates if c.storage <= budget]
    if not within:
        raise ValueError(f"no candidate within the budget of {budget:g} samples' worth")
    lowest = min(within, key=lambda c: c.mean)  # the first listed among equal means
    threshold = lowest.mean + lowest.std
    tied = [c for c in within if c.mean <= threshold]
    chosen = min(tied, key=lambda c: c.storage)  # the first listed among equal storage
    return {"chosen": chosen.name, "lowest": lowest.name, "tied": [c.name for c in tied], "threshold": threshold}


def choice_markdown(record: dict) -> str:
    """A choice as ``benchmarks/choose_distiller.py`` records it (``rows`` of name, storage, criterion and its
    std, and the recorded gaps ``recorded``; the judging ``runs``, ``networks`` and OOD tuning sets ``ood``;
    optionally a ``ceiling`` row, judged alike but no candidate, its storage counted at ``storage_precision``,
    which records made before it was recorded counted at float32 whatever precision the row's name gives; and
    :func:`choose`'s answer): one line on how the candidates were judged, their table, and the choice."""
    keys = record["recorded"]
    budget = "no budget" if record["budget"] is None else f"budget {record['budget']:g} samples' worth"
    lines = [f"{len(record['rows'])} candidates ({budget}), {record['runs']} runs × {record['networks']} networks, "
             f"judged on validation images and the OOD tuning pool ({', '.join(record['ood'])}); criterion = "
             f"{' + '.join(FUNCTION_KEYS)} (nats)", "",
             "| candidate | storage | criterion | " + " | ".join(keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    ceiling = []
    if record.get("ceiling"):
        counted = "" if "storage_precision" in record["ceiling"] else "; storage counted at float32"
        ceiling = [{**record["ceiling"], "name": f"{record['ceiling']['name']} (not a candidate{counted})"}]
    lines += [f"| {row['name']} | {row['storage']:.2f} | {row['criterion']:.4f} ± {row['criterion_std']:.4f} | "
              + " | ".join(f"{row[key]:.4f}" for key in keys) + " |" for row in [*record["rows"], *ceiling]]
    lines += ["", f"lowest: {record['lowest']}; tied (within {record['threshold']:.4f}): {', '.join(record['tied'])}; "
                  f"chosen: {record['chosen']}"]
    return "\n".join(lines)
