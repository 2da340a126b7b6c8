"""How ``apd evaluate`` gets each method (:mod:`apd.methods` names them and says how they are shown): how
many members a run draws, the artifact it comes from (made by which stage), and how to load it as a
:class:`~apd.posteriors.Posterior`.

A new method is its row in :data:`apd.methods.METHODS_TABLE`, one entry here and its posterior class;
evaluation, attacks, reports and the storage tables pick it up from the two.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from apd.config import EvaluateConfig
from apd.distillation.alignment import permute
from apd.distillation.generator import load_generator
from apd.distillation.training import evenly_spaced
from apd.errors import ArtifactError, ConfigError
from apd.io import load_torch, read_json
from apd.methods import MethodName
from apd.nets import ParamSpec
from apd.pipeline.layout import Layout, manifest_of
from apd.pipeline.recipes import (
    REFERENCE_SAMPLES,
    aligned_chain_means,
    laplace_terms,
    store_alignment,
    validation_monitor,
)
from apd.pipeline.runtime import RunContext, stopwatch
from apd.pipeline.stage import require_input
from apd.posteriors import (
    APDGenerator,
    DeepEnsemble,
    GaussianMixture,
    KeptSamples,
    MCDropout,
    PointEstimate,
    Posterior,
    SGLDSamples,
    SWAGPosterior,
)
from apd.posteriors.kept import evenly_spaced_rows
from apd.posteriors.laplace import LaplaceGLM, LaplacePosterior, fit_kfac, fit_last_layer
from apd.posteriors.mixture import MAX_EM_ITERATIONS
from apd.posteriors.modes import ModeMixture, chain_means, prefer_aligned
from apd.posteriors.stein import stein_rows
from apd.samplers.burn_in import retained_rows, trace_burn_in
from apd.samplers.store import SampleStore, StoreRows

log = logging.getLogger(__name__)


@dataclass
class Sources:
    """What loaders share within one evaluation: the run, the open sample store, the network's spec."""

    ctx: RunContext
    stack: ExitStack
    spec: ParamSpec
    _store: SampleStore | None = field(default=None, repr=False)
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # what two loaders share (APD, Laplace fits)
    details: dict[str, dict] = field(default_factory=dict)  # per method: what fitting it chose, for results.json

    @property
    def store(self) -> SampleStore:
        if self._store is None:
            self._store = self.stack.enter_context(SampleStore.open(self.ctx.layout.samples, expect_spec=self.spec))
        return self._store

    @property
    def sgld_store(self) -> SampleStore | StoreRows:
        """The store as SGLD's reference and its kept samples read it (:func:`sgld_samples`)."""
        return self.shared("sgld_store", lambda: sgld_samples(self.ctx, self.store))

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def sgld_samples(ctx: RunContext, store: SampleStore) -> SampleStore | StoreRows:
    """The samples SGLD's reference (the ``sgld`` method, the yardstick's predictive) and the kept samples
    (``kept``, the yardstick's rows) are read from: the whole store, or with ``evaluate.burn_in_from_trace``
    its rows after the burn-in the log-likelihood trace gives (:func:`apd.samplers.burn_in.trace_burn_in`)."""
    if not ctx.cfg.evaluate.burn_in_from_trace:
        return store
    found = trace_burn_in(store.log_liks, store.chains)
    log.info("burn-in from the trace: the first %d samples of each chain dropped (split R-hat of the "
             "log-likelihood %.3f%s)", found["burn_in"], found["rhat"], "" if found["reached"] else ", above 1.05")
    return StoreRows(store, retained_rows(store.chains, found["burn_in"]))


@dataclass(frozen=True)
class MethodLoader:
    """One method's loader (module docstring)."""

    name: MethodName
    members: Callable[[EvaluateConfig], int]
    artifact: Callable[[Layout], Path]
    stage: str  # the stage whose manifest marks ``artifact`` complete
    load: Callable[[Sources], Posterior]


def _not_for(path: Path, what: str, spec: ParamSpec) -> ArtifactError:
    """A baseline file that is not for the pipeline's network: made again by ``apd sample --force``."""
    return ArtifactError(f"{path}: {what} the {spec.describe()} network; run `apd sample --force`")


