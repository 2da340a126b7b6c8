"""Per-input uncertainty scores from the class probabilities of K posterior members.

**Convention: for every score, HIGHER means MORE UNCERTAIN.** A score can therefore be handed
straight to :func:`apd.metrics.detection`, where out-of-distribution or adversarial inputs are the
positive class. ``max_prob`` follows the convention too: it is 1 − max_c p̄_c, not the confidence.

Input is ``probs[K, N, C]``: p_k(c | x_n) for member k (a weight sample, a dropout mask, ...), input n
and class c. The predictive distribution is the member average p̄(c | x_n) = (1/K) Σ_k p_k(c | x_n).
Every function computes in float64 from the probabilities and returns a float64 tensor [N] on the
device of ``probs``: members that differ by less than float32 resolves still give their (tiny) BALD and
model variance instead of rounding noise. Entropies use the natural logarithm and treat 0·log 0 as 0.

Scores that measure disagreement between members (:data:`ENSEMBLE_SCORES`) are not available for a single
network: :func:`scores` gives NaN for them there, and callers report them as n/a rather than as a number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

ENSEMBLE_SCORES = ("variation_ratio", "bald", "model_variance")  # n/a (NaN in scores) for one network


def _checked(probs: Tensor) -> Tensor:
    """``probs`` [K, N, C] in float64, after checking its shape."""
    if probs.ndim != 3 or not probs.is_floating_point():
        raise ValueError(f"probs must be a floating-point tensor [K, N, C], got {probs.dtype} "
                         f"{list(probs.shape)}")
    if probs.shape[0] == 0 or probs.shape[2] == 0:
        raise ValueError(f"probs needs at least one member and one class, got {list(probs.shape)}")
    return probs.double()


def _entropy(p: Tensor) -> Tensor:
    """Shannon entropy along the last axis, H[p] = −Σ_c p_c log p_c, with 0·log 0 = 0 (via xlogy)."""
    return -torch.special.xlogy(p, p).sum(-1)


def _mutual_information(predictive_entropy: Tensor, member_entropy: Tensor) -> Tensor:
    """H[p̄] − mean_k H[p_k] from H[p_k] [K, N], clamped at 0 (the difference is ≥ 0 by concavity; rounding
    can dip below)."""
    return (predictive_entropy - member_entropy.mean(0)).clamp_min(0.0)


def member_entropies(probs: Tensor) -> Tensor:
    """Each member's entropy H[p_k] = −Σ_c p_k(c | x_n) log p_k(c | x_n), [K, N] float64: BALD's costliest
    part, which an ensemble of members whose entropies are known already (stored samples judged in many
    subsets) can pass to :func:`bald` instead of recomputing; a member's do not depend on the others'."""
    return _entropy(_checked(probs))


def _member_entropy(probs: Tensor, known: Tensor | None) -> Tensor:
    """The members' entropies H[p_k] [K, N] of float64 ``probs``: ``known`` (checked against ``probs``) where
    given, else computed."""
    if known is None:
        return _entropy(probs)
    if known.shape != probs.shape[:2]:
        raise ValueError(f"member entropies {list(known.shape)} for members {list(probs.shape[:2])}")
    return known.double()


def _one_minus_max(mean_probs: Tensor) -> Tensor:
    return 1.0 - mean_probs.amax(-1)


def predictive_entropy(probs: Tensor) -> Tensor:
    """Entropy of the predictive distribution, H[p̄] = −Σ_c p̄_c log p̄_c with p̄ = mean_k p_k.

    Total uncertainty, aleatoric plus epistemic (Gal, "Uncertainty in Deep Learning",
    PhD thesis, 2016). Ranges over [0, log C]; log C for a uniform predictive.
    """
    probs = _checked(probs)
    return _entropy(probs.mean(0))


def variation_ratio(probs: Tensor) -> Tensor:
    """True variation ratio of the members' votes, 1 − f_m / K (Freeman, 1965; Gal, 2016).

    Each member votes for its argmax class (ties inside one member go to the lowest class index);
    f_m is the number of votes for the modal class. 0 when all members agree; at most 1 − ⌈K/C⌉/K.
    This is not 1 − max_c p̄_c, which is :func:`max_prob`.
    """
    probs = _checked(probs)
    n_members, _, n_classes = probs.shape
    member_votes = probs.argmax(-1).T  # [N, K]
    vote_counts = probs.new_zeros(member_votes.shape[0], n_classes)
    vote_counts.scatter_add_(1, member_votes, torch.ones_like(member_votes, dtype=probs.dtype))  # [N, C]
    modal_count = vote_counts.amax(-1)
    return 1.0 - modal_count / n_members


def max_prob(probs: Tensor) -> Tensor:
    """One minus the largest predictive probability, 1 − max_c p̄_c (the maximum-softmax-probability
    baseline of Hendrycks & Gimpel, 2017, negated so that higher = more uncertain)."""
    probs = _checked(probs)
    return _one_minus_max(probs.mean(0))


def bald(probs: Tensor, member_entropy: Tensor | None = None) -> Tensor:
    """Mutual information between the prediction and the weights (BALD; Houlsby et al., 2011):

        I[y; θ | x] = H[p̄] − (1/K) Σ_k H[p_k],

    the epistemic part of the predictive entropy. Zero when all members agree; tiny negative values
    from rounding are clamped to 0. ``member_entropy``: the members' H[p_k] [K, N]
    (:func:`member_entropies`), where already known.
    """
    probs = _checked(probs)
    return _mutual_information(_entropy(probs.mean(0)), _member_entropy(probs, member_entropy))


def model_variance(probs: Tensor) -> Tensor:
    """Class-averaged variance of the member probabilities (Smith & Gal, 2018; the "model variance"
    of Wang et al., 2018):

        σ²(x) = (1/C) Σ_c (1/K) Σ_k (p_k(c | x) − p̄(c | x))²,

    the population variance over members (divisor K, so one member gives 0), averaged over classes.
    Feinman et al. (2017) sum over classes instead, which is C·σ²(x) and ranks inputs identically.
    """
    probs = _checked(probs)
    return probs.var(0, correction=0).mean(-1)


SCORE_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "entropy": predictive_entropy,
    "variation_ratio": variation_ratio,
    "max_prob": max_prob,
    "bald": bald,
    "model_variance": model_variance,
}


def scores(probs: Tensor, names: Iterable[str] | None = None, *, mean_probs: Tensor | None = None,
           member_entropy: Tensor | None = None) -> dict[str, Tensor]:
    """The scores ``names`` of :data:`SCORE_FUNCTIONS` (all of them by default, in its order) for
    ``probs[K, N, C]``, each a tensor [N] where higher means more uncertain. The predictive p̄ and its entropy
    are computed once and shared; a score not named is not computed. ``mean_probs``: p̄ [N, C] and
    ``member_entropy``: the members' H[p_k] [K, N] (:func:`member_entropies`), where already known.

    For a single network (K = 1) the scores of :data:`ENSEMBLE_SCORES` (``bald``, ``model_variance``,
    ``variation_ratio``) are NaN: they measure disagreement between members, and one network has none to
    measure, so they are not available (the tables print n/a), where a 0 would pass for a network sure of
    itself. The functions of :data:`SCORE_FUNCTIONS` compute their formula for any K (0 for one member)."""
    wanted = list(SCORE_FUNCTIONS) if names is None else list(names)
    unknown = [name for name in wanted if name not in SCORE_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown score(s) {', '.join(map(repr, unknown))}; known: {', '.join(SCORE_FUNCTIONS)}")
    probs = _checked(probs)
    if mean_probs is None:
        mean_probs = probs.mean(0)
    elif mean_probs.shape != probs.shape[1:]:
        raise ValueError(f"predictive {list(mean_probs.shape)} for members {list(probs.shape)}")
    mean_probs = mean_probs.double()
    entropy = _entropy(mean_probs)
    if probs.shape[0] == 1:
        undefined = torch.full_like(entropy, float("nan"))
        ensemble = dict.fromkeys(ENSEMBLE_SCORES, lambda: undefined)
    else:
        ensemble = {"variation_ratio": lambda: variation_ratio(probs),
                    "bald": lambda: _mutual_information(entropy, _member_entropy(probs, member_entropy)),
                    "model_variance": lambda: model_variance(probs)}
    compute = {"entropy": lambda: entropy, "max_prob": lambda: _one_minus_max(mean_probs), **ensemble}
    return {name: compute[name]() for name in SCORE_FUNCTIONS if name in wanted}
