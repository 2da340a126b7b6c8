"""The studies, one :class:`Study` row each: what ``apd experiment NAME`` runs (the command line's choices,
help, the networks it takes and dispatch), what ``apd report --docs`` renders from a study's published
results, and the list of studies the docs show (:func:`apd.docs.render_studies`) all iterate
:data:`STUDIES`. A row names its functions as ``module:function`` and :func:`resolve` imports them only
when they are called, so reading the table imports neither torch nor a study.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apd.errors import ConfigError


@dataclass(frozen=True)
class Study:
    """``apd experiment NAME`` runs ``run(ctx, options) -> results``, which writes
    ``experiments/STEM.{json,md,png}``; ``cnn_ok``: it also runs on a convolutional network (``net.conv``; the
    others build MLPs of their own or use the MLP-only options: unit alignment, Kronecker factors, Laplace).
    ``apd report --docs`` renders the region ``TABLE`` from ``docs/results/PIPELINE/STEM.json`` through
    ``render(results)``; with ``variants``, the region ``TABLE-VARIANT`` from ``STEM-VARIANT.json`` (the
    study run with other options, e.g. the frontier at int4); with ``summary`` (a region name and its
    renderer), that region from several pipelines' results (PIPELINE a comma-separated list), rendered by
    ``function({pipeline: results})``. ``resumes``: a run cut short keeps what it finished, and the same
    command takes it up (the others start over); a study written through
    :func:`~apd.experiments.outputs.run_study` is then handed its parts."""

    name: str
    help: str
    run: str
    stem: str
    render: str
    cnn_ok: bool = False
    table: str = ""  # the docs region, when it is not NAME
    variants: bool = False
    summary: tuple[str, str] | None = None
    resumes: bool = False

    @property
    def region(self) -> str:
        return self.table or self.name


STUDIES = (
    Study("distillers", "dense vs subspace APD vs Gaussians and MoG: storage, time, accuracy, OOD, against SGLD",
          "apd.experiments.distillers:run_distillers", "distillers", "apd.experiments.distillers:render_table",
          resumes=True),
    Study("gan-variants", "WGAN-GP vs WGAN with clipping vs the original GAN on the same store and budget",
          "apd.experiments.gan_variants:run_gan_variants", "gan_variants", "apd.experiments.gan_variants:render_table"),
    Study("storage", "MoG with k components, APD of several ranks and widths and the peers: storage against "
          "quality, and the kept SGLD samples each replaces",
          "apd.experiments.storage:run_storage", "storage", "apd.experiments.storage:render_table",
          table="storage-study", resumes=True),  # "storage" names the storage table of `apd evaluate`
    Study("modes", "single networks at the chains' means, between them and from APD: do the chains sit in separate "
          "modes?", "apd.experiments.modes:run_modes", "modes", "apd.experiments.modes:render_table"),
    Study("precision", "APD and kept samples at float32, float16, int8 and int4 storage, at one storage budget",
          "apd.experiments.precision:run_precision", "precision", "apd.experiments.precision:render_table",
          cnn_ok=True, resumes=True),
    Study("frontier", "APD (one generator per chain, or one told the chain) against as many kept samples, at "
          "several storage budgets",
          "apd.experiments.frontier:run_frontier", "frontier", "apd.experiments.frontier:render_table",
          cnn_ok=True, variants=True, summary=("frontiers", "apd.experiments.frontier:render_summary"), resumes=True),
    Study("active-learning", "active learning with SGLD, APD, MC dropout and a deterministic net: accuracy per label",
          "apd.experiments.active_learning:run_active_learning", "active_learning",
          "apd.experiments.active_report:render_summary", resumes=True),
)
BY_NAME = {study.name: study for study in STUDIES}


def study(name: str) -> Study:
    """The study called ``name``; an unknown name is a :class:`ConfigError` listing the known ones."""
    if name not in BY_NAME:
        raise ConfigError(f"unknown study {name!r} (known: {', '.join(BY_NAME)})")
    return BY_NAME[name]


def resolve(reference: str) -> Callable[..., Any]:
    """The function a ``module:function`` reference names, its module imported now."""
    module, function = reference.split(":")
    return getattr(importlib.import_module(module), function)
