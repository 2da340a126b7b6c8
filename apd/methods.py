"""The methods ``apd evaluate`` compares, named once: :class:`MethodName` (their names) and
:data:`METHODS_TABLE` (one :class:`Method` row each: what it is defined for, whether it can be attacked or
loaded by :func:`apd.load`, and how tables and figures show it).

This module is on the ground: configuration checks, the pipeline's loaders
(:mod:`apd.pipeline.methods`), the reports and the experiments all read it, and it imports nothing of the
package. A new method is a name and a row here, then its loader in :mod:`apd.pipeline.methods`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MethodName(StrEnum):
    """A method's name, as ``evaluate.methods``, the evaluation's results and the artifacts spell it."""

    SGD = "sgd"
    MCDROPOUT = "mcdropout"
    SGLD = "sgld"
    APD = "apd"
    MOG = "mog"
    MODES = "modes"
    KEPT = "kept"
    STEIN = "stein"
    SWAG = "swag"
    ENSEMBLE = "ensemble"
    LAPLACE_KFAC = "laplace-kfac"
    LAPLACE_LL = "laplace-ll"
    LAPLACE_GLM = "laplace-glm"


@dataclass(frozen=True)
class Method:
    """One method's row: ``mlp_only`` (defined on an MLP's hidden units only, so a network with
    ``net.conv`` cannot use it), ``attackable`` (it has weights, so an adversarial attack can be crafted on
    it: an ``evaluate.adversarial.sources`` entry), ``loadable`` (:func:`apd.load` rebuilds it from a
    pipeline's artifacts), ``label`` (its name in tables and figures) and ``colour`` (its matplotlib colour
    in figures)."""

    name: MethodName
    label: str
    colour: str
    mlp_only: bool = False
    attackable: bool = True
    loadable: bool = True


# In the order tables list methods. The colours of the methods other than SGLD follow matplotlib's cycle in
# that order, as the figures drew them before each method had its own.
METHODS_TABLE: dict[MethodName, Method] = {m.name: m for m in (
    Method(MethodName.SGD, "SGD", "C0"),
    Method(MethodName.MCDROPOUT, "MC dropout", "C1"),
    Method(MethodName.SGLD, "SGLD", "black"),
    Method(MethodName.APD, "APD", "C2"),
    Method(MethodName.MOG, "MoG", "C3"),
    Method(MethodName.MODES, "mode mixture", "C4", mlp_only=True),
    Method(MethodName.KEPT, "kept SGLD", "C5"),
    Method(MethodName.STEIN, "Stein-thinned SGLD", "C6"),
    Method(MethodName.SWAG, "SWAG", "C7"),
    Method(MethodName.ENSEMBLE, "deep ensemble", "C8"),
    Method(MethodName.LAPLACE_KFAC, "Laplace KFAC", "C9", mlp_only=True),
    Method(MethodName.LAPLACE_LL, "Laplace last layer", "navy", mlp_only=True),
    # a predictive only (the linearised network), no weights to attack
    Method(MethodName.LAPLACE_GLM, "Laplace KFAC, GLM", "gold", mlp_only=True, attackable=False),
)}

# Every method, the default list of `[evaluate] methods`.
ALL_METHODS: tuple[str, ...] = tuple(name.value for name in METHODS_TABLE)
SCORE_NAMES = ("entropy", "variation_ratio", "max_prob", "bald", "model_variance")  # apd.uncertainty's scores
ADVERSARIAL_SOURCES: tuple[str, ...] = tuple(m.name.value for m in METHODS_TABLE.values() if m.attackable)
MLP_ONLY_METHODS: tuple[str, ...] = tuple(m.name.value for m in METHODS_TABLE.values() if m.mlp_only)
LOADABLE: tuple[str, ...] = tuple(m.name.value for m in METHODS_TABLE.values() if m.loadable)


def label(name: str) -> str:
    """A method's label in tables and figures (``name`` itself when it is not a method)."""
    return METHODS_TABLE[name].label if name in METHODS_TABLE else name


def colour(name: str) -> str:
    """A method's colour in figures (matplotlib's grey when it is not a method)."""
    return METHODS_TABLE[name].colour if name in METHODS_TABLE else "grey"
