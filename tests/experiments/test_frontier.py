"""``apd experiment frontier``: APD with one generator per chain against as many kept samples, per budget."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from apd.cli import main
from apd.config_load import from_dict
from apd.distillation.precision import PartPrecisions, stored_bytes
from apd.docs import render_document
from apd.experiments.frontier import below_kept, crossings, fewer_bytes, render_table
from apd.experiments.precision import chain_generators_storage, coordinates_storage
from apd.nets import ParamSpec, mlp
from tests.tiny_pipeline import TINY, copy_samples_as_two_chains, without_timings

SPEC = ParamSpec.from_module(mlp([64, 32, 10]))  # the tiny pipeline's network: D = 2,410


def _frontier(tiny_pipeline, target, *options: str, force: bool = False) -> tuple[int, str]:
    """``apd experiment frontier`` on the tiny pipeline's samples split into two chains: (exit code, stderr)."""
    root, config = tiny_pipeline
    copy_samples_as_two_chains(root, target)
    args = ["experiment", "frontier", "--config", str(config), "--artifacts", str(target), "--quiet",
            *(["--force"] if force else [])]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([*args, *(arg for option in options for arg in ("--option", option))])
    return rc, err.getvalue()


def test_each_budget_buys_apd_its_largest_rank_and_the_kept_samples_as_many_samples(tiny_pipeline, tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[4, 1, 2]", "steps=20")
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    results = json.loads((out / "frontier.json").read_text())
    points = results["points"]
    assert [p["budget"] for p in points] == [1, 2, 4]  # in increasing order
    # where it was made: the machine, and the digests of the store it read, as the store's manifest gives them
    store = json.loads((tmp_path / "tiny" / "samples.json").read_text())
    assert results["provenance"]["store_files"] == store["files"] and results["provenance"]["machine"]["cores"] >= 1
    assert results["provenance"]["store_samples"] == store["samples_digest"] is not None
    d = from_dict(TINY).distill
    storage = lambda r: chain_generators_storage(d, r, SPEC, 2, PartPrecisions("int8"))  # noqa: E731
    for point in points:
        apd, kept = point["apd"], point["kept"]
        assert kept["k"] == point["budget"] == kept["in_sgld_samples"] and kept["subsets"] == 200
        assert apd["chains"] == 2
        assert storage(apd["rank"]) <= point["budget"] < storage(apd["rank"] + 1)
        assert apd["in_sgld_samples"] == pytest.approx(storage(apd["rank"]))  # the trained model's own bytes
        # BALD and max-prob on 2 tuning sets, and the NLL; one kept network has no BALD to beat
        assert apd["margins"]["compared"] == (5 if point["budget"] > 1 else 3)
        # the ceiling: all 200 samples' coordinates in APD's subspace, at float32, judged the same way
        ceiling = point["ceiling"]
        assert ceiling["rank"] == apd["rank"] and ceiling["margins"]["compared"] == apd["margins"]["compared"]
        assert ceiling["in_sgld_samples"] == pytest.approx(coordinates_storage(apd["rank"], SPEC, 200, "float32"))
        # and as stored: the same coordinates decoded by the codec read back from int8, counted so
        as_stored = point["ceiling_codec_at_precision"]
        assert as_stored["rank"] == apd["rank"] and as_stored["codec_at"] == "int8"
        codec_int8 = coordinates_storage(apd["rank"], SPEC, 0, "int8")  # the coordinates still 4 bytes each:
        assert as_stored["in_sgld_samples"] == pytest.approx(codec_int8 + 200 * apd["rank"] / SPEC.numel)
        assert as_stored["margins"]["compared"] == apd["margins"]["compared"]
        # and ⌈S / s⌉ samples each stored at APD's precision (s = 0.2656 at int8), judged the same way: the
        # fewest whose storage reaches the budget, so at least APD's
        stored_kept = point["kept_at_precision"]
        assert stored_kept["precision"] == "int8"
        assert stored_kept["k"] == {1: 4, 2: 8, 4: 16}[point["budget"]]
        assert point["budget"] <= stored_kept["in_sgld_samples"] < point["budget"] + 0.27
        assert stored_kept["in_sgld_samples"] >= apd["in_sgld_samples"]
        assert apd["margins_at_precision"]["compared"] == ceiling["margins_at_precision"]["compared"] == 5
        assert as_stored["margins_at_precision"]["compared"] == 5
        # and the fewest samples that take at least S each stored at int8 about its chain's mean, with the means
        # of the chains they come from (two: the selections are stratified) at int8 too
        around = point["kept_around_means"]
        assert around["precision"] == "int8 around chain means at int8"
        worth = lambda k: (k + min(k, 2)) * stored_bytes(SPEC.numel, "int8") / (4 * SPEC.numel)  # noqa: E731
        assert worth(around["k"] - 1) < point["budget"] <= worth(around["k"])
        assert around["in_sgld_samples"] == pytest.approx(worth(around["k"]))
        assert apd["margins_around_means"]["compared"] == ceiling["margins_around_means"]["compared"] == 5
    assert points[0]["apd"]["rank"] < points[1]["apd"]["rank"] < points[2]["apd"]["rank"]
    table = (out / "frontier.md").read_text()
    assert f"| 4 | APD per chain | r={points[2]['apd']['rank']} |" in table
    assert f"| 4 | SGLD coordinates (APD's ceiling) | r={points[2]['apd']['rank']} |" in table
    assert f"| 4 | SGLD coordinates, codec at int8 (APD's ceiling as stored) | r={points[2]['apd']['rank']} |" in table
    assert "| 4 | kept, random subsets | k=4 |" in table
    assert f"| 4 | kept at int8, random subsets | k={points[2]['kept_at_precision']['k']} |" in table
    assert "wins over kept at int8 | below both kept at int8 |" in table
    around = "kept at int8 around chain means at int8"
    assert f"| wins over {around} | below both {around} |" in table
    assert f"| 4 | {around}, random subsets | k={points[2]['kept_around_means']['k']} |" in table
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_generator_told_the_chain_takes_the_budget_of_one_generator_and_its_embeddings(tiny_pipeline, tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[2]", "steps=5", "mode_embedding=4", "ceiling=false")
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    assert not (out / "frontier.json").exists()  # the per-chain frontier's files are its own
    point = json.loads((out / "frontier-int8-conditioned-4.json").read_text())["points"][0]
    d = from_dict(TINY).distill
    told = lambda r: chain_generators_storage(d, r, SPEC, 2, PartPrecisions("int8"), mode_embedding=4)  # noqa: E731
    apd = point["apd"]
    assert told(apd["rank"]) <= 2 < told(apd["rank"] + 1) and apd["in_sgld_samples"] == pytest.approx(told(apd["rank"]))
    assert apd["margins"]["compared"] == 5 and point["kept"]["k"] == 2
    table = (out / "frontier-int8-conditioned-4.md").read_text()
    assert f"| 2 | APD told the chain | r={apd['rank']} |" in table and "APD per chain" not in table
    assert "APD with one generator told the chain by 4 learned numbers in the largest shared principal" in table


def test_one_generator_told_the_chain_stores_one_generator_and_c_embeddings_in_place_of_c_generators():
    """At float32 (4 bytes a number) and rank r, C = 3 chains: one generator z_dim + E → 32 → r in place of
    C generators z_dim → 32 → r is E·32 first-layer weights more and (C − 1)·G fewer (G: one generator's
    parameters), plus C·E embedding numbers; the codec and the C shares are the same."""
    d, rank, chains, embedding = from_dict(TINY).distill, 6, 3, 4
    one = (d.z_dim + 1) * 32 + (32 + 1) * rank
    per_chain = chain_generators_storage(d, rank, SPEC, chains, PartPrecisions())
    told = chain_generators_storage(d, rank, SPEC, chains, PartPrecisions(), mode_embedding=embedding)
    assert (told - per_chain) * SPEC.numel == embedding * 32 + chains * embedding - (chains - 1) * one


def test_a_budget_too_small_for_the_generators_still_scores_the_kept_samples(tiny_pipeline, tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[1]", 'precision="float32"')
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    assert not (out / "frontier.json").exists()  # a precision other than int8 has files of its own
    point = json.loads((out / "frontier-float32.json").read_text())["points"][0]
    assert point["apd"] is None and point["kept"]["k"] == 1  # the codec's mean alone is one sample at float32
    assert point["kept_at_precision"] is point["kept_around_means"] is None  # at float32: the kept samples again
    table = (out / "frontier-float32.md").read_text()
    assert "none fits" in table and "| kept at" not in table


def test_the_ceiling_and_the_samples_kept_at_apds_precision_are_left_out_on_request(tiny_pipeline, tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[2]", "steps=5", "ceiling=false",
                        "kept_at_precision=false", "kept_around_means=false", 'precision="int4"')
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    point = json.loads((out / "frontier-int4.json").read_text())["points"][0]
    assert point["apd"] is not None and point["kept_at_precision"] is point["kept_around_means"] is None
    assert point["ceiling"] is point["ceiling_codec_at_precision"] is None
    assert point["apd"]["margins_at_precision"] is point["apd"]["margins_around_means"] is None
    table = (out / "frontier-int4.md").read_text()
    assert "ceiling" not in table and "| kept at" not in table and "fit S at int4" in table
    assert "APD trained for 5 generator steps, once per budget" in table


def test_a_tag_gives_a_variant_files_of_its_own(tiny_pipeline, tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[1]", 'precision="float32"', 'tag="steps-5"')
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    assert sorted(p.name for p in out.iterdir()) == [f"frontier-float32-steps-5.{ext}" for ext in ("json", "md", "png")]
    assert json.loads((out / "frontier-float32-steps-5.json").read_text())["plan"]["tag"] == "steps-5"


@pytest.mark.parametrize("tag", ["Steps", "-5", "a/b", "x" * 41])
def test_a_tag_that_is_no_plain_file_name_part_is_a_one_line_error(tiny_pipeline, tmp_path, tag):
    rc, err = _frontier(tiny_pipeline, tmp_path, f'tag="{tag}"')
    assert rc == 2 and "tag" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "tiny" / "experiments").exists()


@pytest.mark.parametrize(("budgets", "message"), [("[]", "at least one budget"), ("[0, 2]", "positive integers"),
                                                  ("[100000]", "holds 200 samples")])
def test_budgets_that_cannot_be_kept_are_one_line_errors(tiny_pipeline, tmp_path, budgets, message):
    rc, err = _frontier(tiny_pipeline, tmp_path, f"budgets={budgets}")
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def _point(budget: float, apd: dict | None, evenly: dict, random: dict, ceiling: dict | None = None,
           at_precision: tuple[dict, dict] | None = None, at_precision_storage: float | None = None) -> dict:
    """A frontier point with the yardstick summaries (bald_gap, max_prob_gap, nll_gap, kl) given, and the
    (evenly spaced, random) summaries of the samples kept at APD's precision where given, of storage
    ``at_precision_storage`` (default: 0.1 above the budget, as ⌈S / s⌉ samples take)."""
    spread = lambda values: {key: None if v is None else {"mean": v, "std": 0.1}  # noqa: E731
                             for key, v in values.items()}
    scored = lambda values, storage: None if values is None else {  # noqa: E731
        **spread(values), "rank": 3, "in_sgld_samples": storage, "margins": {"wins": 0, "compared": 9},
        "margins_at_precision": None if at_precision is None else {"wins": 1, "compared": 9}}
    stored_kept = None if at_precision is None else {
        "k": 7 * budget + 1, "in_sgld_samples": at_precision_storage or budget + 0.1, "evenly_spaced": at_precision[0],
        "random": spread(at_precision[1])}
    return {"budget": budget, "apd": scored(apd, budget), "ceiling": scored(ceiling, 50),
            "kept": {"k": budget, "in_sgld_samples": budget, "evenly_spaced": evenly, "random": spread(random)},
            "kept_at_precision": stored_kept}


def test_apd_is_below_ranked_kept_samples_where_it_wins_on_a_summary():
    # evenly spaced and last gaps, then 200 random subsets' gaps 0.01 … 2.00 (by 0.01) on every summary
    values = [(i + 1) / 100 for i in range(200)]
    fixed = {"bald_gap": 3.0, "max_prob_gap": 0.05, "nll_gap": 0.5, "kl": 2.5}
    kept = {"k": 4, "in_sgld_samples": 4, "evenly_spaced": fixed, "last": {**fixed, "kl": 0.05},
            "random": {key: {"mean": 1.0, "std": 0.6, "values": values} for key in fixed}}
    # BALD 0.05: 195 subsets larger, one tie: rank 97.75, below both fixed gaps (3.0): a win; max-prob 0.04:
    # rank 98.25, below 0.05: a win; NLL 0.2: rank 90.25, no win; KL 0.06: the last samples' 0.05 is smaller
    apd = {key: {"mean": value, "std": 0.0} for key, value in
           {"bald_gap": 0.05, "max_prob_gap": 0.04, "nll_gap": 0.2, "kl": 0.06}.items()}
    point = {"budget": 4, "apd": {**apd, "in_sgld_samples": 4}, "kept": kept, "kept_at_precision": None}
    assert below_kept(point) == ["BALD", "max-prob"]


def test_apd_is_below_the_kept_samples_where_each_summary_is_smaller_than_both_kept_rows():
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    random = {"bald_gap": 2.5, "max_prob_gap": 1.0, "nll_gap": 0.001, "kl": 0.01}
    crossing = _point(4, {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": -0.002, "kl": 0.005}, kept, random)
    # BALD below both; max-prob below the evenly spaced (2.0) but not the random mean (1.0); an NLL gap of
    # +0.005 above the random subsets' +0.001; KL equal to the random mean, so not below it
    partial = _point(8, {"bald_gap": 2.0, "max_prob_gap": 1.5, "nll_gap": 0.005, "kl": 0.01}, kept, random,
                     ceiling={"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": -0.002, "kl": 0.005})
    one_sample = _point(1, {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": -0.002, "kl": 0.005},
                        {**kept, "bald_gap": None}, {**random, "bald_gap": None})
    assert below_kept(crossing) == ["BALD", "max-prob", "NLL", "KL"]  # -0.002 < +0.001: signed gaps
    assert below_kept(partial) == ["BALD"]
    assert below_kept(partial, "ceiling") == ["BALD", "max-prob", "NLL", "KL"]  # the ceiling is not APD:
    assert below_kept(one_sample) == ["max-prob", "NLL", "KL"]  # one kept network has no BALD to be below
    assert below_kept(_point(2, None, kept, random)) == []
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int8", "subsets": 3}, "points": [one_sample, crossing, partial]}
    assert crossings(results) == [4]  # ...APD's curve crosses where APD is below, not where its ceiling is
    table = render_table(results)
    assert "| 8 | APD per chain | r=3 | 8 |" in table and table.rstrip().endswith("at 4 samples' worth.")
    assert "APD trained once per budget (one seed: its spread is the draws', not the training's); 2 runs × 5" in table
    assert "| 8 | SGLD coordinates (APD's ceiling) | r=3 | 50 |" in table and table.count("APD's ceiling") == 2
    assert "ceiling" not in render_table({**results, "points": [one_sample, crossing]})
    twice = {**results, "points": [crossing, {**crossing, "budget": 8}, {**crossing, "budget": 16}]}
    assert render_table(twice).rstrip().endswith("at 4, 8 and 16 samples' worth.")
    assert crossings({**results, "points": [partial]}) == []
    assert render_table({**results, "points": [partial]}).rstrip().endswith("at no budget.")
    assert "| kept at" not in table and "buys at" not in table  # no samples kept at APD's precision


def test_apd_is_judged_against_the_samples_kept_at_its_precision_on_their_own_rows():
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    closer = {"bald_gap": 0.5, "max_prob_gap": 0.4, "nll_gap": 0.0, "kl": 0.004}  # more samples, rounded
    apd = {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": -0.002, "kl": 0.005}
    point = _point(2, apd, kept, kept, at_precision=(closer, {**closer, "kl": 0.006}))
    assert below_kept(point) == ["BALD", "max-prob", "NLL", "KL"]
    # BALD and max-prob above both; NLL -0.002 below 0.0; KL 0.005 above the evenly spaced 0.004
    assert below_kept(point, "apd", "kept_at_precision") == ["NLL"]
    assert below_kept(_point(2, apd, kept, kept), "apd", "kept_at_precision") == []  # none kept at it
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int4", "subsets": 3}, "points": [point]}
    assert crossings(results) == [2] and crossings(results, "kept_at_precision") == []
    table = render_table(results)
    assert "| 2 | APD per chain | r=3 | 2 |" in table and "| 0 of 9 | BALD, max-prob, NLL, KL | 1 of 9 | NLL |" in table
    assert "| 2 | kept at int4, evenly spaced | k=15 | 2.1 |" in table
    assert "and ⌈S / s⌉ SGLD samples (s: one sample's storage at int4; at least S where the store holds that " \
           "many), each stored at int4" in table
    assert table.rstrip().endswith("at 2 samples' worth; below both rows of the samples kept at int4, with at least "
                                   "its storage, at no budget.")


def test_apd_is_judged_against_the_samples_kept_around_their_chains_means_on_their_own_rows():
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    apd = {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": 0.002, "kl": 0.005}
    closer = {"bald_gap": 0.8, "max_prob_gap": 0.4, "nll_gap": 0.001, "kl": 0.003}  # below APD on all four
    point = _point(2, apd, kept, kept, at_precision=(kept, kept))
    point["kept_around_means"] = {"k": 11, "in_sgld_samples": 2.05, "evenly_spaced": closer,
                                  "random": {key: {"mean": value, "std": 0.1} for key, value in closer.items()}}
    point["apd"]["margins_around_means"] = {"wins": 0, "compared": 9}
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int4", "mean_at": "int8", "subsets": 3}, "points": [point]}
    assert below_kept(point, "apd", "kept_around_means") == []
    assert crossings(results, "kept_at_precision") == [2] and crossings(results, "kept_around_means") == []
    table = render_table(results)
    assert "| below both kept at int4 | wins over kept at int4 around chain means at int8 |" in table
    assert "| 2 | kept at int4 around chain means at int8, evenly spaced | k=11 | 2.05 | +0.8 |" in table
    assert "| 1 of 9 | BALD, max-prob, NLL, KL | 0 of 9 | none |" in table
    assert ("each as its deviation from its chain's mean, the means of the chains they come from at int8" in table)
    assert table.rstrip().endswith("below both rows of the samples kept at int4, with at least its storage, at 2 "
                                   "samples' worth; below both rows of the samples kept at int4 around chain means "
                                   "at int8, with at least its storage, at no budget.")


def test_no_crossing_is_counted_where_the_samples_kept_at_apds_precision_take_less_storage_than_apd():
    """A store of fewer samples than ⌈S / s⌉ keeps them all: at 2 samples' worth, 1.9 against APD's 2. APD
    below them on every summary there is no crossing at equal bytes; at 4, with 4.1, it is."""
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    apd = {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": -0.002, "kl": 0.005}
    short = _point(2, apd, kept, kept, at_precision=(kept, kept), at_precision_storage=1.9)
    enough = _point(4, apd, kept, kept, at_precision=(kept, kept), at_precision_storage=4.1)
    assert below_kept(short, "apd", "kept_at_precision") == below_kept(enough, "apd", "kept_at_precision") == [
        "BALD", "max-prob", "NLL", "KL"]
    assert not fewer_bytes(short, "kept") and fewer_bytes(short, "kept_at_precision")
    assert not fewer_bytes(enough, "kept_at_precision")
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int4", "subsets": 3}, "points": [short, enough]}
    assert crossings(results) == [2, 4] and crossings(results, "kept_at_precision") == [4]
    table = render_table(results)
    assert table.rstrip().endswith("with at least its storage, at 4 samples' worth. At 2 samples' worth the samples "
                                   "kept at int4 take less storage than APD, so no crossing is counted there.")


def test_apd_trained_from_several_seeds_is_judged_training_by_training(tiny_pipeline, tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path / "one", "budgets=[2]", "steps=5", "ceiling=false")
    assert rc == 0, err
    rc, err = _frontier(tiny_pipeline, tmp_path / "three", "budgets=[2]", "steps=5", "ceiling=false", "seeds=3")
    assert rc == 0, err
    once, thrice = (json.loads((tmp_path / name / "tiny" / "experiments" / "frontier.json").read_text())["points"][0]
                    for name in ("one", "three"))
    trained = [thrice["apd"], *thrice["retrained"]]
    assert [t["seed"] for t in trained] == [0, 1, 2] and once["retrained"] == []
    assert len({t["rank"] for t in trained}) == 1 and len({t["in_sgld_samples"] for t in trained}) == 1
    # generator seed 0 is the one training of a study of one seed: its gaps are the same to the last digit
    assert {k: v for k, v in thrice["apd"].items() if k != "seconds"} == {
        k: v for k, v in once["apd"].items() if k != "seconds"}
    assert trained[1]["bald_gap"] != trained[0]["bald_gap"] != trained[2]["bald_gap"]  # trained and drawn anew
    table = (tmp_path / "three" / "tiny" / "experiments" / "frontier.md").read_text()
    assert all(f"| 2 | APD per chain, seed {k} | r={thrice['apd']['rank']} |" in table for k in range(3))
    assert "APD trained for 5 generator steps, 3 times per budget, from generator seeds 0 to 2" in table
    assert "in every one of its 3 trainings at" in table and "(seed by seed: " in table


def test_a_study_cut_short_takes_what_it_finished_and_ends_as_an_uninterrupted_one(tiny_pipeline, tmp_path,
                                                                                  monkeypatch):
    """A Ctrl-C in the second budget's second training leaves the first budget's parts and the second's kept
    sets and first training in experiments/frontier.partial; the next run trains only what is left and
    writes what an uninterrupted run writes, timings aside, leaving nothing behind; --force starts over."""
    import apd.experiments.frontier as frontier_module

    real, trained = frontier_module.train_chain_generators, []

    def training(*args, stop_at: int | None = None, **kwargs):
        if len(trained) == stop_at:
            raise KeyboardInterrupt
        trained.append(args[-1])  # the generator seed
        return real(*args, **kwargs)

    options = ("budgets=[2, 4]", "steps=5", "seeds=2")
    monkeypatch.setattr(frontier_module, "train_chain_generators", lambda *a, **kw: training(*a, stop_at=3, **kw))
    assert _frontier(tiny_pipeline, tmp_path / "cut", *options)[0] == 130
    out = tmp_path / "cut" / "tiny" / "experiments"
    assert trained == [0, 1, 0] and not (out / "frontier.json").exists()
    # per budget: the three kept sets, each training and the two ceilings; the second budget's so far; the key
    assert len(list((out / "frontier.partial").glob("*.json"))) == 7 + 4 + 1
    monkeypatch.setattr(frontier_module, "train_chain_generators", training)
    assert _frontier(tiny_pipeline, tmp_path / "cut", *options)[0] == 0
    assert trained == [0, 1, 0, 1] and not (out / "frontier.partial").exists()
    assert _frontier(tiny_pipeline, tmp_path / "whole", *options)[0] == 0
    resumed, whole = (json.loads((tmp_path / name / "tiny" / "experiments" / "frontier.json").read_text())
                      for name in ("cut", "whole"))
    assert without_timings(resumed) == without_timings(whole)
    whole_table = (tmp_path / "whole" / "tiny" / "experiments" / "frontier.md").read_text()
    assert (out / "frontier.md").read_text() == whole_table

    trained.clear()
    monkeypatch.setattr(frontier_module, "train_chain_generators", lambda *a, **kw: training(*a, stop_at=1, **kw))
    assert _frontier(tiny_pipeline, tmp_path / "cut", *options, force=True)[0] == 130
    monkeypatch.setattr(frontier_module, "train_chain_generators", training)
    assert _frontier(tiny_pipeline, tmp_path / "cut", *options, force=True)[0] == 0 and trained == [0, 0, 1, 0, 1]


def test_with_room_for_one_storage_each_sample_is_predicted_once_per_storage(tiny_pipeline, tmp_path, monkeypatch):
    """Where the predictions' memory holds the store's predictions at one storage only, the kept sets are judged
    one storage after another (float32, int8, int8 about the chains' means), each sample predicted at most once
    at each, and the study is the one judged with room for all."""
    from tests.tiny_pipeline import counted_predictions, one_storage

    options = ("budgets=[2, 4]", "steps=5")
    assert _frontier(tiny_pipeline, tmp_path / "roomy", *options)[0] == 0
    predicted = counted_predictions(monkeypatch, room=one_storage(tiny_pipeline[0], "tuning"))
    assert _frontier(tiny_pipeline, tmp_path / "tight", *options)[0] == 0
    assert 2 * 200 < sum(predicted) <= 3 * 200
    roomy, tight = (json.loads((tmp_path / name / "tiny" / "experiments" / "frontier.json").read_text())
                    for name in ("roomy", "tight"))
    assert without_timings(roomy) == without_timings(tight)


def test_a_crossing_over_several_trainings_counts_where_every_one_crosses(tmp_path):
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    below = {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": 0.001, "kl": 0.005}
    above = {**below, "kl": 0.05}
    points = [_point(2, below, kept, kept), _point(4, below, kept, kept)]
    for point, other in zip(points, (below, above), strict=True):  # at 4, seed 2 is above on the KL
        seed_1, seed_2 = (_point(point["budget"], values, kept, kept)["apd"] for values in (below, other))
        for k, summary in enumerate((point["apd"], seed_1, seed_2)):
            summary.update(seed=k, chains=2, margins={"wins": 5 + k - 2 * (summary is seed_2), "compared": 9})
        point["retrained"] = [seed_1, seed_2]
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int8", "subsets": 3, "seeds": 3}, "points": points}
    assert crossings(results) == [2] and crossings(results, seed=1) == [2, 4] and crossings(results, seed=2) == [2]
    assert render_table(results).rstrip().endswith(
        "in every one of its 3 trainings at 2 samples' worth (seed by seed: 2, 4; 2, 4; 2).")
    (tmp_path / "docs" / "results" / "p").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "p" / "frontier.json").write_text(json.dumps(results))
    rendered = render_document("<!-- results:p:frontiers -->\nold\n<!-- end -->\n", tmp_path)
    # three trainings; set-by-set wins 5, 6 and 5 of 9 at each budget: 5–6
    assert "| `p` | 10 | 2 | 3 | 2, 4 | 3, 3 | 2 | — | — | 5–6/9, 5–6/9 |" in rendered


def test_the_note_gives_the_generator_steps_the_trainings_record_where_the_plan_took_the_pipelines():
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    point = _point(2, kept, kept, kept)
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int8", "subsets": 3, "steps": 0}, "points": [point]}
    assert "APD trained once per budget" in render_table(results)  # written before the steps were recorded
    point["apd"]["steps"] = 7
    assert "APD trained for 7 generator steps, once per budget" in render_table(results)
    results["plan"]["steps"] = 10_000
    assert "APD trained for 10,000 generator steps, once per budget" in render_table(results)


def test_the_frontiers_region_puts_several_pipelines_frontiers_side_by_side(tmp_path):
    """One row per pipeline named in the region, each from its committed frontier.json alone."""
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    below = {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": 0.001, "kl": 0.005}
    above = {**below, "kl": 0.05}
    frontiers = {"small": [_point(1, None, kept, kept), _point(4, below, kept, kept)],
                 "large": [_point(2, above, kept, kept), _point(4, above, kept, kept)],
                 "compact": [_point(2, below, kept, kept, at_precision=(kept, kept)),
                             _point(4, below, kept, kept, at_precision=(below, below))]}
    frontiers["compact"][1]["kept_around_means"] = {  # at 4 only, APD below them
        "k": 30, "in_sgld_samples": 4.05, "evenly_spaced": kept,
        "random": {key: {"mean": value, "std": 0.1} for key, value in kept.items()}}
    for name, points in frontiers.items():
        for point in points:
            if point["apd"] is not None:
                point["apd"].update(chains=2, margins={"wins": point["budget"], "compared": 9})
        (tmp_path / "docs" / "results" / name).mkdir(parents=True)
        (tmp_path / "docs" / "results" / name / "frontier.json").write_text(json.dumps({"dim": 2410, "points": points}))
    document = "<!-- results:small,large,compact:frontiers -->\nold\n<!-- end -->\n"
    rows = [line for line in render_document(document, tmp_path).splitlines() if line.startswith("| `")]
    # "compact" kept samples at APD's precision too: below them at 2 (their gaps are the float32 rows'), at 4
    # not (they equal APD's own); and around their chains' means at 4, where it is below them
    assert rows == ["| `small` | 2,410 | 2 | 1 | 1, 4 | –, 3 | 4 | — | — | –, 4/9 |",
                    "| `large` | 2,410 | 2 | 1 | 2, 4 | 3, 3 | none | — | — | 2/9, 4/9 |",
                    "| `compact` | 2,410 | 2 | 1 | 2, 4 | 3, 3 | 2, 4 | 2 | 4 | 2/9, 4/9 |"]


def test_the_frontiers_of_a_variant_have_a_summary_region_of_their_own(tmp_path):
    """``frontiers-VARIANT`` puts the pipelines' ``frontier-VARIANT.json`` side by side, not their
    ``frontier.json``."""
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    below = {"bald_gap": 1.0, "max_prob_gap": 0.5, "nll_gap": 0.001, "kl": 0.005}
    for name, stem, apd in (("a", "frontier", kept), ("a", "frontier-int8-conditioned-4", below),
                            ("b", "frontier-int8-conditioned-4", kept)):
        point = _point(2, apd, kept, kept)
        point["apd"].update(chains=4, margins={"wins": 7 if apd is below else 0, "compared": 9})
        (tmp_path / "docs" / "results" / name).mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / "results" / name / f"{stem}.json").write_text(json.dumps({"dim": 10, "points": [point]}))
    document = "<!-- results:a,b:frontiers-int8-conditioned-4 -->\nold\n<!-- end -->\n"
    rows = [line for line in render_document(document, tmp_path).splitlines() if line.startswith("| `")]
    assert rows == ["| `a` | 10 | 4 | 1 | 2 | 3 | 2 | — | — | 7/9 |",
                    "| `b` | 10 | 4 | 1 | 2 | 3 | none | — | — | 0/9 |"]


def test_a_frontier_at_another_precision_has_a_region_of_its_own(tmp_path):
    kept = {"bald_gap": 3.0, "max_prob_gap": 2.0, "nll_gap": 0.010, "kl": 0.02}
    point = _point(2, kept, kept, kept, at_precision=(kept, kept))
    results = {"pipeline": "p", "dim": 10, "sgld_samples": 100, "runs": 2, "networks": 5, "ood_sets": ["a"],
               "plan": {"precision": "int4", "subsets": 3}, "points": [point]}
    (tmp_path / "docs" / "results" / "p").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "p" / "frontier-int4.json").write_text(json.dumps(results))
    rendered = render_document("<!-- results:p:frontier-int4 -->\nold\n<!-- end -->\n", tmp_path)
    assert render_table(results).strip() in rendered and "| 2 | kept at int4, random subsets | k=15 |" in rendered


def test_generators_stored_at_another_precision_than_the_codec_are_counted_and_rounded_at_theirs(tiny_pipeline,
                                                                                                 tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[2]", "steps=5", "ceiling=false",
                        "precision=int4", "generators_at=float32")
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    apd = json.loads((out / "frontier-int4-generators-float32.json").read_text())["points"][0]["apd"]
    d = from_dict(TINY).distill
    storage = lambda r: chain_generators_storage(d, r, SPEC, 2, PartPrecisions("int4", "float32"))  # noqa: E731
    assert storage(apd["rank"]) <= 2 < storage(apd["rank"] + 1)
    assert apd["in_sgld_samples"] == pytest.approx(storage(apd["rank"]))
    table = (out / "frontier-int4-generators-float32.md").read_text()
    assert "fit S at int4 (the generator networks at float32)" in table and "at int4 as APD's codec is" in table


def test_a_codec_mean_at_its_own_precision_is_counted_at_it_in_apd_and_in_its_ceiling_as_stored(tiny_pipeline,
                                                                                                tmp_path):
    rc, err = _frontier(tiny_pipeline, tmp_path, "budgets=[2]", "steps=5", "precision=int4", "mean_at=int8")
    assert rc == 0, err
    out = tmp_path / "tiny" / "experiments"
    point = json.loads((out / "frontier-int4-mean-int8.json").read_text())["points"][0]
    apd, as_stored = point["apd"], point["ceiling_codec_at_precision"]
    d = from_dict(TINY).distill
    storage = lambda r: chain_generators_storage(d, r, SPEC, 2, PartPrecisions("int4", mean="int8"))  # noqa: E731
    assert storage(apd["rank"]) <= 2 < storage(apd["rank"] + 1)
    assert apd["in_sgld_samples"] == pytest.approx(storage(apd["rank"]))
    # the mean at int8 costs D int8 codes and their block scales in place of D int4 codes and theirs
    mean_int8_over_int4 = (stored_bytes(SPEC.numel, "int8") - stored_bytes(SPEC.numel, "int4")) / (4 * SPEC.numel)
    assert storage(apd["rank"]) == pytest.approx(chain_generators_storage(d, apd["rank"], SPEC, 2, PartPrecisions(
        "int4")) + mean_int8_over_int4)
    codec = coordinates_storage(apd["rank"], SPEC, 0, "int4") + mean_int8_over_int4  # coordinates at 4 bytes each
    assert (as_stored["codec_at"], as_stored["mean_at"]) == ("int4", "int8")
    assert as_stored["in_sgld_samples"] == pytest.approx(codec + 200 * apd["rank"] / SPEC.numel)
    assert point["kept_at_precision"]["precision"] == "int4"  # the kept samples at the codec's precision
    around = point["kept_around_means"]  # and about their chains' means, kept at the codec's mean's precision
    assert around["precision"] == "int4 around chain means at int8"
    deviations, means = around["k"] * stored_bytes(SPEC.numel, "int4"), 2 * stored_bytes(SPEC.numel, "int8")
    assert around["in_sgld_samples"] == pytest.approx((deviations + means) / (4 * SPEC.numel))
    table = (out / "frontier-int4-mean-int8.md").read_text()
    assert "fit S at int4 (the codec's mean at int8)" in table and "at int4 as APD's basis and scales are" in table
    assert f"| 2 | SGLD coordinates, codec at int4, mean int8 (APD's ceiling as stored) | r={apd['rank']} |" in table
    assert "decoded by the codec read back from int4 (its mean at int8)" in table
