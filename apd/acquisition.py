"""Acquisition functions for pool-based active learning (Gal, Islam & Ghahramani, ICML 2017).

Every acquisition ranks the unlabelled pool by a score of the model's members' class probabilities
``probs[K, N, C]`` (higher = more worth labelling) and takes the ``k`` best; ``random`` ignores the model
and draws ``k`` pool points uniformly from a seeded generator. The scores are those of
:mod:`apd.uncertainty`:

- ``entropy``: predictive entropy H[p̄] (Shannon, 1948);
- ``bald``: the mutual information between the prediction and the weights, H[p̄] − mean_k H[p_k]
  (Houlsby, Huszár, Ghahramani & Lengyel, 2011);
- ``variation_ratio``: as Gal et al. (2017) define it, 1 − max_c p̄_c, which is the ``max_prob`` key of
  :func:`apd.uncertainty.scores` (that module's ``variation_ratio`` is Freeman's vote-based ratio).

With one member (a deterministic net) BALD is 0 everywhere, so only ``entropy`` and ``random`` are
meaningful there (:data:`SINGLE_NETWORK`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from apd.uncertainty import scores as uncertainty_scores

ACQUISITIONS = ("bald", "entropy", "variation_ratio", "random")
SCORE_KEYS = {"bald": "bald", "entropy": "entropy", "variation_ratio": "max_prob"}  # → apd.uncertainty.scores
SINGLE_NETWORK = ("entropy", "random")  # the acquisitions defined for a single deterministic network


def acquisition_scores(name: str, probs: Tensor) -> Tensor:
    """The score [N] (float64, as :func:`apd.uncertainty.scores` computes it) that acquisition ``name``
    ranks the pool by, from member probabilities [K, N, C]."""
    if name not in SCORE_KEYS:
        raise ValueError(f"acquisition {name!r} has no score; scored ones are {', '.join(SCORE_KEYS)}")
    return uncertainty_scores(probs)[SCORE_KEYS[name]]


def top_k(scores: Tensor, k: int) -> Tensor:
    """Positions of the ``k`` highest scores, best first; ties go to the earlier position (a stable sort)."""
    return torch.argsort(scores.detach().cpu(), descending=True, stable=True)[:k]


def acquire(pool: Sequence[int], k: int, scores: Tensor | None = None,
            generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """Take ``k`` points out of ``pool`` (dataset indices): the ``k`` best by ``scores`` (one per pool
    point, in pool order), or, with ``scores`` None, ``k`` drawn uniformly without replacement from
    ``generator`` (seeded: the same state gives the same picks). Returns (picked in order of preference,
    the rest of the pool in its original order)."""
    pool = list(pool)
    k = min(k, len(pool))
    if scores is None:
        if generator is None:
            raise ValueError("random acquisition needs a seeded generator")
        positions = torch.randperm(len(pool), generator=generator)[:k]
    else:
        if scores.shape != (len(pool),):
            raise ValueError(f"{len(pool)} pool points but scores of shape {list(scores.shape)}")
        positions = top_k(scores, k)
    chosen = set(positions.tolist())
    return [pool[i] for i in positions.tolist()], [index for i, index in enumerate(pool) if i not in chosen]


def balanced_subset(labels: Tensor, per_class: int, generator: torch.Generator) -> list[int]:
    """``per_class`` indices of each class of ``labels`` drawn uniformly (seeded), sorted by index: the
    initial labelled set of the protocol (2 per class in the paper)."""
    picked: list[int] = []
    for c in torch.unique(labels).tolist():
        members = torch.nonzero(labels == c).flatten()
        if len(members) < per_class:
            raise ValueError(f"class {c} has {len(members)} examples, fewer than {per_class}")
        picked += members[torch.randperm(len(members), generator=generator)[:per_class]].tolist()
    return sorted(picked)


def labels_to_reach(counts: Sequence[int], accuracies: Sequence[float], target: float) -> int | None:
    """The first labelled-set size at which ``accuracies`` reaches ``target`` (None if it never does)."""
    for count, value in zip(counts, accuracies, strict=True):
        if value >= target:
            return int(count)
    return None
