"""Figures of an evaluation: PNG from ``results.json``, ``scores.h5`` and the generator's manifest.

Each figure has a builder that returns a matplotlib :class:`~matplotlib.figure.Figure`, or None where its
data are missing or too few to show anything; :func:`build_figures` calls them all and :func:`write_figures`
saves what they return. Figures are drawn on the object-oriented Figure, which renders PNG through the Agg
canvas without pyplot: no display is needed, no global backend is switched and no figure stays registered
after it is saved.

Every figure keeps the same rules: each axis names its quantity and unit; panels that are compared share
their x scale and bins (or their titles say what is each panel's own); tick labels are plain numbers (no
offset, no powers of ten); linear y axes for signed values; a reference level (SGLD's own value, chance) is
a labelled line; a curve of fewer than :data:`MIN_CURVE_POINTS` points is not drawn.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from apd.errors import ArtifactError
from apd.evaluation.yardstick import per_draw
from apd.io import read_json, write_bytes_atomic
from apd.methods import colour
from apd.metrics import Stat
from apd.pipeline.results import accuracy, mean_auroc
from apd.pipeline.table_format import HISTOGRAM_SCORES, method_label, methods_in_order, ordered, score_label

if TYPE_CHECKING:
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

MIN_CURVE_POINTS = 3  # fewer points than this show no trend: such a curve is not drawn
SCORE_UNITS = {"bald": "nats", "variation_ratio": "fraction of members"}
CHANCE_AUROC = 50.0  # percent: a score that ranks OOD inputs no better than a coin
DODGE_POINTS = 8.0  # sideways spacing, in typographic points, of markers at about one storage (a marker's width)
DODGE_SPAN = 1.15  # storages within this factor are one run (on a two-decade axis, about a marker's width)
# every figure an evaluation can draw, by file stem (:func:`build_figures`)
EVALUATION_FIGURES = (*(f"hist_{score}" for score in HISTOGRAM_SCORES), "reliability", "sgld_first_layer",
                      "storage_share", "storage_quality", "distillation")


def save_figure(figure: Figure, path: Path) -> Path:
    """Write ``figure`` as a PNG at ``path`` atomically (a reader never sees half a file); returns ``path``."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110)
    write_bytes_atomic(path, png.getvalue())
    return path


def new_figure(rows: int = 1, cols: int = 1, panel: tuple[float, float] = (3.2, 2.4),
               **shared: Any) -> tuple[Figure, Any]:
    """A figure of ``rows`` × ``cols`` panels of ``panel`` inches each (a 2-D array of axes); ``shared`` goes
    to :meth:`~matplotlib.figure.Figure.subplots` (``sharex=True`` for panels compared along x)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(panel[0] * cols, panel[1] * rows), layout="constrained")
    return figure, figure.subplots(rows, cols, squeeze=False, **shared)


def plain_ticks(figure: Figure) -> Figure:
    """Plain numbers on every axis of ``figure`` (returned): no offset or scientific notation on linear axes;
    on log axes the decades as decimals (0.1, 1, 10) and the ticks between them only where the axis spans
    less than a decade. Call it after the last change of scale (a new scale resets the formatters)."""
    from matplotlib.ticker import FuncFormatter, ScalarFormatter

    def between_decades(axis: Axis) -> FuncFormatter:
        def label(value: float, _: int) -> str:
            low, high = sorted(axis.get_view_interval())
            return f"{value:g}" if high < 10 * low else ""
        return FuncFormatter(label)

    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
                axis.set_minor_formatter(between_decades(axis))
            elif axis.get_scale() == "linear":
                formatter = ScalarFormatter(useOffset=False)
                formatter.set_scientific(False)
                axis.set_major_formatter(formatter)
    return figure


def storage_axes(ax: Any, ylabel: str, level: float | None, level_label: str | None = None) -> None:
    """The storage-against-quality axes every storage figure shares: storage in SGLD samples' worth on a
    log x axis, ``ylabel`` on y, and a grey line at SGLD's own ``level`` (in the legend as ``level_label``)."""
    if level is not None:
        ax.axhline(level, color="grey", linewidth=0.8, label=level_label)
    ax.set(xscale="log", xlabel="storage (SGLD samples' worth)", ylabel=ylabel)


