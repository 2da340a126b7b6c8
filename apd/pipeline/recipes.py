"""What the stages and the studies prepare alike from a run's context: a generator's training samples (the
store's rows, aligned as ``[distill] align`` says), its codec, the validation monitor that judges it, the
Kronecker-factored Laplace terms, and the inputs a posterior is judged on (:func:`evaluation_inputs`: the test
set and the OOD sets, or the validation images and the OOD tuning pool). One recipe each, so that a study
judges and trains as ``apd distill`` and ``apd evaluate`` do. A generator's own streams (its codec, batches,
GAN and monitor) are generator seed k's (:func:`distill_seed`); the samples' preparation is the run's, the same
for every seed and for every method fit to the samples (:func:`store_alignment`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from apd.config import DistillConfig
from apd.data import available_ood, ood_set
from apd.distillation.alignment import align_set, hidden_widths, match_activations, permute
from apd.distillation.codec import WeightCodec
from apd.distillation.training import StoreBatches, ValidationMonitor, evenly_spaced, make_codec, store_permutations
from apd.errors import ConfigError, DataError
from apd.evaluation.protocol import EvaluationInputs
from apd.nets import ParamSpec
from apd.pipeline.runtime import RunContext
from apd.pipeline.seeds import replicated
from apd.pipeline.stored_alignment import is_pipeline_alignment, load_alignment, save_alignment
from apd.posteriors.modes import chain_means
from apd.samplers.store import SampleStore, StoreRows

log = logging.getLogger(__name__)

MONITOR_SIZE = 2000  # validation images the generator is judged on during training
REFERENCE_SAMPLES = 200  # SGLD samples (evenly spaced over the store) the criterion compares with
FISHER_INPUTS = 5000  # training images the Kronecker residual's factors are estimated on


@dataclass(frozen=True)
class LaplaceTerms:
    """What a Kronecker-factored Laplace spread is fit with: training images for its Fisher factors, and
    the tempered posterior's N/T data points and prior precision 1/(prior_var·T)."""

    x_fisher: Tensor
    data_size: float
    prior_precision: float


def distill_seed(ctx: RunContext, k: int, *names: str | int) -> int:
    """The seed of the distillation stream ``names`` (``"gan"``, ``"batches"``, …) for generator seed ``k``
    (:func:`apd.pipeline.seeds.replicated`)."""
    return ctx.seed(*replicated(k, "distill", *names))


def training_images(ctx: RunContext, n: int, *stream: str | int) -> Tensor:
    """n training images, a random subset drawn by the seed stream ``stream``."""
    x = ctx.data.x_train
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(ctx.seed(*stream)))[:n]]


def laplace_terms(ctx: RunContext, *stream: str | int) -> LaplaceTerms:
    """:data:`FISHER_INPUTS` training images drawn by the seed stream ``stream``, and SGLD's N/T and 1/(σ²T)."""
    s, n = ctx.cfg.sgld, len(ctx.data.x_train)
    return LaplaceTerms(training_images(ctx, FISHER_INPUTS, *stream), n / s.temperature,
                        1.0 / (s.prior_var * s.temperature))


def codec_for(ctx: RunContext, samples: Tensor, d: DistillConfig | None = None, seed: int = 0) -> WeightCodec:
    """The codec of ``d`` (the pipeline's distill section by default) fit to ``samples`` for generator seed
    ``seed``; a Kronecker residual with the terms of :func:`laplace_terms`."""
    d, terms = d or ctx.cfg.distill, laplace_terms(ctx, *replicated(seed, "distill", "fisher"))
    try:
        return make_codec(d, samples, ctx.net_sizes, terms.x_fisher, terms.data_size, terms.prior_precision,
                          distill_seed(ctx, seed, "codec"), ctx.device)
    except ValueError as exc:  # e.g. a rank the samples cannot support
        raise ConfigError(f"{ctx.cfg.source}: distill: {exc}") from None


