"""Convergence diagnostics of SGLD samples: :func:`diagnose` computes the quantity families of
:mod:`apd.samplers.quantities` (function space, training log-likelihood, weight principal components) for
chains of draws, summarises the rank-normalised R-hat and ESS of each (:mod:`apd.samplers.rank_stats`) and
applies the warning rule, :func:`convergence_warning` (Vehtari et al. 2021, §4: R̂ < 1.01, and bulk ESS
above 100 per chain, 400 for four chains, on the function-space quantities); :func:`summary_lines` puts
the result in a few lines of text. Nothing here knows of stages or artifact paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn

from apd.nets import ParamSpec
from apd.samplers.quantities import (
    DEFAULT_MAX_DRAWS,
    DEFAULT_MAX_INPUTS,
    N_COMPONENTS,
    PSEUDO_CHAINS,
    compute_quantities,
    evenly_spaced,
)
from apd.samplers.rank_stats import RHAT_THRESHOLD, rank_diagnostics, summarise
from apd.samplers.trace_plot import plot_diagnostics

RHAT_FRACTION_LIMIT = 0.05  # warn when more than this fraction of function-space inputs exceed RHAT_THRESHOLD
MIN_BULK_ESS = 400.0  # warn when the median function-space bulk ESS is below this (100 per chain × 4 chains)

FAMILIES = ("function", "log_lik", "weight_pcs")
_FAMILY_LABELS = {"function": "function-space inputs", "log_lik": "training log-likelihood",
                  "weight_pcs": "weight principal components"}


def diagnose(
    spec: ParamSpec | nn.Module,
    samples: Any,
    x_val: Tensor | np.ndarray,
    y_val: Tensor | np.ndarray,
    x_train: Tensor | np.ndarray,
    y_train: Tensor | np.ndarray,
    *,
    chain_ids: np.ndarray | Sequence[int] | None = None,
    max_draws: int | None = DEFAULT_MAX_DRAWS,
    max_inputs: int | None = DEFAULT_MAX_INPUTS,
    n_components: int = N_COMPONENTS,
    pseudo_chains: int = PSEUDO_CHAINS,
    figure_path: str | Path | None = None,
    engine: str = "arviz",
    seed: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Convergence diagnostics of SGLD samples in function space, log-likelihood and weight PCs.

    Arguments as :func:`compute_quantities` (further keywords go to it); ``engine`` as
    :func:`rank_diagnostics`. Returns a JSON-ready dict:

    * ``chains_used`` (chains or pseudo-chains), ``draws_per_chain``, ``pseudo_chains`` (bool),
      ``samples_available`` (samples the draws were chosen from);
    * ``families``: for ``function``, ``log_lik`` and ``weight_pcs``, the :func:`summarise` dict
      (``rhat_median``, ``rhat_max``, ``frac_rhat_above_1.01``, ``frac_rhat_above_1.05``,
      ``ess_bulk_median``, ``ess_bulk_min``, ``ess_tail_median``, ``ess_tail_min``, ``quantities``,
      ``chains``, ``draws``, ``n_constant``);
    * ``worst_inputs``: the validation indices of the (up to) three inputs with the largest R̂;
    * ``thresholds``: the constants of the warning rule; ``warning``: :func:`convergence_warning`'s
      sentence or None.

    With ``figure_path``, :func:`plot_diagnostics` draws the three worst inputs, the training
    log-likelihood and the first two weight PCs there.
    """
    quantities = compute_quantities(
        spec, samples, x_val, y_val, x_train, y_train, chain_ids=chain_ids, max_draws=max_draws,
        max_inputs=max_inputs, n_components=n_components, pseudo_chains=pseudo_chains, seed=seed, **kwargs)
    layout = quantities.layout
    families: dict[str, Any] = {}
    stats: dict[str, dict[str, np.ndarray]] = {}
    for family, draws in quantities.draws.items():
        stats[family] = rank_diagnostics(draws, engine)
        families[family] = summarise(draws, stats[family])
    rhat_function = np.nan_to_num(stats["function"]["rhat"], nan=-np.inf)
    worst = [int(i) for i in np.argsort(-rhat_function, kind="stable")[:3]]
    keep = evenly_spaced(len(x_val), max_inputs)
    summary = {
        "chains_used": layout.chains,
        "draws_per_chain": layout.draws,
        "pseudo_chains": layout.pseudo_chains,
        "samples_available": layout.samples_available,
        "families": families,
        "worst_inputs": [int(keep[i]) for i in worst],
        "thresholds": {"rhat": RHAT_THRESHOLD, "rhat_fraction": RHAT_FRACTION_LIMIT,
                       "min_bulk_ess": MIN_BULK_ESS},
    }
    summary["warning"] = convergence_warning(summary)
    if figure_path is not None:
        picks = [quantities.draws["function"][:, :, worst], quantities.draws["log_lik"]]
        names = [quantities.names["function"][i] for i in worst] + quantities.names["log_lik"]
        if "weight_pcs" in quantities.draws:
            picks.append(quantities.draws["weight_pcs"][:, :, :2])
            names += quantities.names["weight_pcs"][:2]
        rhat_picked = [stats["function"]["rhat"][i] for i in worst] + [stats["log_lik"]["rhat"][0]]
        if "weight_pcs" in stats:
            rhat_picked += list(stats["weight_pcs"]["rhat"][:2])
        labels = [f"{n} (R̂ {r:.3f})" if np.isfinite(r) else n for n, r in zip(names, rhat_picked, strict=True)]
        chains = "pseudo-chains" if layout.pseudo_chains else "chains"
        plot_diagnostics(np.concatenate(picks, axis=2), labels, figure_path,
                         title=f"{layout.chains} {chains} × {layout.draws} draws")
    return summary