def _baseline(sources: Sources, name: str, dropout: float) -> torch.nn.Module:
    ctx = sources.ctx
    net = ctx.network(dropout)
    path = ctx.layout.baseline(name)
    try:
        net.load_state_dict(load_torch(path))
    except RuntimeError:
        raise _not_for(path, "does not fit", sources.spec) from None
    return net.to(ctx.device).eval()


def _load_sgd(sources: Sources) -> Posterior:
    return PointEstimate(_baseline(sources, "sgd", 0.0))


def _load_mcdropout(sources: Sources) -> Posterior:
    p = sources.ctx.cfg.baselines.dropout
    return MCDropout(_baseline(sources, "mcdropout", p), p)


def _load_sgld(sources: Sources) -> Posterior:
    return SGLDSamples(sources.sgld_store, sources.ctx.device)


def apd_generator(ctx: RunContext, spec: ParamSpec, seed: int = 0) -> APDGenerator:
    """Generator seed ``seed``'s kept generator (``[distill] seeds``; 0: the pipeline's ``generator.pt``) as a
    posterior; a manifest that records another seed is an :class:`ArtifactError`."""
    path = ctx.layout.generator_of(seed)
    record = read_json(manifest_of(path))
    if record.get("generator_seed", 0) != seed:
        raise ArtifactError(f"{path}: its manifest records generator seed {record.get('generator_seed', 0)}, not "
                            f"{seed}; run `apd distill --config {ctx.cfg.source} --force`")
    model, spec = load_generator(path, record, spec, ctx.device)
    return APDGenerator(model, spec)


def _load_apd(sources: Sources) -> Posterior:
    return sources.shared("apd", lambda: apd_generator(sources.ctx, sources.spec))


def equal_storage(sources: Sources) -> int:
    """⌈S⌉, S = APD's storage in SGLD samples (at most the store's size): how many samples the kept-samples
    methods keep."""
    return min(math.ceil(_load_apd(sources).storage_in_samples() - 1e-9), len(sources.store))


def _load_kept(sources: Sources) -> Posterior:
    store, k = sources.sgld_store, equal_storage(sources)
    rows = evenly_spaced_rows(len(store), k, store.chains)
    sources.details["kept"] = {"k": k, "rule": "centred in equal parts of each chain, the same number from each"}
    return KeptSamples.from_store(store, rows, sources.ctx.device, name="kept")


def _load_stein(sources: Sources) -> Posterior:
    """⌈S⌉ samples chosen by Stein thinning among candidates spread over the samples SGLD's reference and the
    kept samples are read from (:func:`sgld_samples`: with ``evaluate.burn_in_from_trace``, those after the
    trace's burn-in), so that no compared method keeps a sample the others drop as burn-in. The ensemble reads
    them as rows of the store itself, as the rows the details record are."""
    ctx, pool, k = sources.ctx, sources.sgld_store, equal_storage(sources)
    candidates = min(ctx.cfg.evaluate.stein_candidates, len(pool))
    started = time.perf_counter()
    picks = stein_rows(pool, k, ctx.data.x_train, ctx.data.y_train, ctx.cfg.sgld.prior_var, candidates=candidates,
                       temperature=ctx.cfg.sgld.temperature, device=ctx.device)
    rows = pool.rows[picks] if isinstance(pool, StoreRows) else picks
    seconds = time.perf_counter() - started
    sources.details["stein"] = {"k": k, "candidates": candidates, "seconds": round(seconds, 2),
                                "rows": rows.tolist()}
    log.info("Stein thinning: %d of %d candidate samples (full-training-set gradients) in %.1f s", k, candidates,
             seconds)
    return KeptSamples.from_store(sources.store, rows, ctx.device, name="stein")


