"""Figures of an evaluation: PNG from ``results.json``, ``scores.h5`` and the generator's manifest.

Figures are drawn on matplotlib's object-oriented :class:`~matplotlib.figure.Figure`, which renders PNG
through the Agg canvas without pyplot: no display is needed, no global backend is switched and no
figure stays registered after it is saved.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from apd.errors import ArtifactError
from apd.io import read_json, write_bytes_atomic
from apd.pipeline.table_format import HISTOGRAM_SCORES, method_label, methods_in_order, ordered, score_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def save_figure(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG at ``path`` atomically (a reader never sees half a file); returns ``path``."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110)
    write_bytes_atomic(path, png.getvalue())
    return path


def new_figure(rows: int = 1, cols: int = 1, panel: tuple[float, float] = (3.2, 2.4)) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(panel[0] * cols, panel[1] * rows), layout="constrained")
    return figure, figure.subplots(rows, cols, squeeze=False)


def storage_axes(ax: Any, ylabel: str, level: float) -> None:
    """The storage-against-quality axes every storage figure shares: storage in SGLD samples' worth on a
    log x axis, ``ylabel`` on y, and a grey line at SGLD's own ``level`` (0 for gaps, 100 for shares)."""
    ax.axhline(level, color="grey", linewidth=0.8)
    ax.set(xscale="log", xlabel="storage (SGLD samples' worth)", ylabel=ylabel)


def plot_kept_curve(ax: Any, curve: list[dict], key: str, scale: float = 1.0) -> None:
    """The kept-samples yardstick (rows of :func:`apd.evaluation.yardstick.kept_curve`) on ``ax``: ``scale``
    times the ``key`` value of k evenly spaced samples as a black line, and of random subsets of k as their
    mean ± std in grey, against k; sets whose value is undefined (BALD of one network) are left out."""
    even = [(r["k"], scale * r["evenly_spaced"][key]) for r in curve if r["evenly_spaced"][key] is not None]
    if even:
        ax.plot(*zip(*even, strict=True), "-", color="black", label="kept SGLD, evenly spaced")
    rand = [(r["k"], r["random"][key]) for r in curve if r["random"][key] is not None]
    if rand:
        ax.errorbar([k for k, _ in rand], [scale * v["mean"] for _, v in rand],
                    yerr=[scale * v["std"] for _, v in rand], fmt="--", color="grey", capsize=2,
                    label="kept SGLD, random subsets")


def plot_growth(ax: Any, worth: Sequence[float], values: Sequence[float], label: str = "MoG growth") -> None:
    """A mixture's growth over its number of components: ``values`` against storage ``worth``, dotted."""
    ax.plot(worth, values, ":", color="C7", marker=".", label=label)


def _histogram_figure(scores: h5py.File, score: str, results: dict) -> Figure | None:
    """In-distribution vs OOD histograms of one score: a panel per method, the test inputs filled and each
    OOD set as a line, on bins common to all of that method's inputs."""
    methods = methods_in_order(results, (m for m in scores if isinstance(scores[m], h5py.Group)
                                 and f"in/{score}" in scores[m]))
    sets = ordered((name for m in methods for name in scores[m].get("out", {})
                     if score in scores[m]["out"][name]), results.get("ood", {}))
    if not methods or not sets:
        return None
    cols = min(len(methods), 4)
    figure, axes = new_figure(math.ceil(len(methods) / cols), cols)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    for ax, method in zip(axes.flat, methods, strict=False):
        scores_in = scores[method]["in"][score][()]
        outside = {name: scores[method][f"out/{name}/{score}"][()] for name in sets
                   if f"out/{name}/{score}" in scores[method]}
        edges = np.histogram_bin_edges(np.concatenate([scores_in, *outside.values()]), bins=30)
        ax.hist(scores_in, edges, density=True, histtype="stepfilled", alpha=0.4, color="grey", label="test")
        for col, (name, values) in enumerate(outside.items()):
            ax.hist(values, edges, density=True, histtype="step", color=f"C{col}", label=name)
        ax.set_title(method_label(method), fontsize=8)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=6)
    figure.supxlabel(f"{score_label(score)} (higher = more uncertain)")
    return figure


