"""``results.json`` through its typed accessors: each value over runs a Stat, None where a method cannot have it,
and a value of another shape an error as it is read."""

from __future__ import annotations

import pytest

from apd.metrics import Stat
from apd.pipeline.results import accuracy, detection, kept_keys, mean_auroc, set_aurocs
from tests.report_helpers import full_results


def test_accuracy_and_detection_are_stats_over_runs():
    results = full_results()
    assert accuracy(results, "sgld", "nll") == Stat(0.1, 0.01)
    assert accuracy(results, "sgld", "bogus") is None and accuracy({}, "sgld") is None
    found = detection(results, "gaussian", "bald", "apd")
    assert found["auroc"] == Stat(97.83, 0.31) and found["fpr95"] == Stat(0.05, 0.01)
    assert detection(results, "gaussian", "bald", "sgd") is None  # one network has no BALD


def test_aurocs_per_set_and_their_mean_over_the_sets_that_have_one():
    results = full_results()
    assert set_aurocs(results, "apd", "bald") == {"gaussian": 97.83, "uniform": 90.01}
    assert mean_auroc(results, "apd", "bald") == pytest.approx((97.83 + 90.01) / 2)
    assert set_aurocs(results, "sgd", "bald") == {"gaussian": None, "uniform": None}
    assert mean_auroc(results, "sgd", "bald") is None
    results["ood"]["uniform"]["bald"]["apd"] = None
    assert mean_auroc(results, "apd", "bald") == 97.83
    assert mean_auroc(results, "apd", "bald", every_set=True) is None


def test_a_plain_number_where_a_mean_over_runs_belongs_is_an_error():
    with pytest.raises(TypeError, match="not a mean and std over runs"):
        accuracy({"accuracy": {"sgld": {"acc": 0.9}}}, "sgld")


def test_kept_keys_names_every_set_an_equal_storage_entry_holds_in_order():
    plain = {"in_sgld_samples": 3.95, "k": 4}
    assert kept_keys(plain) == ["4"]
    rounded = {**plain, "at_precision": {"precision": "int4", "k": 29, "key": "29 int4"}}
    assert kept_keys(rounded) == ["4", "29 int4"]
    around = {**rounded, "around_means": {"precision": "int4", "mean_at": "int8", "k": 25,
                                          "key": "25 int4 around chain means at int8"}}
    assert kept_keys(around) == ["4", "29 int4", "25 int4 around chain means at int8"]