def plot_kept_curve(ax: Any, curve: list[dict], key: str, scale: float = 1.0) -> bool:
    """The kept-samples yardstick (rows of :func:`apd.evaluation.yardstick.kept_curve`) on ``ax``: ``scale``
    times the ``key`` value of k evenly spaced samples as a black line, and of random subsets of k as their
    mean ± std in grey, against k, a dot at each k measured (so that one k alone still shows); sets whose value
    is undefined (BALD of one network) are left out. Whether anything was drawn."""
    even = [(r["k"], scale * r["evenly_spaced"][key]) for r in curve if r["evenly_spaced"][key] is not None]
    if even:
        ax.plot(*zip(*even, strict=True), "-", marker=".", color="black", label="kept SGLD, evenly spaced")
    rand = [(r["k"], stat) for r in curve if (stat := Stat.of(r["random"][key])) is not None]
    if rand:
        ax.errorbar([k for k, _ in rand], [scale * stat.mean for _, stat in rand],
                    yerr=[scale * stat.std for _, stat in rand], fmt="--", marker=".", color="grey", capsize=2,
                    label="kept SGLD, random subsets")
    return bool(even or rand)


def empty_panel(ax: Any, ylabel: str, why: str) -> None:
    """A panel with nothing to plot: its y label and ``why`` in its middle, and no scale or ticks that would
    read as data."""
    ax.set(xticks=[], yticks=[], ylabel=ylabel)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=8)


def plot_growth(ax: Any, worth: Sequence[float], values: Sequence[float], label: str = "MoG growth") -> None:
    """A mixture's growth over its number of components: ``values`` against storage ``worth``, dotted."""
    ax.plot(worth, values, ":", color="C7", marker=".", label=label)


def figure_legend(figure: Figure, loc: str = "outside right upper", **options: Any) -> None:
    """One legend for the whole figure, outside its panels (so that it hides no data): every labelled
    artist of every panel, each label once."""
    entries: dict[str, Any] = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    figure.legend(list(entries.values()), list(entries), fontsize=7, loc=loc, **options)


def dodge(storages: dict[str, float]) -> dict[str, float]:
    """Sideways offsets (typographic points) for markers at ``storages`` (x values on a log axis): each run
    of names within :data:`DODGE_SPAN` of the run's first is spread :data:`DODGE_POINTS` apart about its
    true x, in the order of storage, so that no marker hides another; a name alone gets 0."""
    offsets: dict[str, float] = {}
    run: list[str] = []
    for name in [*sorted(storages, key=storages.__getitem__), None]:
        if run and (name is None or storages[name] > DODGE_SPAN * storages[run[0]]):
            offsets.update({n: DODGE_POINTS * (i - (len(run) - 1) / 2) for i, n in enumerate(run)})
            run = []
        if name is not None:
            run.append(name)
    return offsets


def histogram_figure(scores: h5py.File, score: str, results: dict) -> Figure | None:
    """In-distribution against OOD histograms of one score, a panel per method: the test inputs filled and
    each OOD set as a line (one colour per set in every panel), as the percentage of that set's inputs in
    each bin. Every panel has the same bins and x range, from 0 (both scores are ≥ 0) to the largest score of
    any method, so that a method whose scores are a tenth of another's sits a tenth as far out; y is each
    panel's own."""
    methods = methods_in_order(results, (m for m in scores if isinstance(scores[m], h5py.Group)
                                 and f"in/{score}" in scores[m]))
    sets = ordered((name for m in methods for name in scores[m].get("out", {})
                     if score in scores[m]["out"][name]), results.get("ood", {}))
    if not methods or not sets:
        return None
    values = {m: {name: scores[m][f"out/{name}/{score}"][()] for name in sets if f"out/{name}/{score}" in scores[m]}
              for m in methods}
    every = np.concatenate([scores[m]["in"][score][()] for m in methods]
                           + [v for per_set in values.values() for v in per_set.values()])
    edges = np.histogram_bin_edges(every, bins=40, range=(min(0.0, every.min()), every.max()))
    cols = min(len(methods), 4)
    figure, axes = new_figure(math.ceil(len(methods) / cols), cols, sharex=True)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    unit = SCORE_UNITS.get(score)
    for ax, method in zip(axes.flat, methods, strict=False):
        test = scores[method]["in"][score][()]
        ax.hist(test, edges, weights=np.full(len(test), 100 / len(test)), histtype="stepfilled", alpha=0.4,
                color="grey", label="test (in-distribution)")
        for name, v in values[method].items():
            ax.hist(v, edges, weights=np.full(len(v), 100 / len(v)), histtype="step", color=f"C{sets.index(name)}",
                    label=f"OOD: {name}")
        ax.set_xlim(edges[0], edges[-1])
        ax.set_title(method_label(method), fontsize=8)
        ax.set_xlabel(score_label(score) + (f" ({unit})" if unit else ""), fontsize=7)
        ax.set_ylabel("% of the set's inputs", fontsize=7)
        ax.tick_params(labelsize=7, labelbottom=True)
    figure_legend(figure)
    figure.suptitle(f"{score_label(score)} of test and OOD inputs (higher = more uncertain): "
                    "x and bins shared by all panels, y each panel's own", fontsize=9)
    return plain_ticks(figure)


