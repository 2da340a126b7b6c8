"""The evaluation's figures, built from small hand-made inputs and read back through their axes: labelled
axes, shared x ranges where panels are compared, linear (not symlog) and untwinned axes, chance and SGLD
levels drawn, bin counts shown, plain tick labels, markers that do not hide one another, and no curve drawn
from too few points."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import h5py
import numpy as np
import pytest

from apd.pipeline.figures import (
    CHANCE_AUROC,
    DODGE_POINTS,
    EVALUATION_FIGURES,
    MIN_CURVE_POINTS,
    build_figures,
    distillation_figure,
    dodge,
    histogram_figure,
    reliability_figure,
    storage_quality_figure,
    storage_share_figure,
    write_figures,
)

METHODS = ["sgd", "sgld", "apd", "mog", "kept", "stein"]
SETS = ["gaussian", "uniform"]
TEST_INPUTS = 120


def _stat(mean: float, std: float = 0.0) -> dict[str, float]:
    return {"mean": mean, "std": std}


def hand_made_results() -> dict:
    """APD's BALD AUROC near SGLD's, MoG's inverted (8 %), kept and Stein-thinned SGLD at one storage with
    gaps of opposite sign, MoG growing over three component counts."""
    auroc = {"sgld": 95.0, "apd": 90.0, "mog": 8.0, "kept": 94.0, "stein": 95.5}
    quality = {"sgld": (100.0, 0.0, 0.0), "sgd": (1.0, None, 0.04), "apd": (24.1, 12.0, 0.007),
               "mog": (120.0, 85.0, 1.0), "kept": (25.0, 0.1, 0.002), "stein": (25.0, -0.018, -0.02)}
    return {
        "methods": METHODS,
        "accuracy": {m: {"acc": _stat(0.95 + 0.005 * i)} for i, m in enumerate(METHODS)},
        "ood": {name: {"bald": {m: {"auroc": _stat(value)} for m, value in auroc.items()}} for name in SETS},
        "mog": [{"components": k, "in_sgld_samples": 2.0 * k, "accuracy": _stat(0.5 + 0.007 * k, 0.01),
                 "bald_auroc": _stat(8.0 + 0.5 * k, 1.0), "accuracy_share": 0.5, "bald_auroc_share": 0.08,
                 "quality": {"bald_gap": _stat(85.0 - k, 1.0), "nll_gap": _stat(2.0 - 0.01 * k, 0.1)}}
                for k in (1, 10, 60)],
        "apd_share": {"parameters": 181_046, "in_sgld_samples": 24.1, "accuracy_share": 0.98,
                      "bald_auroc_share": 0.95},
        "quality": {m: {"in_sgld_samples": worth, "bald_gap": bald, "nll_gap": nll}
                    for m, (worth, bald, nll) in quality.items()},
        "yardstick": {"curve": [{"k": k,
                                 "evenly_spaced": {"bald_gap": None if k == 1 else 20.0 / k, "nll_gap": 0.3 / k},
                                 "random": {"bald_gap": None if k == 1 else _stat(10.0 / k, 1.0),
                                            "nll_gap": _stat(0.1 / k, 0.01)}}
                                for k in (1, 2, 5, 10, 20, 50)]},
    }


def write_scores(path: Path) -> None:
    """BALD and variation ratio of every method but SGD (one network has neither), SGLD's reaching 1.4 and
    APD's a tenth of it; confident test predictives, so that the reliability bins hold very different counts."""
    rng = np.random.default_rng(0)
    reach = {"sgld": 1.4, "apd": 0.12, "mog": 1.6, "kept": 1.5, "stein": 1.5}
    with h5py.File(path, "w") as fh:
        fh["test_labels"] = rng.integers(0, 10, size=TEST_INPUTS)
        for method in METHODS:
            fh[f"{method}/test_probs"] = rng.dirichlet(np.full(10, 0.1), size=TEST_INPUTS).astype(np.float32)
            if method == "sgd":
                continue
            for score in ("bald", "variation_ratio"):
                fh[f"{method}/in/{score}"] = reach[method] * rng.random(80) / 4
                for name in SETS:
                    fh[f"{method}/out/{name}/{score}"] = reach[method] * rng.random(80)
        fh["sgld_first_layer"] = rng.standard_normal((4, 8, 8))


def history(steps: list[int]) -> dict:
    return {"history": [{"step": s, "criterion": 0.19 - 0.001 * i, "wasserstein": 5.0 / (i + 1)}
                        for i, s in enumerate(steps)],
            "selection": {"kept_step": steps[-1]}}


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("figures")
    write_scores(root / "scores.h5")
    generator = root / "generator.json"
    generator.write_text(json.dumps(history([250, 500, 750])))
    built = build_figures(root, hand_made_results(), generator)
    for figure in built.values():  # draw once, so that tick labels and transforms are final
        figure.savefig(io.BytesIO(), format="png")
    return built


def panels(figure) -> list:
    """The axes a reader compares: those shown, less colour bars."""
    return [ax for ax in figure.axes if ax.axison and ax.get_label() != "<colorbar>"]