def _reliability_figure(scores: h5py.File, results: dict) -> Figure | None:
    """Reliability diagrams (Guo et al., 2017) of each method's test predictive: accuracy per confidence
    bin against the diagonal of perfect calibration."""
    from apd.metrics import ece, reliability

    methods = methods_in_order(results, (m for m in scores if isinstance(scores[m], h5py.Group)
                                 and "test_probs" in scores[m]))
    if not methods or "test_labels" not in scores:
        return None
    labels = scores["test_labels"][()]
    cols = min(len(methods), 3)
    figure, axes = new_figure(math.ceil(len(methods) / cols), cols, panel=(3.0, 3.0))
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    for ax, method in zip(axes.flat, methods, strict=False):
        probs = scores[method]["test_probs"][()]
        bins = reliability(probs, labels)
        width = np.diff(bins.edges)
        ax.bar(bins.edges[:-1], np.nan_to_num(bins.accuracy), width=width, align="edge",
               edgecolor="black", linewidth=0.5, label="accuracy")
        ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
               title=f"{method_label(method)} (ECE {ece(probs, labels):.3f})")
        ax.legend(fontsize=7, loc="upper left")
    return figure


def _first_layer_figure(scores: h5py.File) -> Figure | None:
    """First-layer weight rows of one SGLD sample shown as images (the input's shape; a CNN's filters)."""
    if "sgld_first_layer" not in scores:
        return None
    images = scores["sgld_first_layer"][()]
    cols = math.ceil(math.sqrt(len(images)))
    figure, axes = new_figure(math.ceil(len(images) / cols), cols, panel=(1.6, 1.6))
    limit = float(np.abs(images).max()) or 1.0
    for ax in axes.flat:
        ax.axis("off")
    for ax, image in zip(axes.flat, images, strict=False):
        ax.imshow(image, cmap="RdBu_r", vmin=-limit, vmax=limit)
    figure.suptitle("SGLD sample: first-layer weights")
    return figure