def validation_monitor(ctx: RunContext, spec: ParamSpec, reference_weights: Tensor, seed: int = 0) -> ValidationMonitor:
    """The judge of generator seed ``seed`` during training: validation images against ``reference_weights``."""
    x = ctx.data.x_val[:MONITOR_SIZE].to(ctx.device)
    y = ctx.data.y_val[:MONITOR_SIZE].to(ctx.device)
    return ValidationMonitor(spec, x, y, reference_weights.to(ctx.device), ctx.cfg.distill.eval_networks,
                             distill_seed(ctx, seed, "monitor"))


@dataclass
class TrainingSamples:
    """What a generator learns from: the codec's fit samples as the codec sees them (aligned unless
    ``[distill] align = "none"``), the permutations of every store row (None: unaligned) and the
    alignment's record for the manifest."""

    fit: Tensor
    perms: Tensor | None
    alignment: dict

    def batches(self, ctx: RunContext, store: SampleStore, codec: WeightCodec, d: DistillConfig,
                seed: int = 0, sharing: int = 1) -> StoreBatches:
        """Random real batches of codes for generator seed ``seed``, each row permuted as the fit samples were;
        held in memory within a ``sharing``-th of ``d.in_memory_gb`` (the seeds training at once share it)."""
        return StoreBatches(store, codec, d.batch_size, d.in_memory_gb / sharing, distill_seed(ctx, seed, "batches"),
                            ctx.device, self.perms, store.spec)


def training_samples(ctx: RunContext, store: SampleStore, d: DistillConfig) -> TrainingSamples:
    """``d.fit_samples`` rows evenly spaced over ``store``, aligned (with every other row) when ``d`` says so;
    the one way the pipeline and the studies prepare a generator's training data, made once per run for a
    store, an alignment and a number of rows (:meth:`~apd.pipeline.runtime.RunContext.once`)."""
    return ctx.once(("training samples", str(store.path), d.align, d.fit_samples),
                    lambda: _prepare(ctx, store, d))


def _prepare(ctx: RunContext, store: SampleStore, d: DistillConfig) -> TrainingSamples:
    rows = evenly_spaced(len(store), d.fit_samples)
    fit = store.read(rows)
    if d.align == "none":
        return TrainingSamples(fit, None, {"method": "none"})
    perms, alignment = _alignment(ctx, store, d, fit)
    return TrainingSamples(permute(fit, store.spec, perms[rows]), perms, alignment)


def store_alignment(ctx: RunContext, store: SampleStore | StoreRows) -> Tensor | None:
    """The permutations [len(store), H] that :func:`training_samples` aligns every row of ``store`` with for the
    generator, or None where ``[distill] align = "none"``: the preparation every method fit to the samples
    shares with APD (the MoG, the mode mixture). A view of some rows (:class:`~apd.samplers.store.StoreRows`,
    SGLD's samples after the burn-in) gets its rows' permutations of the whole store's alignment."""
    d = ctx.cfg.distill
    if d.align == "none":
        return None
    if isinstance(store, StoreRows):
        return _alignment(ctx, store.store, d)[0][torch.from_numpy(store.rows)]
    return _alignment(ctx, store, d)[0]


def _alignment(ctx: RunContext, store: SampleStore, d: DistillConfig, fit: Tensor | None = None
               ) -> tuple[Tensor, dict]:
    """The permutations of every row of ``store`` as ``d`` aligns them and the alignment's record, once per run;
    the pipeline's own alignment read from its artifact where one is complete, else computed (from ``fit``, its
    fit rows, where given) and, being the pipeline's, stored (:mod:`apd.pipeline.stored_alignment`)."""
    return ctx.once(("alignment", str(store.path), d.align, d.fit_samples),
                    lambda: _stored_or_aligned(ctx, store, d, fit))


def _stored_or_aligned(ctx: RunContext, store: SampleStore, d: DistillConfig, fit: Tensor | None
                       ) -> tuple[Tensor, dict]:
    own = is_pipeline_alignment(ctx, store.path, d)
    found = load_alignment(ctx, len(store), sum(hidden_widths(store.spec))) if own else None
    if found is not None:
        return found
    if d.align == "permutation":
        rows = evenly_spaced(len(store), d.fit_samples)
        perms, alignment = _align(store, store.spec, rows, store.read(rows) if fit is None else fit)
    else:
        perms, alignment = _align_chains(ctx, store, store.spec)
    if own:
        save_alignment(ctx, perms, alignment)
    return perms, alignment


