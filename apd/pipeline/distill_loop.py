"""The GAN loop of ``apd distill``: one trainer steps the GANs of one generator seed, or of several seeds
trained as one batch; every ``eval_every`` generator steps each seed's generator is judged on validation
inputs and its best step kept; the loop checkpoints and resumes; at the end each seed's residual is scaled
(:mod:`apd.distillation.residual`) and its kept and last generators are written to their partial files.

What belongs to one seed (its stored generator, its judge, its random streams, what its judging found) is a
:class:`SeedRun`; the step the loop is given returns each run's statistics, in the runs' order.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from apd.config import config_hash
from apd.distillation.chain_generators import ChainTrainers
from apd.distillation.codec import WeightCodec
from apd.distillation.gan import GANTrainer
from apd.distillation.generator import DistilledGenerator, part_precisions
from apd.distillation.training import ValidationMonitor
from apd.errors import DivergenceError
from apd.io import nonfinite_tensor, save_torch_atomic
from apd.pipeline.layout import checkpoint_of, partial_of
from apd.pipeline.manifests import load_checkpoint
from apd.pipeline.recipes import REFERENCE_SAMPLES
from apd.pipeline.runtime import RunContext

log = logging.getLogger(__name__)

Stats = dict[str, float]


@dataclass
class SeedRun:
    """Generator seed ``seed``'s part of a training run: ``model``, its generator (or views of its slice of a
    stack) with its codec, stored at ``[distill] precision``; the ``monitor`` that judges it; the random
    ``streams`` a resumed run restores (its real batches', then the monitor's); and what the judging found."""

    seed: int
    model: DistilledGenerator
    monitor: ValidationMonitor
    streams: tuple[torch.Generator, ...]
    history: list[dict] = field(default_factory=list)
    best: dict = field(default_factory=lambda: {"step": 0, "criterion": math.inf, "state": None})

    @classmethod
    def of(cls, ctx: RunContext, seed: int, generator: nn.Module, codec: WeightCodec, monitor: ValidationMonitor,
           streams: Sequence[torch.Generator]) -> SeedRun:
        """The run of seed ``seed`` for ``generator`` in ``codec``'s space, judged by ``monitor``."""
        d = ctx.cfg.distill
        return cls(seed, DistilledGenerator(generator, codec, part_precisions(d)), monitor,
                   (*streams, monitor.rng))

    def judge(self, step: int, stats: Stats, rule: str) -> Stats:
        """The criterion and its parts at generator step ``step``, recorded with the step's ``stats``; the
        step is kept when it is the best so far (``rule`` "last": always)."""
        self.model.eval()
        judged = self.monitor.judge(self.model)
        self.history.append({"step": step, **{k: round(v, 6) for k, v in {**judged, **stats}.items()}})
        if rule == "last" or judged["criterion"] < self.best["criterion"]:
            self.best = {"step": step, "criterion": judged["criterion"],
                         "state": copy.deepcopy(self.model.state_dict())}
        return judged

    def state(self) -> dict:
        """What a checkpoint keeps of the run."""
        return {"history": self.history, "best": self.best, "streams": [rng.get_state() for rng in self.streams]}

    def restore(self, state: dict) -> None:
        """Take up the run where :meth:`state` left it."""
        self.history, self.best = state["history"], state["best"]
        for rng, saved in zip(self.streams, state["streams"], strict=True):
            rng.set_state(saved)


def _check_finite(trainer: GANTrainer | ChainTrainers, step: int) -> None:
    """Stop with a :class:`DivergenceError` once the generator's or the critic's weights are not finite,
    before anything is judged, kept or checkpointed with them."""
    for part in ("generator", "critic"):
        bad = nonfinite_tensor(getattr(trainer, part).state_dict())
        if bad is not None:
            raise DivergenceError(f"GAN training diverged by generator step {step} (the {part}'s {bad} is not "
                                  "finite); try a smaller distill.lr; complete artifacts are unchanged")


def _joined(values: Sequence[float], spec: str) -> str:
    """The seeds' figures for the progress bar, one per seed: "0.123" or "0.123/0.118/0.131"."""
    return "/".join(format(v, spec) for v in values)


