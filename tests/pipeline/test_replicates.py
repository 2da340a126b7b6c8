"""Generator seeds across: sample std (ddof 1), wins counted per seed, and the words and marks the reports give."""

from __future__ import annotations

import numpy as np
import pytest

from apd.evaluation.yardstick import GAP_KEYS
from apd.pipeline.replicate_tables import verdict
from apd.pipeline.replicates import across_seeds
from apd.pipeline.seeds import replicated
from apd.pipeline.table_format import win_mark

# per seed: (worst BALD gap's percentile, its win), KL's, and the set-by-set wins of the BALD comparison on one set
SEEDS = [((97.0, True), (96.0, True), True), ((99.0, True), (40.0, False), True), ((95.5, True), (98.0, True), False)]


def _seed(k: int) -> dict:
    (bald_rank, bald_win), (kl_rank, kl_win), set_win = SEEDS[k]
    standings = {key: {"percentile": 10.0, "beats": False} for key in GAP_KEYS}
    standings["bald_gap"] = {"percentile": bald_rank, "beats": bald_win}
    standings["kl"] = {"percentile": kl_rank, "beats": kl_win}
    by_set = {"auroc": {"bald": {"photos": {"beats": set_win}, "noise": {"beats": False}},
                        "max_prob": {"photos": None}},
              "nll": {"beats": False}, "wins": int(set_win), "compared": 3}
    return {"acc": 0.9 + k / 100, "nll": 0.2, "mean_bald_auroc": 90.0 + k, **{key: 1.0 + k for key in GAP_KEYS},
            "against": {"25": {"standings": standings, "set_by_set": by_set}}}


def test_across_seeds_keeps_sample_std_and_counts_the_seeds_that_win():
    found = across_seeds([_seed(k) for k in range(3)])
    assert found["values"]["acc"]["std"] == pytest.approx(np.std([0.90, 0.91, 0.92], ddof=1))
    assert found["values"]["kl"]["values"] == [1.0, 2.0, 3.0]
    against = found["against"]["25"]
    assert against["percentile"]["kl"]["mean"] == pytest.approx(78.0)
    assert against["percentile"]["kl"]["std"] == pytest.approx(np.std([96.0, 40.0, 98.0], ddof=1))
    assert against["beats"]["bald_gap"] == 3 and against["beats"]["kl"] == 2 and against["beats"]["nll_gap"] == 0
    assert against["set_by_set"]["auroc"]["bald"] == {"photos": 2, "noise": 0}
    assert against["set_by_set"]["auroc"]["max_prob"] == {"photos": None}  # a score one network cannot have
    assert against["wins"] == [1, 1, 0] and against["wins_every_seed"] == 0 and against["compared"] == 3


def test_a_win_is_the_distillers_only_where_every_seed_wins():
    entry = {"seeds": 3, **across_seeds([_seed(k) for k in range(3)])}
    words = verdict("apd", entry, "25", 24.11, 200)
    assert words.startswith("Across its 3 generator seeds, APD (24.1 SGLD samples' worth) wins against its kept "
                            "samples \"25\" on worst BALD gap for every seed, and on KL (2 of 3) for some.")
    assert "worst BALD gap 97.2 ± 1.8" in words
    assert "0 of the 3 comparisons are won by every seed (each seed's wins: 1, 1, 0)" in words
    entry["against"]["25"]["beats"]["bald_gap"] = 2  # now no gap is won by every seed
    assert "wins against its kept samples \"25\" on no summary for every seed; for some, on worst BALD gap (2 of 3) " \
        "and KL (2 of 3)." in verdict("apd", entry, "25", 24.11, 200)
    assert [win_mark(True, n, 3) for n in (3, 2, 0)] == [" ✓", " (2 of 3)", ""]
    assert [win_mark(beats) for beats in (True, False)] == [" ✓", ""]  # one generator: its own win


def test_seed_streams_depend_on_the_seed_alone():
    assert replicated(0, "distill", "gan") == ("distill", "gan")  # seed 0: the pipeline's one generator
    assert replicated(2, "distill", "gan", "chain", 1) == ("distill", "seed", 2, "gan", "chain", 1)
    assert replicated(1, "evaluate", "draws", "apd") != replicated(2, "evaluate", "draws", "apd")