def test_every_figure_is_built_from_the_hand_made_inputs(figures):
    assert {name for name, figure in figures.items() if figure is not None} == {
        "hist_bald", "hist_variation_ratio", "reliability", "sgld_first_layer", "storage_share",
        "storage_quality", "distillation"} == set(EVALUATION_FIGURES)


@pytest.mark.parametrize("name", ["hist_bald", "hist_variation_ratio", "reliability", "storage_share",
                                  "storage_quality", "distillation"])
def test_every_panel_labels_both_axes_and_none_is_symlog_or_twinned(figures, name):
    figure = figures[name]
    for ax in panels(figure):
        assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), (name, ax.get_title())
        assert ax.get_yscale() != "symlog" and ax.get_xscale() != "symlog"
    positions = [tuple(np.round(ax.get_position().bounds, 6)) for ax in panels(figure)]
    assert len(set(positions)) == len(positions), f"{name}: two axes on one spot (twin axes)"


@pytest.mark.parametrize("name", ["hist_bald", "hist_variation_ratio", "reliability", "sgld_first_layer",
                                  "storage_share", "storage_quality", "distillation"])
def test_tick_labels_are_plain_numbers(figures, name):
    for ax in figures[name].axes:
        for axis in (ax.xaxis, ax.yaxis):
            for text in [*axis.get_ticklabels(), *axis.get_ticklabels(minor=True), axis.get_offset_text()]:
                label = text.get_text()
                assert not any(mark in label for mark in ("$", "^", "×", "e-", "e+", "e−")), (name, label)


@pytest.mark.parametrize("score", ["bald", "variation_ratio"])
def test_histogram_panels_share_one_x_range(figures, score):
    shown = panels(figures[f"hist_{score}"])
    assert len(shown) == len(METHODS) - 1  # SGD has no BALD
    assert len({ax.get_xlim() for ax in shown}) == 1
    low, high = shown[0].get_xlim()
    assert low <= 0.0 and high >= 1.4 * 0.95  # SGLD's reach: APD's panel is drawn on the same range
    assert all(ax.get_ylabel() == "% of the set's inputs" for ax in shown)
    assert figures[f"hist_{score}"].legends  # one legend, outside the panels


def test_histogram_needs_scores_and_sets(tmp_path):
    with h5py.File(tmp_path / "empty.h5", "w") as fh:
        fh["test_labels"] = np.zeros(3, dtype=np.int64)
        assert histogram_figure(fh, "bald", hand_made_results()) is None
        assert reliability_figure(fh, hand_made_results()) is None


def test_reliability_bars_carry_their_counts_and_no_legend_covers_them(figures):
    figure = figures["reliability"]
    for ax in panels(figure):
        counts = [int(text.get_text()) for text in ax.texts]
        assert sum(counts) == TEST_INPUTS and len(counts) == len(ax.patches)
        assert ax.get_legend() is None
    assert len(figure.legends) == 1


def test_storage_share_shows_auroc_itself_with_chance_and_sgld_levels(figures):
    accuracy, auroc = panels(figures["storage_share"])
    levels = {line.get_label(): line.get_ydata()[0] for line in auroc.lines if len(set(line.get_ydata())) == 1}
    assert levels["chance (AUROC 50)"] == CHANCE_AUROC
    assert levels["SGLD's own value"] == pytest.approx(95.0)
    mog = next(bars for bars in auroc.containers if bars.get_label() == "MoG, k components (mean ± std over draws)")
    assert list(mog.lines[0].get_ydata()) == pytest.approx([8.5, 13.0, 38.0])  # AUROC in percent, not a share
    apd = next(line for line in auroc.lines if line.get_label() == "APD")
    assert list(apd.get_ydata()) == [90.0]
    assert auroc.get_ylim()[0] < 8.5 and auroc.get_ylim()[1] > 95.0
    assert "chance (AUROC 50)" not in {line.get_label() for line in accuracy.lines}
    assert "%" in accuracy.get_ylabel() and "%" in auroc.get_ylabel()


def test_storage_quality_is_linear_with_a_title_true_for_its_gaps(figures):
    figure = figures["storage_quality"]
    shown = panels(figure)
    assert len(shown) == 2 and all(ax.get_yscale() == "linear" for ax in shown)
    assert all(ax.get_xscale() == "log" for ax in shown)
    title = figure.get_suptitle()  # these results predate gaps per draw: their NLL gap is signed
    assert "0 = SGLD itself" in title and "the NLL gap signed in these results (below 0: an NLL below SGLD's)" in title
    results = hand_made_results()
    per_draw = {**results, "quality": {m: {**q, "set_gaps": {}} for m, q in results["quality"].items()}}
    assert "signed" not in storage_quality_figure(per_draw).get_suptitle()  # two-sided: no gap below 0
    stein = next(line for line in shown[1].lines if line.get_label() == "Stein-thinned SGLD")
    assert list(stein.get_ydata()) == [-0.02]  # a negative gap drawn where it is
    assert shown[1].get_ylim()[0] < -0.02