def _storage_figure(results: dict) -> Figure | None:
    """Share of SGLD's accuracy and BALD AUROC against storage (SGLD samples' worth, log scale): MoG as a
    line over its number of components, APD as a marked point."""
    mog, apd = results.get("mog") or [], results.get("apd_share")
    if not mog and not apd:
        return None
    figure, axes = new_figure(panel=(6.0, 4.0))
    ax = axes[0, 0]
    series = (("accuracy_share", "accuracy", "C0"), ("bald_auroc_share", "BALD AUROC", "C1"))
    for key, label, color in series:
        if mog:
            worth = [r["in_sgld_samples"] for r in mog]
            ax.plot(worth, [100 * r[key] for r in mog], "o-", color=color, label=f"MoG {label}")
        if apd:
            ax.plot([apd["in_sgld_samples"]], [100 * apd[key]], "*", color=color, markersize=14,
                    markeredgecolor="black", label=f"APD {label}")
    for r in mog:
        ax.annotate(f"k={r['components']}", (r["in_sgld_samples"], 100 * r["accuracy_share"]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    storage_axes(ax, "% of SGLD", 100)
    ax.set_title("Share of SGLD's performance against storage")
    ax.legend(fontsize=8)
    return figure


def _yardstick_figure(results: dict) -> Figure | None:
    """Storage against quality (the storage frontier): x = stored numbers in SGLD samples (log), y = the worst
    per-set gap to SGLD's BALD AUROC (left) and the NLL gap (right); kept SGLD samples (evenly spaced, and
    random subsets' mean ± std) and MoG growth as curves, every evaluated method as a point."""
    y = results.get("yardstick") or {}
    curve, quality, mog = y.get("curve") or [], results.get("quality") or {}, results.get("mog") or []
    if not curve and not quality:
        return None
    figure, axes = new_figure(1, 2, panel=(5.2, 4.0))
    panels = (("bald_gap", "worst per-set BALD AUROC gap to SGLD (points)"), ("nll_gap", "NLL gap to SGLD (nats)"))
    markers = "osD^v<>phX*P"
    for ax, (key, ylabel) in zip(axes[0], panels, strict=True):
        plot_kept_curve(ax, curve, key)
        growth = [(r["in_sgld_samples"], r["quality"][key]["mean"]) for r in mog if key in r.get("quality", {})]
        if growth:
            plot_growth(ax, *zip(*growth, strict=True))
        for i, m in enumerate(methods_in_order(results, quality)):
            value, worth = quality[m].get(key), quality[m].get("in_sgld_samples")
            if m == "sgld" or value is None or worth is None:
                continue
            ax.plot([worth], [value], markers[i % len(markers)], color=f"C{i % 10}", markersize=8,
                    markeredgecolor="black", label=method_label(m))
        storage_axes(ax, ylabel, 0)
        ax.set_yscale("symlog", linthresh=1.0 if key == "bald_gap" else 0.01)
    axes[0, 0].set_title("Storage against quality (lower is closer to SGLD)", fontsize=9)
    handles, labels = axes[0, 1].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=7, loc="outside right upper")
    return figure


def _distillation_figure(generator: dict) -> Figure | None:
    """The selection criterion of the generated ensemble on validation inputs against generator steps (the
    kept step marked), and the critic's Wasserstein estimate on a second axis."""
    history = [h for h in generator.get("history") or [] if "criterion" in h]
    if not history:
        return None
    figure, axes = new_figure(panel=(6.0, 4.0))
    ax = axes[0, 0]
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["criterion"] for h in history], "o-", color="C0", label="KL + |BALD gap| (validation)")
    kept = generator.get("selection", {}).get("kept_step")
    if kept is not None:
        ax.axvline(kept, color="C0", linestyle="--", label=f"kept: step {kept}")
    ax.set(xlabel="generator steps", ylabel="criterion (nats, lower is closer to SGLD)", yscale="log",
           title="Distillation")
    ax.legend(fontsize=8, loc="upper right")
    wasserstein = [(h["step"], h["wasserstein"]) for h in history if "wasserstein" in h]
    if wasserstein:
        twin = ax.twinx()
        twin.plot(*zip(*wasserstein, strict=True), color="C1", alpha=0.8)
        twin.set_ylabel("Wasserstein estimate (critic)", color="C1")
    return figure


def _open_scores(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise ArtifactError(f"{path}: not a readable HDF5 file ({exc})") from None


def write_figures(eval_dir: Path, results: dict, generator_json: Path | None = None) -> list[Path]:
    """Draw every figure whose data exist into ``eval_dir/figures/`` as PNG and return their paths:
    ``hist_{variation_ratio,bald}.png``, ``reliability.png`` and ``sgld_first_layer.png`` (from
    ``scores.h5``), ``storage_share.png`` (from results' ``mog``/``apd_share``), ``storage_quality.png``
    (from results' ``yardstick``, ``quality`` and ``mog``) and ``distillation.png``
    (from the generator manifest's history)."""
    figures: dict[str, Figure | None] = {}
    scores_path = eval_dir / "scores.h5"
    if scores_path.is_file():
        with _open_scores(scores_path) as scores:
            for score in HISTOGRAM_SCORES:
                figures[f"hist_{score}"] = _histogram_figure(scores, score, results)
            figures["reliability"] = _reliability_figure(scores, results)
            figures["sgld_first_layer"] = _first_layer_figure(scores)
    figures["storage_share"] = _storage_figure(results)
    figures["storage_quality"] = _yardstick_figure(results)
    if generator_json is not None and generator_json.is_file():
        figures["distillation"] = _distillation_figure(read_json(generator_json))
    figure_dir = eval_dir / "figures"
    written = []
    for name, figure in figures.items():
        if figure is None:
            continue
        figure_dir.mkdir(parents=True, exist_ok=True)
        path = figure_dir / f"{name}.png"
        written.append(save_figure(figure, path))
    return written