def _load_swag(sources: Sources) -> Posterior:
    ctx = sources.ctx
    path = ctx.layout.baseline("swag")
    moments = load_torch(path)
    try:
        post = SWAGPosterior(sources.spec, moments["mean"], moments["variance"], moments["deviations"],
                             scale=ctx.cfg.peers.swag_scale, device=ctx.device)
    except (KeyError, ValueError):
        raise _not_for(path, "not SWAG moments of", sources.spec) from None
    record = read_json(manifest_of(path))
    sources.details["swag"] = {"lr": record.get("lr"), "val_nll": record.get("val_nll"), "rank": post.rank,
                               "scale": post.scale}
    return post


def _load_ensemble(sources: Sources) -> Posterior:
    ctx = sources.ctx
    path = ctx.layout.baseline("ensemble")
    members = load_torch(path).get("members")
    if not isinstance(members, torch.Tensor) or members.dim() != 2 or members.shape[1] != sources.spec.numel:
        raise _not_for(path, "not an ensemble of", sources.spec)
    return DeepEnsemble(members, sources.spec, ctx.device)


def _laplace(sources: Sources, structure: str) -> LaplacePosterior:
    """The Laplace approximation ``kfac`` or ``last-layer`` of the SGD network, fit once per evaluation:
    prior precisions by marginal likelihood on the training split, scales on the validation split."""

    def make() -> LaplacePosterior:
        ctx = sources.ctx
        data = ctx.data
        fit = fit_kfac if structure == "kfac" else fit_last_layer
        generator = torch.Generator(device=ctx.device).manual_seed(ctx.seed("evaluate", "laplace", structure))
        try:
            post = fit(_baseline(sources, "sgd", 0.0), data.x_train, data.y_train, data.x_val, data.y_val,
                       nll_tolerance=ctx.cfg.evaluate.laplace_nll_tolerance, generator=generator,
                       name=f"laplace-{'kfac' if structure == 'kfac' else 'll'}")
        except ImportError as exc:
            raise ConfigError(f"{ctx.cfg.source}: {exc}; or leave the laplace-* methods out of "
                              "'evaluate.methods'") from None
        info = post.info
        log.info("Laplace %s: prior precisions %s by marginal likelihood; scale %g (GLM %g) by validation NLL "
                 "(%.1f s)", structure, ", ".join(f"{p:.3g}" for p in info.prior_precision), post.scale,
                 post.glm_scale, info.fit_seconds + info.tune_seconds)
        return post

    return sources.shared(f"laplace-{structure}", make)


def _laplace_details(post: LaplacePosterior, tolerance: float, glm: bool = False) -> dict:
    info = post.info
    values = info.glm_val_nll if glm else info.val_nll
    return {"prior_groups": info.prior_groups, "prior_precision": info.prior_precision,
            "log_marglik": info.log_marglik, "scales": info.scales, "val_nll": values,
            "scale": post.glm_scale if glm else post.scale,
            "lowest_val_nll_scale": info.scales[min(range(len(values)), key=values.__getitem__)],
            "nll_tolerance": tolerance, "fit_seconds": round(info.fit_seconds + info.tune_seconds, 2)}


def _load_laplace_kfac(sources: Sources) -> Posterior:
    post = _laplace(sources, "kfac")
    sources.details["laplace-kfac"] = _laplace_details(post, sources.ctx.cfg.evaluate.laplace_nll_tolerance)
    return post


def _load_laplace_ll(sources: Sources) -> Posterior:
    post = _laplace(sources, "last-layer")
    sources.details["laplace-ll"] = _laplace_details(post, sources.ctx.cfg.evaluate.laplace_nll_tolerance)
    return post


def _load_laplace_glm(sources: Sources) -> Posterior:
    post = _laplace(sources, "kfac")
    sources.details["laplace-glm"] = _laplace_details(post, sources.ctx.cfg.evaluate.laplace_nll_tolerance, glm=True)
    return LaplaceGLM(post)


