"""``results.json`` read through typed accessors. ``apd evaluate`` writes it as JSON (every value over runs
as ``{"mean", "std"}``, :func:`apd.metrics.mean_std`); the tables, figures and closing summary read it here,
each value as a :class:`~apd.metrics.Stat`, instead of through key paths of their own. A value a method cannot
have (BALD of one network) or a part a run did not compute is None.

- ``accuracy``: method → metric (``acc``, ``nll``, ``brier``, ``ece``) → Stat;
- ``ood``: OOD set → score → method → metric (``auroc``, ``aupr_in``, ``aupr_out``, ``fpr95``, percent) → Stat,
  or None for a score the method cannot have.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apd.metrics import Stat


def accuracy(results: Mapping, method: str, metric: str = "acc") -> Stat | None:
    """``method``'s test-set ``metric`` over runs; None where the results hold none."""
    return _over_runs(results.get("accuracy", {}).get(method, {}).get(metric))


def detection(results: Mapping, ood_set: str, score: str, method: str) -> dict[str, Stat] | None:
    """``method``'s detection of ``ood_set`` by ``score``: metric → Stat (percent); None where the method cannot
    have the score."""
    found = results["ood"][ood_set][score].get(method)
    return None if found is None else {metric: _over_runs(value) for metric, value in found.items()}


def set_aurocs(results: Mapping, method: str, score: str) -> dict[str, float | None]:
    """Each OOD set's AUROC of ``method`` by ``score`` (percent, mean over runs); None for a set where it has
    none."""
    return {name: None if (found := by_score.get(score, {}).get(method)) is None else _over_runs(found["auroc"]).mean
            for name, by_score in results.get("ood", {}).items()}


def mean_auroc(results: Mapping, method: str, score: str, every_set: bool = False) -> float | None:
    """``method``'s AUROC by ``score`` averaged over the OOD sets S that have it, (1/|S|) Σ_{o ∈ S} AUROC_o
    (percent); None where no set has it, or with ``every_set`` where one set lacks it."""
    by_set = set_aurocs(results, method, score)
    values = [value for value in by_set.values() if value is not None]
    if not values or (every_set and len(values) < len(by_set)):
        return None
    return float(np.mean(values))


def kept_keys(equal_storage: Mapping) -> list[str]:
    """The ``yardstick.kept`` keys of the kept samples one ``yardstick.equal_storage`` entry sets its method
    against: its ⌈S⌉ float32 samples, and for a method stored below float32 those its storage buys stored at its
    precision, rounded whole (``at_precision``) and about their chains' means (``around_means``), where the
    results have them."""
    return [str(equal_storage["k"]), *(equal_storage[part]["key"] for part in ("at_precision", "around_means")
                                       if part in equal_storage)]


def _over_runs(value: Mapping | None) -> Stat | None:
    """The :class:`~apd.metrics.Stat` of a value over runs, which results.json stores as ``{"mean", "std"}``:
    anything else (a plain number) is a TypeError."""
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{value!r} is not a mean and std over runs")
    return Stat.of(value)
