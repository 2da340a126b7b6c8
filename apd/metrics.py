"""Classification, calibration and detection metrics.

The classification metrics take either the ensemble predictive ``probs[N, C]`` or member
probabilities ``probs[K, N, C]``, which are first averaged over K: p̄(c | x) = (1/K) Σ_k p_k(c | x).
They return Python floats; sums run in float64.

:func:`detection` scores how well an uncertainty score separates in-distribution inputs from OOD (or
adversarial) ones. Scores follow :mod:`apd.uncertainty`: **higher = more OOD/adversarial**, and OOD is
the positive class. All values are fractions in [0, 1]; callers convert to percent.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import sklearn
import torch
from sklearn.metrics import auc, average_precision_score, roc_curve
from torch import Tensor

# Smallest probability used inside log p̄(y): caps the NLL of a confidently wrong prediction at ≈27.6.
NLL_EPS = 1e-12
TPR_LEVEL = 0.95


def _predictive(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> tuple[Tensor, Tensor]:
    """The predictive p̄[N, C] in float64 and the labels as int64 on the same device, validated."""
    probs = torch.as_tensor(probs)
    if probs.ndim not in (2, 3) or not probs.is_floating_point():
        raise ValueError(f"probs must be floating-point [N, C] or [K, N, C], got {probs.dtype} "
                         f"{list(probs.shape)}")
    mean_probs = (probs.mean(0) if probs.ndim == 3 else probs).double()
    n_inputs, n_classes = mean_probs.shape
    if n_inputs == 0 or n_classes == 0:
        raise ValueError(f"probs needs at least one input and one class, got {list(probs.shape)}")
    labels = torch.as_tensor(labels, device=mean_probs.device)
    if labels.shape != (n_inputs,) or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"labels must be integer [{n_inputs}], got {labels.dtype} {list(labels.shape)}")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError(f"labels must lie in [0, {n_classes}), got range "
                         f"[{labels.min().item()}, {labels.max().item()}]")
    return mean_probs, labels.long()


def accuracy(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> float:
    """Fraction of inputs whose predictive argmax is the label, (1/N) Σ_n 1[argmax_c p̄_nc = y_n]."""
    mean_probs, labels = _predictive(probs, labels)
    return (mean_probs.argmax(-1) == labels).double().mean().item()


def nll(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> float:
    """Mean negative log-likelihood of the predictive, −(1/N) Σ_n log max(p̄_n(y_n), NLL_EPS)."""
    mean_probs, labels = _predictive(probs, labels)
    label_probs = mean_probs.gather(1, labels[:, None]).squeeze(1)
    return -label_probs.clamp_min(NLL_EPS).log().mean().item()


def brier(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> float:
    """Multi-class Brier score (Brier, 1950), (1/N) Σ_n Σ_c (p̄_nc − 1[c = y_n])²; 0 is perfect, 2 is
    the worst."""
    mean_probs, labels = _predictive(probs, labels)
    one_hot = torch.nn.functional.one_hot(labels, mean_probs.shape[1]).double()
    return (mean_probs - one_hot).square().sum(-1).mean().item()


@dataclass(frozen=True)
class Reliability:
    """Per-bin statistics of a reliability diagram. Bin b covers confidences (edges[b], edges[b+1]]
    (the first bin also holds 0). ``confidence`` and ``accuracy`` are NaN in empty bins."""

    edges: np.ndarray  # [bins + 1]
    confidence: np.ndarray  # [bins] mean of max_c p̄_c in the bin
    accuracy: np.ndarray  # [bins] fraction of correct predictions in the bin
    counts: np.ndarray  # [bins] number of inputs in the bin


def _bin_sums(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray,
              bins: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Equal-width confidence bins over [0, 1]: edges, counts, Σ confidence and Σ correct per bin."""
    if bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins}")
    mean_probs, labels = _predictive(probs, labels)
    confidence, predicted = mean_probs.max(-1)
    correct = (predicted == labels).double()
    edges = torch.linspace(0.0, 1.0, bins + 1, dtype=torch.float64, device=mean_probs.device)
    bin_index = torch.bucketize(confidence, edges[1:-1])  # right-closed: edges[b] < conf ≤ edges[b+1]
    counts = torch.bincount(bin_index, minlength=bins)
    confidence_sums = torch.bincount(bin_index, weights=confidence, minlength=bins)
    correct_sums = torch.bincount(bin_index, weights=correct, minlength=bins)
    return edges, counts, confidence_sums, correct_sums


def reliability(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray, bins: int = 15) -> Reliability:
    """Mean confidence, accuracy and count per equal-width confidence bin (Guo et al., 2017), where the
    confidence of input n is max_c p̄_nc and it is correct when that class is y_n."""
    edges, counts, confidence_sums, correct_sums = _bin_sums(probs, labels, bins)
    occupied = counts.double()
    return Reliability(
        edges=edges.cpu().numpy(),
        confidence=(confidence_sums / occupied).cpu().numpy(),
        accuracy=(correct_sums / occupied).cpu().numpy(),
        counts=counts.cpu().numpy(),
    )


def ece(probs: Tensor | np.ndarray, labels: Tensor | np.ndarray, bins: int = 15) -> float:
    """Expected calibration error with equal-width confidence bins B_b (Guo et al., 2017):

        ECE = Σ_b (|B_b| / N) · |acc(B_b) − conf(B_b)| = (1/N) Σ_b |Σ_{n ∈ B_b} (1[ŷ_n = y_n] − conf_n)|.
    """
    _, counts, confidence_sums, correct_sums = _bin_sums(probs, labels, bins)
    return ((correct_sums - confidence_sums).abs().sum() / counts.sum()).item()


