"""Whether a reference's numbers are settled: the same numbers from two disjoint halves of its chains, and
their Monte Carlo standard errors over chains.

R-hat and ESS ask whether chains agree in distribution; a posterior with many modes, one per chain, fails
them however many chains there are. What a comparison needs is that the reference's *numbers* (its NLL and
its AUROCs) would not move with another draw of chains. With chains c = 1 … C, each holding S_c kept
samples, any set A of chains has the predictive and the per-input BALD

    p̄_A(y | x) = Σ_{c∈A} Σ_s p_{c,s}(y | x) / Σ_{c∈A} S_c,
    I_A(x) = H[p̄_A(· | x)] − Σ_{c∈A} Σ_s H[p_{c,s}(· | x)] / Σ_{c∈A} S_c,

so per-chain sums (:class:`ChainSums`) give every such number without predicting again. From them
(:func:`reference_numbers`): the test NLL of p̄_A, and per OOD set the AUROC (percent) of BALD and of
max-prob (1 − max_y p̄_A(y | x), the paper's variation ratio) separating the in-distribution inputs from
that set's.

- :func:`split_half`: the chains shuffled with a seeded permutation and cut into two disjoint halves of
  ⌊C/2⌋; each number from either half, and their absolute gaps. :data:`STABILITY_TARGET` is what a
  many-chain reference must meet: every AUROC within 0.5 points, NLL within 0.005 nats.
- :func:`jackknife_standard_errors`: the delete-one-chain jackknife (Efron & Stein, 1981; chains are the
  independent units), SE = √((C − 1)/C · Σ_c (θ_(−c) − θ̄_(·))²) for each number θ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from apd.metrics import auroc, nll
from apd.uncertainty import predictive_entropy

STABILITY_TARGET = {"auroc_points": 0.5, "nll_nats": 0.005}  # the largest half-to-half gaps allowed
IN_SET = "in"  # the name of the in-distribution side of detection among a ChainSums' input sets
TEST_SET = "test"  # the labelled test inputs the NLL is measured on


@dataclass(frozen=True)
class ChainSums:
    """Per chain c (rows of each tensor, chains in ``ids`` order) and named input set: Σ_s p_{c,s}(y | x)
    (``probs[set]``, [C, N, K], float64), Σ_s H[p_{c,s}(· | x)] (``entropy[set]``, [C, N], float64) and the
    number of samples S_c (``counts``, [C])."""

    ids: list[int]
    probs: dict[str, Tensor]
    entropy: dict[str, Tensor]
    counts: Tensor

    def __post_init__(self) -> None:
        if not self.ids or len(self.ids) != len(self.counts):
            raise ValueError(f"{len(self.ids)} chain ids for {len(self.counts)} counts")
        if set(self.probs) != set(self.entropy):
            raise ValueError(f"input sets differ: {sorted(self.probs)} and {sorted(self.entropy)}")

    def pooled(self, chains: Tensor | list[int]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(p̄_A, I_A) of the chains at positions ``chains``, per input set (module docstring)."""
        chains = torch.as_tensor(chains, dtype=torch.long)
        count = float(self.counts[chains].sum())
        predictive = {name: sums[chains].sum(0) / count for name, sums in self.probs.items()}
        information = {name: (predictive_entropy(predictive[name][None]) - self.entropy[name][chains].sum(0) / count)
                       .clamp_min(0.0) for name in self.probs}
        return predictive, information


def chain_sums(members: Callable[[np.ndarray], tuple[Tensor, Tensor]], rows: np.ndarray, chains: np.ndarray,
               parts: Mapping[str, slice], chunk: int = 200) -> ChainSums:
    """:class:`ChainSums` of the networks at ``rows`` (their chain ids ``chains``), whose member predictions
    p_s(y | x) [k, N, K] on one stack of inputs and their entropies H[p_s] [k, N] ``members`` gives (e.g.
    :meth:`~apd.evaluation.stored.StoredPredictions.members`), ``chunk`` rows at a time; ``parts`` names
    where each input set lies in the stack."""
    rows, chains = np.asarray(rows), np.asarray(chains)
    if rows.shape != chains.shape or rows.size == 0:
        raise ValueError(f"{rows.size} rows with {chains.size} chain ids")
    ids = [int(c) for c in np.unique(chains)]
    position = torch.from_numpy(np.searchsorted(ids, chains))
    probs: Tensor | None = None
    entropy: Tensor | None = None
    for start in range(0, rows.size, chunk):
        part = slice(start, start + chunk)
        predicted, entropies = (found.double().cpu() for found in members(rows[part]))
        if probs is None:
            probs = torch.zeros(len(ids), *predicted.shape[1:], dtype=torch.float64)
            entropy = torch.zeros(len(ids), predicted.shape[1], dtype=torch.float64)
        probs.index_add_(0, position[part], predicted)
        entropy.index_add_(0, position[part], entropies)
    counts = torch.bincount(position, minlength=len(ids))
    return ChainSums(ids, {name: probs[:, where] for name, where in parts.items()},
                     {name: entropy[:, where] for name, where in parts.items()}, counts)