def test_markers_at_one_storage_are_separated(figures):
    for ax in panels(figures["storage_quality"]):
        drawn = {line.get_label(): line.get_transform().transform(np.column_stack(line.get_data()))[0]
                 for line in ax.lines if line.get_label() in {"kept SGLD", "Stein-thinned SGLD"}}
        assert set(drawn) == {"kept SGLD", "Stein-thinned SGLD"}
        assert abs(drawn["kept SGLD"][0] - drawn["Stein-thinned SGLD"][0]) >= 5.0  # pixels apart
        markers = {line.get_marker() for line in ax.lines if line.get_label() in drawn}
        assert len(markers) == 2


def test_dodge_spreads_only_points_at_one_storage():
    offsets = dodge({"kept": 25.0, "apd": 24.1, "stein": 25.0, "mog": 120.0, "sgd": 1.0})
    assert offsets["mog"] == offsets["sgd"] == 0.0
    assert [offsets[m] for m in ("apd", "kept", "stein")] == [-DODGE_POINTS, 0.0, DODGE_POINTS]


def test_distillation_draws_its_two_curves_in_panels_of_their_own(figures):
    criterion, critic = panels(figures["distillation"])
    assert criterion.get_yscale() == critic.get_yscale() == "linear"
    assert criterion.get_ylabel().startswith("criterion (nats") and "Wasserstein" in critic.get_ylabel()
    assert criterion.get_ylim()[0] == 0.0


@pytest.mark.parametrize("steps", [[], [250], [250, 500]])
def test_a_curve_of_too_few_evaluations_is_not_drawn(tmp_path, caplog, steps):
    assert len(steps) < MIN_CURVE_POINTS
    with caplog.at_level(logging.INFO, logger="apd.pipeline.figures"):
        assert distillation_figure(history(steps) if steps else {"history": []}) is None
    assert ("distillation.png not drawn" in caplog.text) == bool(steps)


def test_a_figure_not_drawn_again_leaves_no_old_png(tmp_path):
    generator = tmp_path / "generator.json"
    generator.write_text(json.dumps(history([100, 200, 300])))
    assert [path.name for path in write_figures(tmp_path, {}, generator)] == ["distillation.png"]
    generator.write_text(json.dumps(history([250, 500])))
    assert write_figures(tmp_path, {}, generator) == []
    assert not (tmp_path / "figures" / "distillation.png").exists()


def test_storage_figures_need_their_data():
    assert storage_share_figure({}) is None and storage_quality_figure({}) is None


def test_a_gap_no_size_or_method_has_leaves_its_panel_saying_so():
    """One kept sample and one mode (a single network each) have no BALD: the BALD panel says so, with no
    log scale to draw on nothing, and the figure renders; the NLL panel is drawn as usual."""
    results = {"methods": ["sgld", "modes"], "quality": {"sgld": {"in_sgld_samples": 100.0, "bald_gap": 0.0,
                                                                  "nll_gap": 0.0},
                                                         "modes": {"in_sgld_samples": 1.0, "bald_gap": None,
                                                                   "nll_gap": 0.05}},
               "yardstick": {"curve": [{"k": 1, "evenly_spaced": {"bald_gap": None, "nll_gap": 0.3},
                                        "random": {"bald_gap": None, "nll_gap": _stat(0.2, 0.01)}}]}}
    figure = storage_quality_figure(results)
    figure.savefig(io.BytesIO(), format="png")
    bald, nll = panels(figure)
    assert bald.get_xscale() == "linear" and not bald.lines
    assert "no kept size or method has this gap" in bald.texts[0].get_text() and "no BALD" in bald.texts[0].get_text()
    assert nll.get_xscale() == "log" and nll.lines and not nll.texts
    (even,) = [line for line in nll.lines if line.get_label() == "kept SGLD, evenly spaced"]
    (subsets,) = [bars.lines[0] for bars in nll.containers if bars.get_label() == "kept SGLD, random subsets"]
    assert even.get_marker() == subsets.get_marker() == "."  # one kept size alone still shows


def test_a_method_beyond_the_kept_curve_is_inside_its_panel():
    """The kept curve reaches one sample's storage; a method storing 3.3 samples' worth, with a gap above the
    curve's, is inside both panels' limits (markers drawn sideways of their point still set the limits)."""
    results = {"methods": ["sgld", "modes"], "quality": {"sgld": {"in_sgld_samples": 100.0, "bald_gap": 0.0,
                                                                  "nll_gap": 0.0},
                                                         "modes": {"in_sgld_samples": 3.3, "bald_gap": 0.41,
                                                                   "nll_gap": 0.5}},
               "yardstick": {"curve": [{"k": 1, "evenly_spaced": {"bald_gap": None, "nll_gap": 0.3},
                                        "random": {"bald_gap": None, "nll_gap": _stat(0.2, 0.01)}}]}}
    figure = storage_quality_figure(results)
    figure.savefig(io.BytesIO(), format="png")
    for ax, gap in zip(panels(figure), (0.41, 0.5), strict=True):
        (low, high), (bottom, top) = ax.get_xlim(), ax.get_ylim()
        assert ax.get_xscale() == "log" and low < 3.3 < high and bottom < gap < top
