"""``apd experiment precision``: does storing numbers at lower precision let APD beat the kept samples?

A storage budget of S SGLD samples' worth (``budget``, bytes / (4·D)) buys, at each precision of
:mod:`apd.distillation.precision` (float32, float16, int8, int4):

- **APD**: the pipeline's own distiller with one generator for the whole store (its ``[distill]``
  section: codec, residual, generator widths, steps; ``per_chain`` aside) at the largest subspace rank r
  whose stored tensors (generator weights, codec mean, basis, scales and residual factors) fit the budget
  at that precision, trained on float32 samples as ``apd distill`` trains it and then stored at the
  precision;
- **kept samples**: the fewest SGLD samples that take the budget at that precision, k = ⌈S / s⌉ with s
  = bytes of one sample / 4D (:func:`~apd.evaluation.kept_storage.kept_for`, as ``apd evaluate`` and the
  frontier keep them), so at least every method's storage; centred in equal parts of each chain, the last of
  each chain, and ``subsets`` random subsets stratified by chain, each sample stored at the precision. (Studies written
  before kept ⌊S / s⌋, which may take less than a method: the table says where.)

- **SGLD coordinates**: the ceiling of any generator in a rank-r subspace, and a distilled store of its
  own: the codec (mean, basis, scales, no residual) plus every stored sample's r coordinates, at the
  largest r for which both fit the budget at that precision; a member is one sample's coordinates decoded.

- **APD, one generator per chain** (:mod:`apd.distillation.chain_generators`, as ``[distill] per_chain``):
  the same GAN, one per chain of the store, each trained on its chain's coordinates in one shared subspace
  (the codec of the coordinates), a draw split over the chains by their share of the samples; at the
  largest rank for which the codec and the generators fit. The chains of a store may sit in separate
  modes, which one generator fed one Gaussian latent cannot keep apart (its image is connected).

So lower precision buys APD a larger rank and the kept samples more members, and the kept samples never have
fewer bytes than the method they are set against. Both are scored by the kept-samples yardstick
(:mod:`apd.evaluation.yardstick`): worst per-set absolute BALD and max-prob AUROC gap to SGLD, NLL gap and
KL to SGLD's predictive, and the wins of APD and of the coordinates over their kept samples
(:func:`~apd.evaluation.yardstick.wins_over_kept`: a gap below the evenly spaced and the last samples' and a
percentile rank of at least 95 among the random subsets; studies written before by their margins' rule).
The *storage shift* is the mean total variation ½ Σ_y |p̄₃₂(y | x) − p̄(y | x)| on validation images
between an ensemble stored at float32 and the same ensemble (the same codes and residual draws; the same
rows) stored at the precision: what the rounding alone changes.

It is a tuning study: everything is judged on validation images and the OOD *tuning* pool
(:func:`apd.pipeline.recipes.evaluation_inputs` with ``role="tuning"``), never on the test split or the
OOD sets ``apd evaluate`` reports. Outputs: ``artifacts/NAME/experiments/precision.{json,md,png}``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from apd.config import YARDSTICK_SUBSETS, DistillConfig, bounded
from apd.distillation.codec import WeightCodec
from apd.distillation.conditioned import labelled
from apd.distillation.generator import DistilledGenerator, architecture, build_generator
from apd.distillation.precision import (
    PRECISIONS,
    PartPrecisions,
    Precision,
    in_samples,
    module_bytes,
    round_trip,
    round_trip_module_,
    stored_bytes,
)
from apd.distillation.training import encode_store, make_chain_trainers, make_conditioned_trainer
from apd.errors import ConfigError
from apd.evaluation.kept_storage import kept_for
from apd.evaluation.protocol import EvaluationInputs
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import (
    GAPS_PER_DRAW,
    RANK_RULE,
    Reference,
    kept_samples,
    per_draw,
    ranked,
    wins_over_kept,
)
from apd.experiments.distillers import DistillerPlan, Variant, build
from apd.experiments.outputs import run_study
from apd.experiments.storage import judge_runs, sgld_reference
from apd.metrics import mean_of, std_of
from apd.nets import ParamSpec
from apd.pipeline.figures import figure_legend, new_figure, save_figure
from apd.pipeline.finished_parts import FinishedParts, taken_or_made
from apd.pipeline.recipes import TrainingSamples, codec_for, evaluation_inputs, training_samples
from apd.pipeline.runtime import RunContext
from apd.pipeline.seeds import replicated
from apd.pipeline.stage import require_input
from apd.pipeline.table_format import MISSING, format_gap, format_number, format_sample_count, markdown_table, mean_std
from apd.posteriors import APDGenerator, Posterior
from apd.posteriors.kept import FixedEnsemble, evenly_spaced_rows
from apd.samplers.store import SampleStore, chain_labels, chain_partition

log = logging.getLogger(__name__)

GAPS = {"bald_gap": "worst BALD gap", "max_prob_gap": "worst max-prob gap", "nll_gap": "NLL gap"}


def gap_axis_label(key: str) -> str:
    """A figure's axis label for the gap ``key`` of :data:`GAPS`, its unit on a second line (one line runs past
    a panel's height into the figure's title)."""
    unit = "nats" if key == "nll_gap" else "AUROC points"
    return f"{GAPS[key]} to SGLD\n({unit})"


@dataclass
class PrecisionPlan:
    """The budget and precisions compared (``--option KEY=VALUE``, e.g. ``--option budget=4``)."""

    budget: float = bounded(4.0, gt=0)  # SGLD samples' worth (fcNN2's target: S ≤ 4)
    precisions: list[Precision] = bounded(list(PRECISIONS))
    subsets: int = bounded(YARDSTICK_SUBSETS, ge=YARDSTICK_SUBSETS)  # random kept subsets per precision
    steps: int = bounded(0, ge=0)  # generator steps; 0: the pipeline's distill.steps
    max_seconds: float = bounded(1200.0, gt=0)  # wall clock for training one generator
    per_chain: bool = True  # also APD with one generator per chain


def generator_storage(d: DistillConfig, rank: int, spec: ParamSpec, stored_as: PartPrecisions,
                      chains: int = 1) -> float:
    """SGLD samples' worth of the generator ``d`` describes at subspace rank ``rank`` (for a store of ``chains``
    chains), each part stored as ``stored_as`` says (:func:`apd_bytes`; counted on modules of the right
    shapes, before any training)."""
    arch = architecture(dataclasses.replace(d, subspace_rank=rank), spec.numel, spec.layer_sizes, chains)
    return in_samples(apd_bytes(build_generator(arch), stored_as), spec.numel)


def apd_bytes(model: DistilledGenerator, stored_as: PartPrecisions) -> int:
    """Bytes of a distilled generator with each part (the codec's mean, its other tensors, the generator
    networks and chain shares) stored as ``stored_as`` says."""
    return DistilledGenerator(model.generator, model.codec, stored_as).stored_bytes()


def coordinates_storage(rank: int, spec: ParamSpec, samples: int, precision: str) -> float:
    """SGLD samples' worth of a rank-``rank`` subspace codec without a residual plus ``samples`` × ``rank``
    coordinates, stored at ``precision``."""
    codec = WeightCodec.empty("subspace", spec.numel, rank, residual=False)
    return in_samples(module_bytes(codec, precision) + stored_bytes(samples * rank, precision), spec.numel)


def largest_rank(storage: Callable[[int], float], budget: float, limit: int) -> int:
    """The largest rank r ≤ ``limit`` with ``storage(r)`` within ``budget``; 0 when none is."""
    best = 0
    for rank in range(1, limit + 1):
        if storage(rank) > budget:
            break
        best = rank
    return best


def chain_generators_storage(d: DistillConfig, rank: int, spec: ParamSpec, chains: int, stored_as: PartPrecisions,
                             mode_embedding: int = 0) -> float:
    """SGLD samples' worth of a rank-``rank`` subspace codec without a residual plus ``chains`` generators of
    ``d``'s widths (and their shares), or with ``mode_embedding`` E > 0 one generator told the chain by E
    numbers each (:mod:`apd.distillation.conditioned`: the generator, C·E embedding numbers and the C
    shares), each part stored as ``stored_as`` says."""
    kind = dataclasses.replace(d, per_chain=not mode_embedding, mode_embedding=mode_embedding,
                               residual=dataclasses.replace(d.residual, model="none"))
    return generator_storage(kind, rank, spec, stored_as, chains)


def random_batches(codes: Tensor, batch_size: int, seed: int) -> Callable[[], Tensor]:
    """A callable giving ``batch_size`` rows of ``codes`` drawn uniformly with replacement, seeded."""
    rng = torch.Generator().manual_seed(seed)
    return lambda: codes[torch.randint(len(codes), (batch_size,), generator=rng).to(codes.device)]


def train_chain_generators(ctx: RunContext, store: SampleStore, coordinates: StoredCoordinates,
                           steps: int, seed: int = 0) -> APDGenerator:
    """WGAN-GP (the pipeline's ``[distill]`` settings) on each chain's rows of ``coordinates``, ``steps``
    generator steps each, seeded per chain (from generator seed ``seed``'s streams,
    :func:`~apd.pipeline.seeds.replicated`) and trained as one
    (:func:`~apd.distillation.training.make_chain_trainers`); the chains' shares of the store weigh the draws."""
    d, (ids, rows, shares) = ctx.cfg.distill, chain_partition(store.chains)
    codes = [coordinates.coordinates[r.to(coordinates.coordinates.device)] for r in rows]
    seeds = [ctx.seed(*replicated(seed, "experiment", "precision", "chain", chain)) for chain in ids]
    trainers = make_chain_trainers(d, coordinates.coordinates.shape[1], seeds, shares, ctx.device)
    batches = [random_batches(part, d.batch_size, seed) for part, seed in zip(codes, seeds, strict=True)]
    with ctx.progress(total=steps, desc=f"{len(ids)} chain generators, r={coordinates.coordinates.shape[1]}",
                      unit="step") as bar:
        while trainers.generator_steps < steps:
            trainers.step(batches, d.n_critic)
            bar.update()
    model = DistilledGenerator(trainers.generator.eval(), coordinates.codec)
    return APDGenerator(model, store.spec, f"APD per chain r={coordinates.coordinates.shape[1]}")


def train_conditioned_generator(ctx: RunContext, store: SampleStore, coordinates: StoredCoordinates, steps: int,
                                mode_embedding: int, seed: int = 0) -> APDGenerator:
    """One WGAN-GP (the pipeline's ``[distill]`` settings) told the chain by ``mode_embedding`` learned numbers
    (:func:`~apd.distillation.training.make_conditioned_trainer`, as ``[distill] mode_embedding`` trains it) on
    every row of ``coordinates`` with its chain, rows drawn uniformly (so chains by their shares), ``steps``
    generator steps, seeded from generator seed ``seed``'s streams (:func:`~apd.pipeline.seeds.replicated`)."""
    d, (_, _, shares) = ctx.cfg.distill, chain_partition(store.chains)
    codes, rank = coordinates.coordinates, coordinates.coordinates.shape[1]
    stream = ctx.seed(*replicated(seed, "experiment", "frontier", "conditioned"))
    trainer = make_conditioned_trainer(dataclasses.replace(d, mode_embedding=mode_embedding), rank, stream, shares,
                                       ctx.device)
    batches = random_batches(labelled(codes, chain_labels(store.chains).to(codes.device)), d.batch_size, stream)
    with ctx.progress(total=steps, desc=f"generator told the chain, r={rank}", unit="step") as bar:
        while trainer.generator_steps < steps:
            trainer.step(batches, d.n_critic)
            bar.update()
    model = DistilledGenerator(trainer.generator.eval(), coordinates.codec)
    return APDGenerator(model, store.spec, f"APD told the chain r={rank}")


class StoredCoordinates(Posterior):
    """Every SGLD sample's coordinates in a subspace codec's principal subspace, θ_i ↦ μ + U·diag(σ)·c_i with
    c_i = Uᵀ(θ_i − μ)/σ, kept ([n, r]) at ``precision``, the codec's parts as ``codec_stored_as`` says
    (default: all at ``precision``); a member is one of them decoded (rows drawn without replacement)."""

    def __init__(self, codec: WeightCodec, coordinates: Tensor, spec: ParamSpec, name: str,
                 precision: str = "float32", codec_stored_as: PartPrecisions | None = None) -> None:
        self.codec, self.coordinates, self.spec, self.name = codec, coordinates, spec, name
        self.precision, self.codec_stored_as = precision, codec_stored_as or PartPrecisions(precision)
        self.device = codec.mean.device

    def max_members(self) -> int:
        return len(self.coordinates)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        generator = self.on_device(generator)
        rows = torch.randperm(len(self.coordinates), generator=generator, device=self.device)[:k]
        return self.codec.decode_principal(self.coordinates[rows])

    def stored_parameters(self) -> int:
        return self.codec.stored_parameters() + self.coordinates.numel()

    def stored_bytes(self) -> int:
        """Bytes of the codec and every sample's coordinates, each at the precision it is stored at."""
        return (module_bytes(self.codec, self.codec_stored_as.of_codec)
                + stored_bytes(self.coordinates.numel(), self.precision))

    def storage_in_samples(self) -> float:
        """:meth:`stored_bytes` in SGLD samples' worth."""
        return in_samples(self.stored_bytes(), self.spec.numel)

    def stored_at(self, stored_as: PartPrecisions) -> StoredCoordinates:
        """A copy with the codec's parts read back from their precisions in ``stored_as`` and the coordinates
        from its codec's, counted at them: a distilled store of its own, stored as a generator would be."""
        codec, precision = stored_as.codec_only(), stored_as.codec
        return StoredCoordinates(self._codec_read_back(codec), round_trip(self.coordinates, precision), self.spec,
                                 f"{self.name}, {codec.describe()}", precision, codec)

    def codec_at(self, stored_as: PartPrecisions) -> StoredCoordinates:
        """A copy with only the codec read back from its parts' precisions in ``stored_as`` (the coordinates as
        they are): the samples' own coordinates decoded as a generator stored so decodes its codes."""
        codec = stored_as.codec_only()
        return StoredCoordinates(self._codec_read_back(codec), self.coordinates, self.spec,
                                 f"{self.name}, codec {codec.describe()}", self.precision, codec)

    def _codec_read_back(self, stored_as: PartPrecisions) -> WeightCodec:
        """A copy of the codec with every tensor read back from its precision in ``stored_as``."""
        return round_trip_module_(copy.deepcopy(self.codec), stored_as.of_codec)


def sgld_coordinates(ctx: RunContext, store: SampleStore, data: TrainingSamples, rank: int) -> StoredCoordinates:
    """The coordinates of every row of ``store`` (aligned as ``data`` says) in the rank-``rank`` subspace of
    ``data.fit`` (the pipeline's codec at that rank, without a residual)."""
    d = ctx.cfg.distill
    codec = codec_for(ctx, data.fit, dataclasses.replace(d, subspace_rank=rank,
                                                         residual=dataclasses.replace(d.residual, model="none")))
    return StoredCoordinates(codec, encode_store(store, codec, ctx.device, data.perms), store.spec,
                             f"SGLD coordinates r={rank}")


@torch.no_grad()
def storage_shift(exact: Posterior, stored: Posterior, x: Tensor, networks: int, seed: int) -> float:
    """Mean over inputs of ½ Σ_y |p̄_exact(y | x) − p̄_stored(y | x)|, both ensembles of ``networks`` members
    drawn with one seed (the same codes and noise, or the same rows)."""
    means = [method.predict_probs(x.to(method.device), networks, torch.Generator().manual_seed(seed)).double().mean(0)
             for method in (exact, stored)]
    return float(0.5 * (means[0] - means[1]).abs().sum(-1).mean())


def stored_apd(method: APDGenerator, stored_as: PartPrecisions) -> APDGenerator:
    """A copy of ``method`` with every stored tensor read back from its part's precision in ``stored_as``:
    what ``apd distill`` stores (:meth:`~apd.distillation.generator.DistilledGenerator.pack`) and loads."""
    exact = copy.deepcopy(method.model)
    model = DistilledGenerator(exact.generator, exact.codec, stored_as)
    model.load_state_dict(model.unpack(model.pack(model.state_dict())))
    return APDGenerator(model, method.spec, f"{method.name}, {stored_as.describe()}")


def shipped_variant(d: DistillConfig, rank: int) -> Variant:
    """The pipeline's distiller (its residual model and scaling) at subspace rank ``rank``."""
    residual = "" if d.residual.model == "none" else d.residual.scale
    return Variant(f"APD r={rank}", "subspace", rank=rank, residual=residual,
                   residual_model=d.residual.model if residual else "diagonal")


def _means(auroc: dict) -> dict:
    return {score: {name: mean_of(stat) for name, stat in by_set.items()} for score, by_set in auroc.items()}


def judged_margins(summary: dict, kept: dict, sgld: dict) -> dict:
    """:func:`~apd.evaluation.yardstick.wins_over_kept` of a judged method against ``kept``: its
    :func:`~apd.evaluation.yardstick.spread` over draws gives the means of its per-set AUROC gaps and of its
    NLL gap (a study written before per-set gaps: its mean AUROCs); SGLD's side from ``sgld`` (its judged
    summary: mean per-set AUROCs, the reference)."""
    own = {"nll_gap": mean_of(summary["nll_gap"])}
    if "set_gaps" in summary:
        own["set_gaps"] = _means(summary["set_gaps"])
    return wins_over_kept(own, _means(summary["auroc"]), mean_of(summary["nll"]), kept, _means(sgld["auroc"]))


def kept_row(ctx: RunContext, predictions: StoredPredictions, k: int, inputs: EvaluationInputs, reference: Reference,
             plan: PrecisionPlan, precision: str, seed: int) -> dict:
    """The k kept samples stored at ``precision`` (:func:`~apd.evaluation.yardstick.kept_samples`) and the
    storage shift of the evenly spaced ones."""
    store = predictions.store
    row = kept_samples(predictions, k, inputs, reference, plan.subsets, torch.Generator().manual_seed(seed), precision)
    exact = store.read(evenly_spaced_rows(len(store), k, store.chains))
    row["storage_shift"] = storage_shift(
        FixedEnsemble(exact, store.spec, ctx.device),
        FixedEnsemble(torch.stack([round_trip(v, precision) for v in exact]), store.spec, ctx.device),
        ctx.data.x_val, k, seed)
    return row


def scored(ctx: RunContext, stored: Posterior, nbytes: int, inputs: EvaluationInputs, reference: Reference,
           kept: dict | None, seed: int, sgld: dict) -> dict:
    """A method stored in ``nbytes``: its storage, the yardstick over ``runs`` draws of ``networks`` members
    and its wins over ``kept`` (None without kept samples; ``sgld``: SGLD's judged summary)."""
    e = ctx.cfg.evaluate
    out = {"in_sgld_samples": in_samples(nbytes, stored.spec.numel),
           **judge_runs(stored, e.networks, inputs, reference, e.runs, seed)}
    out["margins"] = None if kept is None else judged_margins(out, kept, sgld)
    return out


def judged(ctx: RunContext, exact: Posterior, stored: Posterior, nbytes: int, inputs: EvaluationInputs,
           reference: Reference, kept: dict | None, seed: int, sgld: dict) -> dict:
    """:func:`scored`, and the storage shift of ``stored`` against ``exact`` (the same method at float32)."""
    return {**scored(ctx, stored, nbytes, inputs, reference, kept, seed, sgld),
            "storage_shift": storage_shift(exact, stored, ctx.data.x_val, ctx.cfg.evaluate.networks, seed)}


def require_subspace(ctx: RunContext, study: str) -> None:
    """A budget study searches the subspace rank a budget buys: the pipeline's distiller must have one."""
    if ctx.cfg.distill.generator != "subspace":
        raise ConfigError(f"{ctx.cfg.source}: the {study} study needs [distill] generator = \"subspace\" "
                          "(its rank is what the budget buys)")


def compare_precisions(ctx: RunContext, plan: PrecisionPlan, finished: FinishedParts | None = None) -> dict:
    """For each precision of ``plan``: APD at the largest rank, the SGLD coordinates at the largest rank and
    the most kept samples the budget buys, judged on validation images and the OOD tuning pool; the results
    as JSON-able data. Each precision's row is kept in ``finished`` once made, and one found there (an
    interrupted run of the same study made it) is taken: every row draws from seeds of its own."""
    cfg, e = ctx.cfg, ctx.cfg.evaluate
    require_subspace(ctx, "precision")
    source = ctx.layout.samples
    require_input(ctx, source, "sample")
    started = time.perf_counter()
    inputs = evaluation_inputs(ctx, role="tuning")
    with SampleStore.open(source, expect_spec=ParamSpec.from_module(ctx.network())) as store:
        spec, dim, n = store.spec, store.spec.numel, len(store)
        predictions = StoredPredictions(store, inputs.stacked(ctx.device), ctx.device, progress=ctx.progress)
        sgld, reference = sgld_reference(ctx, predictions, inputs)
        data = training_samples(ctx, store, cfg.distill)
        by_rank: dict[int, StoredCoordinates] = {}  # the store encoded once per rank

        def coordinates_at(r: int) -> StoredCoordinates:
            if r not in by_rank:
                by_rank[r] = sgld_coordinates(ctx, store, data, r)
            return by_rank[r]

        limit = min(n, cfg.distill.fit_samples, dim)
        one = dataclasses.replace(cfg.distill, per_chain=False, mode_embedding=0)  # the APD row: one plain generator
        chains = len(chain_partition(store.chains)[0])
        steps = DistillerPlan(subspace_steps=plan.steps)

        def row_at(precision: Precision) -> dict:
            throughout = PartPrecisions(precision)  # every part at the precision
            rank = largest_rank(lambda r: generator_storage(one, r, spec, throughout), plan.budget, limit)
            coordinate_rank = largest_rank(lambda r: coordinates_storage(r, spec, n, precision), plan.budget,
                                           limit)
            chain_rank = largest_rank(lambda r: chain_generators_storage(
                cfg.distill, r, spec, chains, throughout), plan.budget, limit) if plan.per_chain else 0
            k = kept_for(plan.budget, dim, precision, n)
            seed = ctx.seed("experiment", "precision", precision)
            kept = kept_row(ctx, predictions, k, inputs, reference, plan, precision, seed) if k else None
            predictions.forget(precision)  # no other row keeps samples at it: the next one's fit in their room
            row: dict = {"precision": precision, "rank": rank, "k": k, "kept": kept, "apd": None, "margins": None,
                         "per_chain": None, "coordinates": None}
            if rank:
                t0 = time.perf_counter()
                built = build(shipped_variant(cfg.distill, rank), ctx, store, steps, t0 + plan.max_seconds, data)
                stored = stored_apd(built.method, throughout)
                row["apd"] = {"steps": built.steps, "residual_scale": built.residual_scale,
                              "seconds": round(time.perf_counter() - t0, 2),
                              **judged(ctx, built.method, stored, module_bytes(stored.model, precision), inputs,
                                       reference, kept, seed, sgld)}
                row["margins"] = row["apd"].pop("margins")
            if chain_rank:
                exact = train_chain_generators(ctx, store, coordinates_at(chain_rank),
                                               plan.steps or cfg.distill.steps)
                stored = stored_apd(exact, throughout)
                row["per_chain"] = {"rank": chain_rank, "chains": len(stored.model.generator.generators),
                                    **judged(ctx, exact, stored, module_bytes(stored.model, precision), inputs,
                                             reference, kept, seed, sgld)}
            if coordinate_rank:
                exact = coordinates_at(coordinate_rank)
                stored = exact.stored_at(throughout)
                row["coordinates"] = {"rank": coordinate_rank,
                                      **judged(ctx, exact, stored, stored.stored_bytes(), inputs,
                                               reference, kept, seed, sgld)}
            log.info("%s: APD rank %d, %d kept samples%s", precision, rank, k,
                     "" if row["margins"] is None else f"; APD wins {row['margins']['wins']} of "
                     f"{row['margins']['compared']}")
            return row

        rows = [taken_or_made(finished, f"precision {precision}", functools.partial(row_at, precision))
                for precision in plan.precisions]
    return {"pipeline": cfg.name, "dataset": ctx.data.name, "dim": dim, "sgld_samples": n, "runs": e.runs,
            "networks": e.networks, "ood_sets": list(inputs.ood), "budget": plan.budget,
            "judged_on": "validation images and the OOD tuning pool (never the test split or evaluate's OOD sets)",
            "plan": dataclasses.asdict(plan), "sgld": sgld, "rows": rows,
            "seconds": round(time.perf_counter() - started, 2)}


def _method_rows(row: dict) -> list[tuple[str, str, dict | None, dict | None]]:
    """(method, rank or k, its yardstick summary, its margins over the kept samples) of one precision's row;
    the kept samples twice, evenly spaced and the random subsets' mean ± std."""
    kept, coordinates = row["kept"], row["coordinates"]
    per_chain = row.get("per_chain")
    return [("APD", f"r={row['rank']}" if row["rank"] else "none fits", row["apd"], row["margins"]),
            ("APD, one generator per chain", f"r={per_chain['rank']}" if per_chain else "—", per_chain,
             None if per_chain is None else per_chain["margins"]),
            ("SGLD coordinates", f"r={coordinates['rank']}" if coordinates else "none fits", coordinates,
             None if coordinates is None else coordinates.get("margins")),
            ("kept, evenly spaced", f"k={row['k']}", None if kept is None else kept["evenly_spaced"], None),
            *([("kept, last of each chain", f"k={row['k']}", kept["last"], None)] if kept and "last" in kept else []),
            ("kept, random subsets", f"k={row['k']}", None if kept is None else kept["random"], None)]


def fewer_bytes_than_kept(row: dict) -> list[str]:
    """The judged methods of one precision's row whose storage exceeds that of the row's kept samples (only
    studies written before the kept samples were ⌈S / s⌉ have any): their wins over kept are not at equal
    storage."""
    kept = row["kept"]
    return [] if kept is None else [
        method for method, _, summary, margins in _method_rows(row)
        if margins is not None and summary["in_sgld_samples"] > kept["in_sgld_samples"]]


def wins_over_float32_kept(summary: dict, float32_kept: dict | None, sgld: dict) -> dict | None:
    """A judged method's wins over ⌈S⌉ kept samples stored at float32 (the kept-samples yardstick), S its
    storage: over ``float32_kept`` (the float32 row's kept samples) when there are ⌈S⌉ of them; None
    otherwise."""
    if float32_kept is None or float32_kept["k"] != math.ceil(summary["in_sgld_samples"]):
        return None
    return judged_margins(summary, float32_kept, sgld)


MARGINS_NOTE = ("worst per-set AUROC gap in points (positive: below SGLD), NLL gap in nats; KL to SGLD's predictive. "
                "Wins over kept: margins over both the evenly spaced and the random kept samples larger than the "
                "random subsets' std, of the per-set BALD and max-prob AUROCs and the NLL;")  # studies before ranks
RANKED_NOTE = ("worst per-set absolute AUROC gap in points (above or below SGLD alike), NLL gap in nats ({gaps}); KL "
               "to SGLD's predictive. Kept samples: centred in equal parts of each chain (evenly spaced), the last of "
               "each chain, and random subsets stratified by chain. Wins over kept: the comparisons won, of the "
               "per-set absolute BALD and max-prob AUROC gaps and the NLL gap;")


def render_table(results: dict) -> str:
    """The Markdown of ``precision.md``: a note on the protocol and, per precision, APD, the SGLD coordinates
    and the kept samples on each yardstick quantity."""
    kept_rows = [row["kept"] for row in results["rows"] if row["kept"] is not None]
    by_ranks = bool(kept_rows) and ranked(kept_rows[0])
    kept_phrase = ("the fewest SGLD samples that take the budget (⌈S / s⌉, s one sample's storage)"
                   if all(kept["in_sgld_samples"] >= results["budget"] - 1e-9 for kept in kept_rows)
                   else "the most SGLD samples that fit")
    note = (f"# Storage precision on {results['pipeline']}\n\nA budget of {results['budget']:g} SGLD samples' "
            f"worth (D = {results['dim']:,} weights, {results['sgld_samples']:,} stored samples) at each precision: "
            "APD (the pipeline's distiller at the largest rank that fits, stored at the precision), "
            + ("APD with one generator per chain in a shared subspace (no residual), "
               if results["plan"].get("per_chain") else "") +
            "every SGLD "
            "sample's coordinates in the largest principal subspace that fits with them (the ceiling of a "
            f"generator in that subspace) and {kept_phrase}, evenly spaced and the mean ± std "
            f"of {results['plan']['subsets']} random subsets, all stored at the same precision. "
            f"{results['runs']} runs × {results['networks']} networks per draw (mean ± std over runs); judged on "
            f"validation images and the OOD tuning pool ({' / '.join(results['ood_sets'])}). Gaps to SGLD: "
            + (RANKED_NOTE.format(gaps=GAPS_PER_DRAW[per_draw(row.get("apd") for row in results["rows"])])
               if by_ranks else MARGINS_NOTE) +
            " over kept at the row's precision, and over ⌈S⌉ samples kept at float32 (the float32 row's). "
            + (RANK_RULE + " " if by_ranks else "") + "Storage shift: mean total "
            "variation between the predictive stored at float32 and at the precision (the same members), on "
            "validation images.\n\n")
    header = ["precision", "method", "rank / k", "storage", *GAPS.values(), "KL", "wins over kept",
              "wins over ⌈S⌉ float32 kept", "storage shift"]
    float32_kept = next((row["kept"] for row in results["rows"] if row["precision"] == "float32"), None)
    body = []
    for row in results["rows"]:
        for method, size, summary, margins in _method_rows(row):
            if method.endswith("per chain") and summary is None and not results["plan"].get("per_chain", False):
                continue  # not asked for
            shift = None if summary is None else summary.get("storage_shift")
            if method.startswith("kept") and row["kept"] is not None and method.endswith("spaced"):
                shift = row["kept"]["storage_shift"]
            storage = (row["kept"]["in_sgld_samples"] if method.startswith("kept") and row["kept"] is not None
                       else None if summary is None else summary["in_sgld_samples"])
            kl = None if summary is None else summary["kl"]
            over_float32 = None if margins is None else wins_over_float32_kept(summary, float32_kept, results["sgld"])
            body.append([row["precision"], method, size, format_sample_count(storage),
                         *(MISSING if summary is None else format_gap(summary[key], 3 if key == "nll_gap" else 1)
                           for key in GAPS),
                         (mean_std(kl, 4) if isinstance(kl, dict) else format_number(kl, 4)),
                         "—" if margins is None else f"{margins['wins']} of {margins['compared']}",
                         "—" if over_float32 is None else f"{over_float32['wins']} of {over_float32['compared']}",
                         format_number(shift, 4)])
    short = [f"at {row['precision']} than {' and '.join(f'“{m}”' for m in methods)}" for row in results["rows"]
             if (methods := fewer_bytes_than_kept(row))]
    caveat = (f"\nThe kept samples take less storage {'; '.join(short)}: those wins over kept are not at equal "
              "storage.\n" if short else "")
    return note + markdown_table(header, body) + "\n" + caveat


def draw_figure(results: dict, path: Path) -> None:
    """One panel per yardstick gap (worst BALD and max-prob AUROC gap, NLL gap): per precision, APD and the
    SGLD coordinates (means over runs), the evenly spaced kept samples and the random subsets (mean over
    subsets) side by side, each std as an error bar."""
    figure, axes = new_figure(1, 3, panel=(5.2, 3.9))
    rows = results["rows"]
    x = np.arange(len(rows))
    width = 0.16
    for ax, key in zip(axes[0], GAPS, strict=True):
        methods = ["APD", "APD, one generator per chain", "SGLD coordinates", "kept, evenly spaced",
                   "kept, random subsets"]
        for i, method in enumerate(methods):
            stats = [next(summary for name, _, summary, _ in _method_rows(row) if name == method) for row in rows]
            values = [None if s is None else s[key] for s in stats]
            heights = [np.nan if v is None else mean_of(v) for v in values]
            errors = [std_of(v) for v in values]
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, heights, width=width, yerr=errors, label=method,
                   color=f"C{i}", capsize=3)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(x, [f"{row['precision']}\nk={row['k']}" for row in rows])
        ax.set(ylabel=gap_axis_label(key), title=f"{results['pipeline']}, {results['budget']:g} samples' worth")
    figure_legend(figure)
    save_figure(figure, path)


def run_precision(ctx: RunContext, options: list[str]) -> dict:
    """``apd experiment precision``: compare, write ``experiments/precision.{json,md,png}``, print the table;
    resumes a run of the same study cut short (:func:`~apd.experiments.outputs.study_parts`)."""
    return run_study(ctx, options, PrecisionPlan, compare_precisions, "precision", render_table, draw_figure)