def reliability_figure(scores: h5py.File, results: dict) -> Figure | None:
    """Reliability diagrams (Guo et al., 2017) of each method's test predictive: per equal-width confidence
    bin, the accuracy of the test inputs in it as a bar against the diagonal of perfect calibration. Bins hold
    very different numbers of inputs (most sit near confidence 1), so each bar is labelled with its count and
    an empty bin has no bar; the legend sits below the panels, where it hides no bar."""
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
        filled = bins.counts > 0
        bars = ax.bar(bins.edges[:-1][filled], bins.accuracy[filled], width=np.diff(bins.edges)[filled],
                      align="edge", color="C0", alpha=0.5, edgecolor="black", linewidth=0.5,
                      label="accuracy of the bin's inputs")
        for bar, count in zip(bars, bins.counts[filled], strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, 0.02, f"{count}", rotation=90, ha="center", va="bottom",
                    fontsize=6)
        ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (max probability)",
               ylabel="accuracy (fraction correct)", title=f"{method_label(method)} (ECE {ece(probs, labels):.3f})")
        ax.title.set_fontsize(9)
    figure_legend(figure, loc="outside lower center", ncols=2)
    figure.suptitle(f"Reliability on {len(labels)} test inputs (number in a bar: inputs in that bin)", fontsize=10)
    return plain_ticks(figure)


def first_layer_figure(scores: h5py.File) -> Figure | None:
    """First-layer weight rows of one SGLD sample shown as images (the input's shape; a CNN's filters), on
    one colour scale symmetric about 0 for all of them."""
    images = scores["sgld_first_layer"][()] if "sgld_first_layer" in scores else []
    if not len(images):
        return None
    cols = math.ceil(math.sqrt(len(images)))
    figure, axes = new_figure(math.ceil(len(images) / cols), cols, panel=(1.6, 1.6))
    limit = float(np.abs(images).max()) or 1.0
    for ax in axes.flat:
        ax.axis("off")
    for ax, image in zip(axes.flat, images, strict=False):
        shown = ax.imshow(image, cmap="RdBu_r", vmin=-limit, vmax=limit)
    figure.colorbar(shown, ax=axes, shrink=0.6, label="weight (one scale for all rows)")
    figure.suptitle("SGLD sample: first-layer weights, one image per hidden unit")
    return plain_ticks(figure)