def train(ctx: RunContext, trainer: GANTrainer | ChainTrainers, runs: list[SeedRun], step: Callable[[], list[Stats]],
          inputs: dict, between_steps: Callable[[int], None] | None = None) -> list[dict]:
    """``[distill] steps`` calls of ``step`` (one generator step of ``trainer``, returning each run's
    statistics), the runs judged every ``eval_every`` steps and at the last; checkpointed every
    ``checkpoint_every`` steps into the first run's checkpoint (with the seeds it trains and the kind of
    device its random streams are on, so a run of other seeds, or on a CPU after a card, starts afresh) and
    resumed from it, unless ``between_steps`` is given (online runs hold SGLD chains and a buffer: they start
    afresh). Returns each run's summary (:func:`_kept`)."""
    d = ctx.cfg.distill
    stage_hash, seeds = config_hash(ctx.cfg, "distill"), [run.seed for run in runs]
    checkpoint = checkpoint_of(ctx.layout.generator_of(seeds[0]))
    resumable = between_steps is None
    streams = torch.device(ctx.device).type  # a CPU's and a card's random streams have states of other kinds
    ckpt = (load_checkpoint(checkpoint, config_hash=stage_hash, inputs=inputs, seeds=seeds, streams=streams)
            if resumable and not ctx.force else None)
    if ckpt is not None:
        trainer.load_state_dict(ckpt["trainer"])
        for run, state in zip(runs, ckpt["runs"], strict=True):
            run.restore(state)
        log.info("resuming distillation at generator step %d", trainer.generator_steps)
    bar = ctx.progress(total=d.steps, initial=trainer.generator_steps, desc="WGAN-GP" if d.loss == "wgan-gp"
                       else d.loss.upper(), unit="step")
    stats: list[Stats] = [{} for _ in runs]
    with bar:
        while trainer.generator_steps < d.steps:
            if between_steps is not None:
                between_steps(trainer.generator_steps)
            stats = step()
            bar.update()
            at = trainer.generator_steps
            if at % d.eval_every == 0 or at == d.steps or (resumable and at % d.checkpoint_every == 0):
                _check_finite(trainer, at)
            if at % d.eval_every == 0 or at == d.steps:
                judged = [run.judge(at, run_stats, d.selection) for run, run_stats in zip(runs, stats, strict=True)]
                ctx.show(bar, f"generator step {at}/{d.steps}",
                         W=_joined([s.get("wasserstein", math.nan) for s in stats], ".3f"),
                         criterion=_joined([j["criterion"] for j in judged], ".4f"),
                         acc=_joined([j["accuracy"] for j in judged], ".4f"))
            if resumable and at % d.checkpoint_every == 0 and at < d.steps:
                save_torch_atomic(checkpoint, {"config_hash": stage_hash, "inputs": inputs, "seeds": seeds,
                                               "streams": streams, "trainer": trainer.state_dict(),
                                               "runs": [run.state() for run in runs]})
    return [_kept(ctx, run, run_stats) for run, run_stats in zip(runs, stats, strict=True)]


def _kept(ctx: RunContext, run: SeedRun, stats: Stats) -> dict:
    """The run's kept step restored, its residual scaled as configured, its kept and last generators written
    to their partial files at ``[distill] precision`` (the generator networks at ``generators_at`` where
    given); stored below float32, the stored generator is judged once more (``selection.stored``). Returns
    the summary its manifest records."""
    d, model, monitor, history, best = ctx.cfg.distill, run.model, run.monitor, run.history, run.best
    if best["state"] is None:
        last = history[-1]
        raise DivergenceError(f"no generator step had a finite selection criterion (step {last['step']}: "
                              f"{last['criterion']}); try a smaller distill.lr; complete artifacts are unchanged")
    last = copy.deepcopy(model.state_dict())
    model.load_state_dict(best["state"])
    residual = _match_residual(ctx, model, monitor) if model.codec.has_residual else {}
    last.update({f"codec.{name}": value.clone() for name, value in model.codec.state_dict().items()})
    save_torch_atomic(partial_of(ctx.layout.generator_last_of(run.seed)), model.pack(last))
    stored = model.pack(model.state_dict())
    save_torch_atomic(partial_of(ctx.layout.generator_of(run.seed)), stored)
    kept = next(entry for entry in history if entry["step"] == best["step"])
    selection = {"criterion": "mean KL(SGLD ‖ generated) + mean |BALD gap| on validation inputs (nats)",
                 "rule": d.selection, "inputs": len(monitor.x), "reference_samples": REFERENCE_SAMPLES,
                 "kept_step": best["step"], "kept": kept, "last": history[-1]}
    if model.rounds():  # what the stored numbers give, judged as the kept step was
        model.load_state_dict(model.unpack(stored))
        selection["stored"] = {key: round(value, 6) for key, value in monitor.judge(model.eval()).items()}
    return {"selection": selection, "history": history, "sgld_val_accuracy": monitor.reference.accuracy,
            "sgld_val_mean_bald": monitor.reference.mean_information,
            "generator_parameters": model.stored_parameters(), "stored_bytes": model.stored_bytes(),
            "final_stats": stats, **residual}


def _match_residual(ctx: RunContext, model: DistilledGenerator, monitor: ValidationMonitor) -> dict:
    """Scale the codec's residual as configured (``matched``: α from :meth:`ValidationMonitor.scale_residual`;
    ``fitted``: α = 1); returns what goes into the manifest."""
    if ctx.cfg.distill.residual.scale == "fitted":
        return {"residual_scale": 1.0}
    scale = monitor.scale_residual(model.codec, lambda k, rng: model.generator.sample(k, generator=rng))
    return {"residual_scale": scale}
