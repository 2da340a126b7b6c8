"""The trace and rank plot of convergence diagnostics: one row per quantity, chains in colour (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import Tensor

from apd.samplers.rank_stats import check_draws


def plot_diagnostics(draws: np.ndarray | Tensor, names: Sequence[str], path: str | Path,
                     title: str | None = None, bins: int = 20) -> Path:
    """Trace plot (left) and rank plot (right) of each quantity of ``draws`` [chains, draws, Q]; PNG at ``path``.

    Rank plot (Vehtari et al. 2021, §4.1): the draws of all chains are ranked together and each chain's
    ranks are histogrammed in ``bins`` equal bins, one row of bars per chain; with converged chains every
    histogram is near uniform (dashed line: the expected count per bin). Drawn on a matplotlib
    :class:`~matplotlib.figure.Figure` (Agg canvas, no pyplot state).
    """
    from matplotlib.figure import Figure
    from scipy.stats import rankdata

    draws = check_draws(draws)
    chains, n_draws, n_q = draws.shape
    if len(names) != n_q:
        raise ValueError(f"{n_q} quantities but {len(names)} names")
    height = 1.9 * n_q + 0.6
    figure = Figure(figsize=(10, height))
    # a fixed layout: constrained layout measured twice as slow to render for no visible gain here
    axes = figure.subplots(n_q, 2, squeeze=False, width_ratios=[2.2, 1], gridspec_kw={
        "left": 0.06, "right": 0.98, "bottom": 0.45 / height, "top": 1 - 0.7 / height, "hspace": 0.55,
        "wspace": 0.12})
    colours = [f"C{c % 10}" for c in range(chains)]
    edges = np.linspace(0, chains * n_draws, bins + 1)
    expected = n_draws / bins  # a chain's count per bin when all chains sample the same distribution
    offsets = 2.2 * expected * np.arange(chains)
    for q in range(n_q):
        trace, rank = axes[q]
        for c in range(chains):
            trace.plot(draws[c, :, q], color=colours[c], lw=0.6, alpha=0.8, label=f"chain {c}")
        trace.set_title(names[q], fontsize=9, loc="left")
        trace.set_xlim(0, n_draws - 1)
        trace.tick_params(labelsize=7)
        ranks = rankdata(draws[:, :, q].reshape(-1)).reshape(chains, n_draws)
        for c in range(chains):
            counts, _ = np.histogram(ranks[c], bins=edges)
            rank.bar(edges[:-1], counts, width=np.diff(edges), bottom=offsets[c], align="edge",
                     color=colours[c], alpha=0.75, edgecolor="white", linewidth=0.3)
            rank.hlines(offsets[c] + expected, edges[0], edges[-1], color="k", ls="--", lw=0.6)
        rank.set_yticks(offsets, [f"chain {c}" for c in range(chains)])
        rank.set_xlim(edges[0], edges[-1])
        rank.tick_params(labelsize=7)
        rank.set_title("rank histogram per chain (--- uniform)", fontsize=9, loc="left")
    axes[-1][0].set_xlabel("draw", fontsize=8)
    axes[-1][1].set_xlabel("rank among all draws", fontsize=8)
    if chains <= 10:
        handles, labels = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, fontsize=8, ncol=chains, loc="upper left", frameon=False)
    if title:
        figure.suptitle(title, fontsize=10, x=0.98, ha="right")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


__all__ = ["plot_diagnostics"]