def storage_share_figure(results: dict) -> Figure | None:
    """MoG's growth against APD in absolute numbers: test accuracy (left) and BALD AUROC averaged over the
    OOD sets (right), both in percent, against storage (SGLD samples' worth, log scale). MoG is a line over
    its number of components k (mean ± std over its draws), APD a star, SGLD's own value a grey line, and
    chance AUROC (50) a dotted line: an AUROC below it ranks OOD inputs as less uncertain than test inputs."""
    mog, apd = results.get("mog") or [], results.get("apd_share")
    if not mog and not apd:
        return None

    def accuracy_of(method: str) -> float | None:
        return None if (acc := accuracy(results, method)) is None else 100 * acc.mean

    panels = (("accuracy", 100.0, "test accuracy (%)", accuracy_of, None, "Accuracy against storage"),
              ("bald_auroc", 1.0, "BALD AUROC, mean over OOD sets (%)", lambda m: mean_auroc(results, m, "bald"),
               CHANCE_AUROC, "OOD detection against storage"))
    figure, axes = new_figure(1, 2, panel=(4.4, 3.8))
    for ax, (key, scale, ylabel, value_of, chance, title) in zip(axes[0], panels, strict=True):
        if mog:
            worth = [r["in_sgld_samples"] for r in mog]
            stats = [Stat.of(r[key]) for r in mog]
            means = [scale * stat.mean for stat in stats]
            ax.errorbar(worth, means, yerr=[scale * stat.std for stat in stats], fmt="o-", color="C0", capsize=2,
                        label="MoG, k components (mean ± std over draws)")
            for r, mean in zip(mog, means, strict=True):
                ax.annotate(f"k={r['components']}", (r["in_sgld_samples"], mean), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=7)
        if apd and (value := value_of("apd")) is not None:
            ax.plot([apd["in_sgld_samples"]], [value], "*", color="C3", markersize=14, markeredgecolor="black",
                    label="APD")
        if chance is not None:
            ax.axhline(chance, color="black", linestyle=":", linewidth=1.0, label="chance (AUROC 50)")
        storage_axes(ax, ylabel, value_of("sgld"), "SGLD's own value")
        ax.set_title(title, fontsize=9)
    figure_legend(figure)
    return plain_ticks(figure)


def storage_quality_figure(results: dict) -> Figure | None:
    """Storage against quality (the kept-samples yardstick): x = stored numbers in SGLD samples' worth (log),
    y = the gap to SGLD of the worst per-set BALD AUROC (left, percentage points, |AUROC − SGLD's|) and of
    the test NLL (right, nats; |NLL − SGLD's|, signed in results written before gaps per draw, where below 0
    is an NLL below SGLD's) on linear axes: 0 is SGLD itself. Kept SGLD
    samples (evenly spaced, and random subsets' mean ± std) and MoG growth are curves, every evaluated method
    a point with a marker shape of its own; points at about the same storage (kept and Stein-thinned SGLD store
    as much as APD) are spread sideways by a few pixels about their true x (:func:`dodge`)."""
    from matplotlib.transforms import offset_copy

    y = results.get("yardstick") or {}
    curve, quality, mog = y.get("curve") or [], results.get("quality") or {}, results.get("mog") or []
    if not curve and not quality:
        return None
    figure, axes = new_figure(1, 2, panel=(5.2, 4.0))
    panels = (("bald_gap", "worst per-set BALD AUROC gap to SGLD (points)", "\n(one network has no BALD)"),
              ("nll_gap", "NLL gap to SGLD (nats)", ""))
    markers = "osD^v<>phX*P8"
    methods = [m for m in methods_in_order(results, quality) if m != "sgld"]
    for ax, (key, ylabel, undefined) in zip(axes[0], panels, strict=True):
        drawn = plot_kept_curve(ax, curve, key)
        growth = [(r["in_sgld_samples"], Stat.of(r["quality"][key]).mean) for r in mog
                  if r.get("quality", {}).get(key) is not None]
        if growth:
            plot_growth(ax, *zip(*growth, strict=True))
        points = {m: (quality[m]["in_sgld_samples"], quality[m][key]) for m in methods
                  if quality[m].get(key) is not None and quality[m].get("in_sgld_samples") is not None}
        offsets = dodge({m: worth for m, (worth, _) in points.items()})
        for i, m in enumerate(methods):
            if m in points:
                worth, value = points[m]
                ax.plot([worth], [value], markers[i % len(markers)], color=colour(m), markersize=8,
                        markeredgecolor="black", label=method_label(m),
                        transform=offset_copy(ax.transData, fig=figure, x=offsets[m], units="points"))
        if points:  # a line drawn through an offset transform does not count in the data limits: the points do
            ax.update_datalim(list(points.values()))
            ax.autoscale_view()
        if drawn or growth or points:
            storage_axes(ax, ylabel, 0, "SGLD (gap 0)")
        else:
            empty_panel(ax, ylabel, "no kept size or method has this gap" + undefined)
    figure_legend(figure)
    signed = ("" if per_draw(quality.values()) else
              "\nthe NLL gap signed in these results (below 0: an NLL below SGLD's)")
    figure.suptitle(f"Storage against quality: gap to SGLD (0 = SGLD itself){signed}\nmarkers at about one "
                    "storage are spread sideways by a few pixels", fontsize=9)
    return plain_ticks(figure)