# -------------------------------------------------------------------------------------------- warning


def convergence_warning(summary: dict[str, Any]) -> str | None:
    """One sentence when the function-space diagnostics fail, else None.

    Fails when R̂ > :data:`RHAT_THRESHOLD` on more than :data:`RHAT_FRACTION_LIMIT` of the function-space
    inputs, or when their median bulk ESS is below :data:`MIN_BULK_ESS`; the sentence names each failed
    check with its numbers. ``summary`` is a :func:`diagnose` result (or has its ``families`` key).
    """
    function = summary.get("families", {}).get("function")
    if function is None:
        return None
    reasons = []
    frac = function[f"frac_rhat_above_{RHAT_THRESHOLD:g}"]
    if frac > RHAT_FRACTION_LIMIT:
        reasons.append(f"R-hat > {RHAT_THRESHOLD:g} on {100 * frac:.1f} % of {function['quantities']} "
                       f"function-space inputs (limit {100 * RHAT_FRACTION_LIMIT:g} %, "
                       f"max R-hat {function['rhat_max']:.3f})")
    ess = function["ess_bulk_median"]
    if ess is not None and ess < MIN_BULK_ESS:
        reasons.append(f"the median function-space bulk ESS is {ess:.0f} (below {MIN_BULK_ESS:g})")
    if not reasons:
        return None
    chains = "pseudo-chains" if summary.get("pseudo_chains") else "chains"
    return (f"SGLD samples may not have converged ({function['chains']} {chains} × {function['draws']} "
            f"draws): " + " and ".join(reasons) + ".")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """A :func:`diagnose` result as a few lines of text: one per quantity family, the warning apart
    (``{"error": …}``, what a caller records when there were too few draws, gives one line saying so)."""
    if "families" not in summary:
        return [f"convergence diagnostics: none ({summary.get('error', 'not computed')})"]

    def number(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}"

    chains = "pseudo-chains (one chain cut in pieces)" if summary["pseudo_chains"] else "chains"
    lines = [f"convergence diagnostics, {summary['chains_used']} {chains} × {summary['draws_per_chain']} draws "
             f"of {summary['samples_available']:,} samples (rank-normalised split R-hat, bulk/tail ESS):"]
    for family in FAMILIES:
        f = summary["families"].get(family)
        if f is None:
            continue
        frac = f[f"frac_rhat_above_{RHAT_THRESHOLD:g}"]
        lines.append(f"  {_FAMILY_LABELS[family] + ' (' + str(f['quantities']) + ')':<32} R-hat median "
                     f"{number(f['rhat_median'], 3)}, max {number(f['rhat_max'], 3)}, > {RHAT_THRESHOLD:g} on "
                     f"{100 * frac:.1f} %; bulk ESS median {number(f['ess_bulk_median'], 0)} (min "
                     f"{number(f['ess_bulk_min'], 0)}), tail ESS median {number(f['ess_tail_median'], 0)}")
    return lines


__all__ = ["FAMILIES", "MIN_BULK_ESS", "RHAT_FRACTION_LIMIT", "convergence_warning", "diagnose", "summary_lines"]