def fit_mixture(store: SampleStore, components: int, fit_samples: int, seed: int, device: torch.device,
                perms: torch.Tensor | None) -> GaussianMixture:
    """MoG with ``components`` diagonal components fit to ``fit_samples`` samples spaced evenly over the
    whole store (every chain), each permuted by its row of ``perms`` [len(store), H] first: the alignment APD's
    generator is trained on (:func:`~apd.pipeline.recipes.store_alignment`; None: as stored), so that the
    mixture is fit to the same samples, not to permuted copies of the modes."""
    rows = evenly_spaced(len(store), fit_samples)
    if components > len(rows):
        raise ArtifactError(f"a {components}-component mixture needs at least as many samples, the store has "
                            f"{len(store)}")
    # EM prints nothing while it runs, and on fcNN2 it runs for minutes: say what is being fitted
    log.info("MoG: fitting %d diagonal components to %d %s samples of %d weights (EM, at most %d iterations)",
             components, len(rows), "unaligned" if perms is None else "aligned", store.spec.numel, MAX_EM_ITERATIONS)
    samples = store.read(rows)
    if perms is not None:
        samples = permute(samples, store.spec, perms[rows])
    return GaussianMixture(samples, components, store.spec, seed=seed, device=device)


def _load_modes(sources: Sources) -> Posterior:
    """The chains' modes with Kronecker spreads (:mod:`apd.posteriors.modes`): each chain's mean as stored or
    over its samples aligned as ``apd distill`` aligns them (``[distill] align``), whichever network has the
    lower validation NLL; α matched on validation inputs to the disagreement of SGLD's evenly spaced
    reference samples, as APD's residual is."""
    ctx, store, align = sources.ctx, sources.store, sources.ctx.cfg.distill.align
    terms, rank = laplace_terms(ctx, "evaluate", "modes", "fisher"), ctx.cfg.distill.residual.kronecker_rank
    log.info("mode mixture: one mean per chain and a Kronecker spread at each (%d input directions per layer)", rank)
    means, shares = chain_means(store)
    chosen: dict[str, Any] = {"align": align}
    aligned = aligned_chain_means(ctx, store)
    if aligned is not None:
        use, losses = prefer_aligned(means, aligned, sources.spec, ctx.data.x_val.to(ctx.device),
                                     ctx.data.y_val.to(ctx.device))
        means = torch.where(use[:, None], aligned, means)
        chosen |= {"aligned": use.tolist(), "val_nll": {k: [round(v, 4) for v in vs] for k, vs in losses.items()}}
    mixture = ModeMixture.fit(means, shares, sources.spec, ctx.net_sizes, rank, terms.x_fisher, terms.data_size,
                              terms.prior_precision,
                              torch.Generator().manual_seed(ctx.seed("evaluate", "modes", "labels")), ctx.device)
    monitor = validation_monitor(ctx, sources.spec, store.read(evenly_spaced(len(store), REFERENCE_SAMPLES)))
    alpha = mixture.match_disagreement(monitor.x, monitor.reference.mean_information, monitor.networks, monitor.rng)
    sources.details["modes"] = {"modes": len(mixture.means), "shares": [round(float(w), 4) for w in mixture.weights],
                                "kronecker_rank": rank, "scale": round(alpha, 4), **chosen,
                                "scale_rule": "mean mutual information on validation inputs equal to SGLD's"}
    return mixture


def _load_mog(sources: Sources) -> Posterior:
    ctx, e = sources.ctx, sources.ctx.cfg.evaluate
    k = max(e.mog_components)
    return fit_mixture(sources.store, k, e.mog_fit_samples, ctx.seed("evaluate", "mog", k), ctx.device,
                       store_alignment(ctx, sources.store))