def distillation_figure(generator: dict) -> Figure | None:
    """The generator's training: the selection criterion of the generated ensemble on validation inputs
    (KL + |BALD gap|, nats, on an axis from 0) against generator steps with the kept step marked (top), and
    the critic's Wasserstein estimate in a panel and on a scale of its own (bottom). Not drawn, and said so
    in the log, from fewer than :data:`MIN_CURVE_POINTS` evaluations: so few points show no trend."""
    history = [h for h in generator.get("history") or [] if "criterion" in h]
    if len(history) < MIN_CURVE_POINTS:
        if history:
            log.info("distillation.png not drawn: %d evaluation(s) of the generator (steps %s) show no trend; a "
                     "curve needs %d (lower distill.eval_every)", len(history),
                     ", ".join(str(h["step"]) for h in history), MIN_CURVE_POINTS)
        return None
    wasserstein = [(h["step"], h["wasserstein"]) for h in history if "wasserstein" in h]
    figure, axes = new_figure(2 if wasserstein else 1, 1, panel=(6.0, 3.0), sharex=True)
    ax = axes[0, 0]
    criterion = [h["criterion"] for h in history]
    ax.plot([h["step"] for h in history], criterion, "o-", color="C0", label="KL + |BALD gap| (validation)")
    kept = generator.get("selection", {}).get("kept_step")
    if kept is not None:
        ax.axvline(kept, color="C0", linestyle="--", label=f"kept: step {kept}")
    ax.set_ylim(0, 1.1 * max(criterion))  # the criterion is ≥ 0: its changes are seen against its size
    ax.set(xlabel="generator steps", ylabel="criterion (nats, from 0)",
           title="Validation criterion (lower = closer to SGLD)")
    ax.legend(fontsize=8)
    if wasserstein:
        critic = axes[1, 0]
        critic.plot(*zip(*wasserstein, strict=True), "o-", color="C1")
        critic.set(xlabel="generator steps", ylabel="Wasserstein estimate\n(critic's output units)",
                   title="The critic's Wasserstein estimate")
        ax.tick_params(labelbottom=True)
    return plain_ticks(figure)


def _open_scores(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise ArtifactError(f"{path}: not a readable HDF5 file ({exc})") from None


def build_figures(eval_dir: Path, results: dict, generator_json: Path | None = None) -> dict[str, Figure | None]:
    """Every figure of an evaluation by file stem, None where its data are missing or too few:
    ``hist_{variation_ratio,bald}``, ``reliability`` and ``sgld_first_layer`` (from ``eval_dir/scores.h5``),
    ``storage_share`` (from results' ``mog``/``apd_share``), ``storage_quality`` (from results'
    ``yardstick``, ``quality`` and ``mog``) and ``distillation`` (from the generator manifest's history)."""
    figures: dict[str, Figure | None] = {}
    scores_path = eval_dir / "scores.h5"
    if scores_path.is_file():
        with _open_scores(scores_path) as scores:
            for score in HISTOGRAM_SCORES:
                figures[f"hist_{score}"] = histogram_figure(scores, score, results)
            figures["reliability"] = reliability_figure(scores, results)
            figures["sgld_first_layer"] = first_layer_figure(scores)
    figures["storage_share"] = storage_share_figure(results)
    figures["storage_quality"] = storage_quality_figure(results)
    if generator_json is not None and generator_json.is_file():
        figures["distillation"] = distillation_figure(read_json(generator_json))
    return figures


def write_figures(eval_dir: Path, results: dict, generator_json: Path | None = None) -> list[Path]:
    """Save the figures of :func:`build_figures` into ``eval_dir/figures/`` as PNG and return their paths;
    the PNG of a figure not drawn this time is removed, so that an older one cannot pass for it."""
    figure_dir = eval_dir / "figures"
    written = []
    for name, figure in build_figures(eval_dir, results, generator_json).items():
        path = figure_dir / f"{name}.png"
        if figure is None:
            path.unlink(missing_ok=True)
            continue
        figure_dir.mkdir(parents=True, exist_ok=True)
        written.append(save_figure(figure, path))
    return written
