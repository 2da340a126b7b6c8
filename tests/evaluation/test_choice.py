"""The rule a distiller is chosen by (apd.evaluation.choice) on hand-made criteria."""

from __future__ import annotations

import pytest

from apd.evaluation.choice import Candidate, choice_markdown, choose, run_criterion


def test_a_runs_criterion_is_the_sum_of_the_four_function_space_gaps():
    summary = {"kl": 0.1, "kl_ood": 0.2, "input_bald_gap": 0.03, "input_bald_gap_ood": 0.04, "bald_gap": 9.0}
    assert run_criterion(summary) == pytest.approx(0.37)
    with pytest.raises(ValueError, match="kl_ood is undefined"):
        run_criterion({**summary, "kl_ood": None})


def test_candidates_within_one_std_of_the_lowest_tie_and_the_least_storage_wins():
    """The lowest mean is 1.0 with std 0.1, so 1.05 ties with it and 1.2 does not; of the tied, the smaller
    store wins."""
    lowest = Candidate("big", 24.0, (0.9, 1.1))
    close = Candidate("small", 20.0, (1.05, 1.05))
    far = Candidate("smallest", 2.0, (1.2, 1.2))
    found = choose([lowest, close, far])
    assert (found["lowest"], found["tied"], found["chosen"]) == ("big", ["big", "small"], "small")
    assert found["threshold"] == pytest.approx(1.1)


def test_the_first_listed_wins_a_tie_in_storage_and_the_budget_leaves_larger_stores_out():
    a, b = Candidate("a", 5.0, (1.0, 1.0)), Candidate("b", 5.0, (1.0, 1.0))
    assert choose([a, b])["chosen"] == "a" and choose([b, a])["chosen"] == "b"
    over = Candidate("over", 30.0, (0.1, 0.1))
    assert choose([over, a], budget=25)["chosen"] == "a"
    with pytest.raises(ValueError, match="budget of 25"):
        choose([over], budget=25)


def test_a_choice_renders_its_candidates_and_the_rule_applied_to_them():
    candidates = [Candidate("shared", 3.79, (1.0, 1.2)), Candidate("embedding-4", 3.80, (0.5, 0.7))]
    rows = [{"name": c.name, "storage": c.storage, "criterion": c.mean, "criterion_std": c.std, "bald_gap": 2.0}
            for c in candidates]
    record = {"budget": 4.0, "runs": 2, "networks": 100, "ood": ["gaussian", "photos"], "recorded": ["bald_gap"],
              "rows": rows, **choose(candidates, 4.0)}
    markdown = choice_markdown(record)
    assert markdown.startswith("2 candidates (budget 4 samples' worth), 2 runs × 100 networks, judged on "
                               "validation images and the OOD tuning pool (gaussian, photos)")
    assert "| embedding-4 | 3.80 | 0.6000 ± 0.1000 | 2.0000 |" in markdown
    assert markdown.endswith("lowest: embedding-4; tied (within 0.7000): embedding-4; chosen: embedding-4")
    assert "not a candidate" not in markdown
    record["ceiling"] = {**rows[0], "name": "ceiling, int8", "criterion": 0.1,  # judged alike, never chosen
                         "storage_precision": "int8"}
    markdown = choice_markdown(record)
    assert "| ceiling, int8 (not a candidate) | 3.79 | 0.1000 ± 0.1000 | 2.0000 |" in markdown
    assert markdown.endswith("chosen: embedding-4")
    del record["ceiling"]["storage_precision"]  # a record from before the ceiling was counted at its precision
    assert "| ceiling, int8 (not a candidate; storage counted at float32) | 3.79 |" in choice_markdown(record)
