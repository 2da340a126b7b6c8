"""The method table at the bottom layer (:mod:`apd.methods`) and the registries above that read it."""

from __future__ import annotations

from apd.methods import ADVERSARIAL_SOURCES, ALL_METHODS, METHODS_TABLE, MLP_ONLY_METHODS, MethodName, colour, label
from apd.pipeline.methods import METHODS


def test_every_name_has_one_row_and_one_loader_in_the_same_order():
    assert list(METHODS_TABLE) == list(MethodName) == list(METHODS)
    assert all(name == row.name for name, row in METHODS_TABLE.items())


def test_the_derived_lists_are_the_ones_configs_were_checked_against():
    assert ALL_METHODS == ("sgd", "mcdropout", "sgld", "apd", "mog", "modes", "kept", "stein", "swag", "ensemble",
                           "laplace-kfac", "laplace-ll", "laplace-glm")
    assert set(ADVERSARIAL_SOURCES) == set(ALL_METHODS) - {"laplace-glm"}  # with weights: not the GLM predictive
    assert MLP_ONLY_METHODS == ("modes", "laplace-kfac", "laplace-ll", "laplace-glm")
    assert all(type(name) is str for name in ALL_METHODS)  # plain strings in configs, so their hashes stay


def test_labels_and_colours():
    assert [label(name) for name in ALL_METHODS] == [
        "SGD", "MC dropout", "SGLD", "APD", "MoG", "mode mixture", "kept SGLD", "Stein-thinned SGLD", "SWAG",
        "deep ensemble", "Laplace KFAC", "Laplace last layer", "Laplace KFAC, GLM"]
    assert label("deterministic") == "deterministic"
    assert len({colour(name) for name in ALL_METHODS}) == len(ALL_METHODS)
    assert colour("deterministic") == "grey"