def aligned_chain_means(ctx: RunContext, store: SampleStore) -> Tensor | None:
    """Each chain's mean [M, D] over its samples aligned as :func:`training_samples` aligns them for the
    generator (:func:`~apd.posteriors.modes.chain_means` of the permuted rows), or None where ``[distill]
    align = "none"``."""
    perms = store_alignment(ctx, store)
    return None if perms is None else chain_means(store, perms)[0]


def _align_chains(ctx: RunContext, store: SampleStore, spec: ParamSpec) -> tuple[Tensor, dict]:
    """Permutations [len(store), H]: every row of a chain takes its chain's, which matches the activations
    of the chain's mean to those of the first chain's mean on :data:`FISHER_INPUTS` training images
    (:func:`~apd.distillation.alignment.match_activations`); and what goes into the manifest."""
    started = time.perf_counter()
    means, _ = chain_means(store)
    x = training_images(ctx, FISHER_INPUTS, "distill", "align")
    by_chain = torch.stack([match_activations(mean, means[0], spec, x) for mean in means])
    labels = np.unique(store.chains)
    perms = by_chain[torch.from_numpy(np.searchsorted(labels, store.chains))]
    aligned = permute(means, spec, by_chain)
    distance = [round(float((m - means[0]).norm()), 4) for m in means[1:]]
    distance_after = [round(float((m - aligned[0]).norm()), 4) for m in aligned[1:]]
    seconds = time.perf_counter() - started
    log.info("hidden units of %d chains matched to the first chain's by activations: distance of the chain means "
             "to the first's %s → %s (%.0f s)", len(means), distance, distance_after, seconds)
    return perms, {"method": "chains", "chains": [int(c) for c in labels], "inputs": len(x),
                   "mean_distance_before": distance, "mean_distance_after": distance_after,
                   "seconds": round(seconds, 2)}


def _align(store: SampleStore, spec: ParamSpec, rows: list[int], fit: Tensor) -> tuple[Tensor, dict]:
    """Permutations [len(store), H] aligning every sample's hidden units to the mean of the aligned ``fit``
    samples (:func:`~apd.distillation.alignment.align_set`), and what goes into the manifest."""
    started = time.perf_counter()
    result = align_set(fit, spec)
    perms = store_permutations(store, spec, rows, result)
    seconds = time.perf_counter() - started
    log.info("hidden units of %d samples aligned in %d rounds: mean distance to the samples' mean %.3f → %.3f "
             "(%.0f s)", len(store), result.rounds, result.distance_before, result.distance_after, seconds)
    return perms, {"method": "permutation", "fit_samples": len(rows), "rounds": result.rounds,
                   "mean_distance_before": round(result.distance_before, 4),
                   "mean_distance_after": round(result.distance_after, 4), "seconds": round(seconds, 2)}


def evaluation_inputs(ctx: RunContext, role: str = "evaluate") -> EvaluationInputs:
    """The test set, its in-distribution subset and each configured OOD set (scaled as configured).
    ``role`` ``tuning`` gives the OOD tuning pool and validation images instead of test images: what
    settings may be chosen on (:func:`apd.data.ood_set`)."""
    cfg, data = ctx.cfg, ctx.data
    e = cfg.evaluate
    x_test, y_test = (data.x_test, data.y_test) if role == "evaluate" else (data.x_val, data.y_val)
    n = min(e.ood_size, len(y_test))
    keep = torch.randperm(len(y_test), generator=torch.Generator().manual_seed(ctx.seed(role, "ood-subset")))[:n]
    available = available_ood(cfg.data, data)
    sets = {}
    for name in cfg.data.ood:
        if name not in available:
            log.warning("skipping OOD set %r: not available here (%s)", name, ", ".join(available))
            continue
        sets[name] = ood_set(name, data, n, cfg.seed, cfg.data.ood_dirs, role=role) * e.ood_scale
    if not sets:
        raise DataError(f"none of the configured OOD sets ({', '.join(cfg.data.ood)}) is available")
    return EvaluationInputs(x_test, y_test, x_test[keep], sets)