def _score_array(scores: Tensor | np.ndarray | Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(scores.detach().cpu() if isinstance(scores, Tensor) else scores, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of scores, got shape {list(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} has {int((~np.isfinite(array)).sum())} non-finite values (NaN or inf)")
    return array


def auroc(scores_in: Tensor | np.ndarray | Sequence[float], scores_out: Tensor | np.ndarray | Sequence[float]) -> dict:
    """``{"auroc"}`` alone, the area :func:`detection` gives, by counting pairs (the Mann–Whitney statistic):
    AUROC = (1 / (n_in · n_out)) Σ_j (#{i: s_in,i < s_out,j} + ½ #{i: s_in,i = s_out,j}), each count read off
    the sorted in-distribution scores by a binary search. A small fraction of :func:`detection`'s time, for
    the yardstick's hundreds of random subsets, which need no AUPR or FPR."""
    s_in = np.sort(_score_array(scores_in, "scores_in"))
    s_out = _score_array(scores_out, "scores_out")
    below, up_to = np.searchsorted(s_in, s_out, side="left"), np.searchsorted(s_in, s_out, side="right")
    return {"auroc": float((below.sum() + up_to.sum()) / (2 * s_in.size * s_out.size))}


def detection(scores_in: Tensor | np.ndarray | Sequence[float],
              scores_out: Tensor | np.ndarray | Sequence[float]) -> dict[str, float]:
    """Separation of in-distribution scores from OOD (or adversarial) scores; higher score = more OOD.

    With OOD as the positive class (label 1) and the score as the decision value:

    - ``auroc``: area under the ROC curve = P(s_out > s_in) + ½ P(s_out = s_in) (Hanley & McNeil, 1982);
    - ``aupr_out``: average precision with OOD positive;
    - ``aupr_in``: average precision with in-distribution positive and the negated score (Hendrycks &
      Gimpel, 2017);
    - ``fpr95``: fraction of in-distribution inputs flagged at the highest threshold t for which
      s ≥ t flags at least 95 % of the OOD inputs (TPR ≥ 0.95).

    AUPR depends on the class ratio, so ``n_in``, ``n_out`` and ``ratio_in_out`` = n_in / n_out are
    returned beside the metrics. Areas come from scikit-learn (step-wise average precision, no
    interpolation; the AUROC is the trapezoidal area under the one ROC curve computed, as
    ``roc_auc_score`` takes it). The scores are checked here, so scikit-learn's own checks of its
    arguments, which cost more than the metrics on a thousand scores, are skipped.
    """
    s_in = _score_array(scores_in, "scores_in")
    s_out = _score_array(scores_out, "scores_out")
    is_out = np.concatenate([np.zeros(s_in.size), np.ones(s_out.size)])
    score = np.concatenate([s_in, s_out])
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        fpr, tpr, _ = roc_curve(is_out, score, drop_intermediate=False)
        return {
            "auroc": float(auc(fpr, tpr)),
            "aupr_in": float(average_precision_score(1.0 - is_out, -score)),
            "aupr_out": float(average_precision_score(is_out, score)),
            "fpr95": float(fpr[np.searchsorted(tpr, TPR_LEVEL, side="left")]),
            "n_in": s_in.size,
            "n_out": s_out.size,
            "ratio_in_out": s_in.size / s_out.size,
        }


def mean_std(values: Sequence[float]) -> dict[str, float]:
    """Mean and population standard deviation (divisor R, numpy's ``ddof=0``) of R per-run values,
    std = sqrt((1/R) Σ_r (v_r − mean)²); a single run gives std 0."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"mean_std needs a non-empty list of numbers, got shape {list(array.shape)}")
    return {"mean": float(array.mean()), "std": float(array.std(ddof=0))}


@dataclass(frozen=True)
class Stat:
    """A value as the results files store it, read back typed (:meth:`of`): a plain number (``std`` None), a
    summary over runs, draws or subsets from :func:`mean_std` (mean and population std), or random subsets'
    summary with its 5–95 % band (``band``: p5, p95)."""

    mean: float
    std: float | None = None
    band: tuple[float, float] | None = None

    @classmethod
    def of(cls, value: float | Mapping | Stat | None) -> Stat | None:
        """The :class:`Stat` of a stored value (a number, or a mapping with ``mean``, ``std`` and maybe ``p5``
        and ``p95``; a Stat as it is); None for None. A mean or std that is not a number is a TypeError raised
        as it is read."""
        if value is None or isinstance(value, Stat):
            return value
        if not isinstance(value, Mapping):
            return cls(_number(value, "value"))
        mean = _number(value["mean"], "mean")
        std = _number(value["std"], "std")
        return cls(mean, std, (value["p5"], value["p95"]) if "p5" in value else None)

    @property
    def spread(self) -> float:
        """The std, 0 for a plain number."""
        return 0.0 if self.std is None else self.std


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} {value!r} is not a number")
    return value


def mean_of(value: float | Mapping | None) -> float | None:
    """A stored value's mean (:meth:`Stat.of`): that of a summary over runs or subsets, or the value itself
    where it has no spread (one evenly spaced set); None for None."""
    stat = Stat.of(value)
    return None if stat is None else stat.mean


def std_of(value: float | Mapping | None) -> float:
    """A stored value's std over runs or subsets (:meth:`Stat.of`), 0 where it has none."""
    stat = Stat.of(value)
    return 0.0 if stat is None else stat.spread