METHODS: dict[MethodName, MethodLoader] = {m.name: m for m in (
    MethodLoader(MethodName.SGD, lambda e: 1, lambda layout: layout.baseline("sgd"), "baselines", _load_sgd),
    MethodLoader(MethodName.MCDROPOUT, lambda e: e.mc_passes, lambda layout: layout.baseline("mcdropout"),
                 "baselines", _load_mcdropout),
    MethodLoader(MethodName.SGLD, lambda e: e.sgld_samples, lambda layout: layout.samples, "sample", _load_sgld),
    MethodLoader(MethodName.APD, lambda e: e.networks, lambda layout: layout.generator, "distill", _load_apd),
    MethodLoader(MethodName.MOG, lambda e: e.networks, lambda layout: layout.samples, "sample", _load_mog),
    MethodLoader(MethodName.MODES, lambda e: e.networks, lambda layout: layout.samples, "sample", _load_modes),
    # ⌈S⌉ SGLD samples, S = APD's storage: the generator fixes how many (the store is SGLD's input)
    MethodLoader(MethodName.KEPT, lambda e: e.networks, lambda layout: layout.generator, "distill", _load_kept),
    MethodLoader(MethodName.STEIN, lambda e: e.networks, lambda layout: layout.generator, "distill", _load_stein),
    MethodLoader(MethodName.SWAG, lambda e: e.networks, lambda layout: layout.baseline("swag"), "peers",
                 _load_swag),
    MethodLoader(MethodName.ENSEMBLE, lambda e: e.networks, lambda layout: layout.baseline("ensemble"), "peers",
                 _load_ensemble),
    # Laplace approximations of the SGD network, fit by the evaluation itself (seconds)
    MethodLoader(MethodName.LAPLACE_KFAC, lambda e: e.networks, lambda layout: layout.baseline("sgd"), "baselines",
                 _load_laplace_kfac),
    MethodLoader(MethodName.LAPLACE_LL, lambda e: e.networks, lambda layout: layout.baseline("sgd"), "baselines",
                 _load_laplace_ll),
    MethodLoader(MethodName.LAPLACE_GLM, lambda e: e.networks, lambda layout: layout.baseline("sgd"), "baselines",
                 _load_laplace_glm),
)}


def check_methods(names: list[str], where: str) -> None:
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise ConfigError(f"{where}: 'evaluate.methods' has unknown method {unknown[0]!r} "
                          f"(choose from {', '.join(METHODS)})")
    if "sgld" not in names:
        raise ConfigError(f"{where}: 'evaluate.methods' must include 'sgld', the reference every method is "
                          "compared with")


def method_inputs(ctx: RunContext) -> dict[str, str]:
    """The manifest digests of the artifacts the configured methods come from (APD's every generator seed),
    each checked for provenance first (made under this config, unchanged since)."""
    names = ctx.cfg.evaluate.methods
    check_methods(names, ctx.cfg.source)
    inputs = {}
    for name in names:
        method = METHODS[name]
        inputs[name] = require_input(ctx, method.artifact(ctx.layout), method.stage)
    if MethodName.APD in names:  # every generator seed is judged (apd.pipeline.replicates)
        for k in range(1, ctx.cfg.distill.seeds):
            inputs[f"apd-seed{k}"] = require_input(ctx, ctx.layout.generator_of(k), "distill")
    return inputs


def load_methods(ctx: RunContext, stack: ExitStack, details: dict[str, dict] | None = None,
                 loading: dict[str, float] | None = None) -> tuple[dict[str, Posterior], dict[str, str]]:
    """Every configured method as a Posterior, and the manifest digests of the artifacts they come from
    (:func:`method_inputs`). What fitting a method chose (SWAG's learning rate, Laplace's prior and
    scale, Stein's candidates) goes into ``details`` when given, the seconds each took to load or fit
    into ``loading``; a progress bar names the method loading."""
    loading = {} if loading is None else loading
    inputs = method_inputs(ctx)
    sources = Sources(ctx, stack, ParamSpec.from_module(ctx.network()))
    if len(sources.store) < ctx.cfg.evaluate.sgld_samples:
        raise ArtifactError(f"{ctx.layout.samples}: {len(sources.store)} samples, evaluation draws "
                            f"{ctx.cfg.evaluate.sgld_samples}; lower evaluate.sgld_samples or sample more")
    methods = {}
    bar = ctx.progress(ctx.cfg.evaluate.methods, desc="methods", unit="method")
    for name in bar:
        ctx.show(bar, "methods", loading=name)
        with stopwatch(loading, name):
            methods[name] = METHODS[name].load(sources)
    if details is not None:
        details.update(sources.details)
    return methods, inputs


def ensemble_sizes(ctx: RunContext, methods: dict[str, Posterior]) -> dict[str, int]:
    """Members per run: the registry's number, capped by what each method can give."""
    return {name: method.ensemble_size(METHODS[name].members(ctx.cfg.evaluate)) for name, method in methods.items()}