def reference_numbers(sums: ChainSums, chains: Tensor | list[int], y_test: Tensor) -> dict:
    """The test NLL (nats) of p̄_A and, per OOD set (every input set but :data:`TEST_SET` and
    :data:`IN_SET`), the AUROC (percent) of BALD and max-prob, for the chains at positions ``chains``."""
    predictive, information = sums.pooled(chains)
    ood = [name for name in sums.probs if name not in (TEST_SET, IN_SET)]

    def score(name: str, kind: str) -> Tensor:
        return information[name] if kind == "bald" else 1.0 - predictive[name].max(-1).values

    return {"nll": nll(predictive[TEST_SET], y_test),
            "auroc": {name: {kind: 100.0 * auroc(score(IN_SET, kind), score(name, kind))["auroc"]
                             for kind in ("bald", "max_prob")} for name in ood}}


def _flat(numbers: dict) -> dict[tuple[str, ...], float]:
    """``reference_numbers`` as {("nll",): v, ("auroc", set, score): v}."""
    return {("nll",): numbers["nll"], **{("auroc", name, kind): value for name, scores in numbers["auroc"].items()
                                          for kind, value in scores.items()}}


def _nested(flat: dict[tuple[str, ...], float]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        node = out
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return out


def split_half(sums: ChainSums, y_test: Tensor, seed: int) -> dict:
    """Each number from two disjoint halves of ⌊C/2⌋ chains (a permutation of the chains seeded by
    ``seed``), their absolute gaps, the largest AUROC gap, the NLL gap and whether both are within
    :data:`STABILITY_TARGET`. Needs C ≥ 2."""
    chains = len(sums.ids)
    if chains < 2:
        raise ValueError(f"split-half stability needs at least 2 chains, got {chains}")
    order = torch.randperm(chains, generator=torch.Generator().manual_seed(seed))
    half = chains // 2
    halves = [order[:half].sort().values, order[half:2 * half].sort().values]
    numbers = [_flat(reference_numbers(sums, part, y_test)) for part in halves]
    gaps = {key: abs(numbers[0][key] - numbers[1][key]) for key in numbers[0]}
    auroc_gap = max((gap for key, gap in gaps.items() if key[0] == "auroc"), default=float("nan"))
    nll_gap = gaps[("nll",)]
    return {"halves": [[sums.ids[int(c)] for c in part] for part in halves],
            "numbers": [_nested(n) for n in numbers], "gaps": _nested(gaps),
            "max_auroc_gap": auroc_gap, "nll_gap": nll_gap, "target": dict(STABILITY_TARGET),
            "meets": bool(auroc_gap <= STABILITY_TARGET["auroc_points"] and nll_gap <= STABILITY_TARGET["nll_nats"])}


def jackknife_se(leave_one_out: np.ndarray) -> float:
    """The delete-one jackknife standard error √((n − 1)/n · Σ_i (θ_(−i) − θ̄_(·))²) from the n
    leave-one-out values θ_(−i) (Efron & Stein, 1981); for the sample mean it is s/√n exactly."""
    values = np.asarray(leave_one_out, dtype=np.float64)
    n = values.size
    if n < 2:
        raise ValueError(f"the jackknife needs at least 2 leave-one-out values, got {n}")
    return math.sqrt((n - 1) / n * float(((values - values.mean()) ** 2).sum()))


def jackknife_standard_errors(sums: ChainSums, y_test: Tensor) -> dict:
    """Each number's delete-one-chain jackknife standard error (:func:`jackknife_se`), nested as
    :func:`reference_numbers` nests the numbers. Needs C ≥ 2."""
    chains = len(sums.ids)
    if chains < 2:
        raise ValueError(f"the jackknife over chains needs at least 2 chains, got {chains}")
    everyone = torch.arange(chains)
    left_out = [_flat(reference_numbers(sums, everyone[everyone != c], y_test)) for c in range(chains)]
    return _nested({key: jackknife_se(np.array([values[key] for values in left_out])) for key in left_out[0]})


def reference_stability(sums: ChainSums, y_test: Tensor, seed: int) -> dict | None:
    """What results carry about a reference's numbers (module docstring): the chains and samples they come
    from, every number from all chains, :func:`split_half` and :func:`jackknife_standard_errors`; None with
    one chain, where neither exists."""
    if len(sums.ids) < 2:
        return None
    return {"chains": len(sums.ids), "samples": int(sums.counts.sum()),
            "numbers": reference_numbers(sums, list(range(len(sums.ids))), y_test),
            "split_half": split_half(sums, y_test, seed),
            "jackknife_se": jackknife_standard_errors(sums, y_test)}
