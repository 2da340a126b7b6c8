"""The registry of methods ``apd evaluate`` compares: for each, its label, how many members a run draws,
the artifact it comes from (made by which stage), and how to load it as a :class:`~apd.posteriors.Posterior`.

A new method is one entry here plus its posterior class; evaluation, attacks, reports and the storage
tables pick it up from the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from apd.config import EvaluateConfig
from apd.distillation.generator import load_generator
from apd.distillation.training import evenly_spaced
from apd.errors import ArtifactError, ConfigError
from apd.io import load_torch, read_json
from apd.nets import ParamSpec, mlp
from apd.pipeline.layout import Layout, manifest_of
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import require_input
from apd.posteriors import APDGenerator, GaussianMixture, MCDropout, PointEstimate, Posterior, SGLDSamples
from apd.samplers.store import SampleStore


@dataclass
class Sources:
    """What loaders share within one evaluation: the run, the open sample store, the network's spec."""

    ctx: RunContext
    stack: ExitStack
    spec: ParamSpec
    _store: SampleStore | None = field(default=None, repr=False)

    @property
    def store(self) -> SampleStore:
        if self._store is None:
            self._store = self.stack.enter_context(SampleStore.open(self.ctx.layout.samples, expect_spec=self.spec))
        return self._store


@dataclass(frozen=True)
class Method:
    """One row of the registry (module docstring)."""

    name: str
    label: str
    members: Callable[[EvaluateConfig], int]
    artifact: Callable[[Layout], Path]
    stage: str  # the stage whose manifest marks ``artifact`` complete
    load: Callable[[Sources], Posterior]


def _baseline(sources: Sources, name: str, dropout: float) -> torch.nn.Module:
    ctx = sources.ctx
    net = mlp(ctx.net_sizes, dropout=dropout)
    path = ctx.layout.baseline(name)
    try:
        net.load_state_dict(load_torch(path))
    except RuntimeError:
        raise ArtifactError(f"{path}: does not fit the {ctx.net_sizes} network; run `apd sample --force`") from None
    return net.to(ctx.device).eval()


def _load_sgd(sources: Sources) -> Posterior:
    return PointEstimate(_baseline(sources, "sgd", 0.0))


def _load_mcdropout(sources: Sources) -> Posterior:
    p = sources.ctx.cfg.baselines.dropout
    return MCDropout(_baseline(sources, "mcdropout", p), p)


def _load_sgld(sources: Sources) -> Posterior:
    return SGLDSamples(sources.store, sources.ctx.device)


def _load_apd(sources: Sources) -> Posterior:
    layout = sources.ctx.layout
    model, spec = load_generator(layout.generator, read_json(manifest_of(layout.generator)), sources.spec,
                                 sources.ctx.device)
    return APDGenerator(model, spec)


def fit_mixture(store: SampleStore, components: int, fit_samples: int, seed: int,
                device: torch.device) -> GaussianMixture:
    """MoG with ``components`` diagonal components fit to ``fit_samples`` samples spaced evenly over the
    whole store (every chain)."""
    rows = evenly_spaced(len(store), fit_samples)
    if components > len(rows):
        raise ArtifactError(f"a {components}-component mixture needs at least as many samples, the store has "
                            f"{len(store)}")
    return GaussianMixture(store.read(rows), components, store.spec, seed=seed, device=device)


def _load_mog(sources: Sources) -> Posterior:
    ctx, e = sources.ctx, sources.ctx.cfg.evaluate
    k = max(e.mog_components)
    return fit_mixture(sources.store, k, e.mog_fit_samples, ctx.seed("evaluate", "mog", k), ctx.device)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("sgd", "SGD", lambda e: 1, lambda layout: layout.baseline("sgd"), "baselines", _load_sgd),
    Method("mcdropout", "MC dropout", lambda e: e.mc_passes, lambda layout: layout.baseline("mcdropout"),
           "baselines", _load_mcdropout),
    Method("sgld", "SGLD", lambda e: e.sgld_samples, lambda layout: layout.samples, "sample", _load_sgld),
    Method("apd", "APD", lambda e: e.networks, lambda layout: layout.generator, "distill", _load_apd),
    Method("mog", "MoG", lambda e: e.networks, lambda layout: layout.samples, "sample", _load_mog),
)}


def label(name: str) -> str:
    """A method's label in tables and figures (its name when it is not registered)."""
    return METHODS[name].label if name in METHODS else name


def check_methods(names: list[str], where: str) -> None:
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise ConfigError(f"{where}: 'evaluate.methods' has unknown method {unknown[0]!r} "
                          f"(choose from {', '.join(METHODS)})")
    if "sgld" not in names:
        raise ConfigError(f"{where}: 'evaluate.methods' must include 'sgld', the reference every method is "
                          "compared with")


def load_methods(ctx: RunContext, stack: ExitStack) -> tuple[dict[str, Posterior], dict[str, str]]:
    """Every configured method as a Posterior, and the manifest digests of the artifacts they come from
    (checked for provenance first: made under this config, unchanged since)."""
    names = ctx.cfg.evaluate.methods
    check_methods(names, ctx.cfg.source)
    inputs = {}
    for name in names:
        method = METHODS[name]
        inputs[name] = require_input(ctx, method.artifact(ctx.layout), method.stage)
    sources = Sources(ctx, stack, ParamSpec.from_module(mlp(ctx.net_sizes)))
    if len(sources.store) < ctx.cfg.evaluate.sgld_samples:
        raise ArtifactError(f"{ctx.layout.samples}: {len(sources.store)} samples, evaluation draws "
                            f"{ctx.cfg.evaluate.sgld_samples}; lower evaluate.sgld_samples or sample more")
    return {name: METHODS[name].load(sources) for name in names}, inputs
