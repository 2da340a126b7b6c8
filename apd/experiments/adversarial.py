"""Adversarial-example detection: the protocol of Wang et al. (ICML 2018), plus a white-box variant.

**Gray-box** (the paper's): for each source method the attacker sees one member only — one weight
sample θ ~ q (SGLD, APD, MoG, the SGD net), or the MC-dropout net with dropout active, a fresh mask on
every forward pass. Two attacks are crafted on it from the validation split, each input visited once in
a seeded order until ``adv_examples`` of them succeed (the attacked member's prediction ≠ the label):

- FGSM with, per example, the smallest ε of ``fgsm_eps_grid`` that succeeds (the reference code's
  search);
- PGD, ``pgd_steps`` signed-gradient steps of ``pgd_step_size`` inside the L∞ ball of ``pgd_eps``,
  no random start (Madry et al. 2018).

Every method (the target) then scores the successful examples and as many clean test inputs with an
ensemble of ``adv_samples`` members (one draw per target, shared by all its inputs): the detection
AUROC of predictive entropy, BALD and model variance (adversarial positive) and the ensemble's
accuracy on the adversarial inputs — the source × target transfer table of the paper.

**White-box** (``adv_whitebox``): each source is also attacked through its own expected predictive
p̄(y | x) = (1/M) Σ_m p(y | x, θ_m) over ``adv_eot_members`` members (expectation over transformation,
Athalye et al. 2018; for MC dropout M fresh masks per forward pass), with PGD and with FGSM at
ε = ``pgd_eps``, and scored by that method alone.

Crafted sets are stored in ``artifacts/NAME/adversarial/`` (HDF5, written to a temporary name and
renamed) and reused while the config sections and the source's artifact they depend on are unchanged.
Every random choice derives from the pipeline seed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import h5py
import torch
from torch import Tensor, nn

from apd.artifacts import manifest_digest, manifest_path
from apd.attacks import ModelFn, craft, expected_predictive_fn, module_fn, weight_sample_fn
from apd.config import EvaluateConfig, config_hash
from apd.distill import generator_path
from apd.metrics import detection
from apd.nets import predict_probs
from apd.posteriors import MCDropout, PointEstimate, Posterior, SGLDSamples, WeightSpacePosterior
from apd.runtime import RunContext
from apd.sampling import baseline_path, samples_path
from apd.uncertainty import scores as uncertainty_scores

log = logging.getLogger(__name__)

ATTACK_NAMES = ("fgsm", "pgd")
GRAY_BOX, WHITE_BOX = "gray-box", "white-box"
DETECTION_SCORES = ("entropy", "bald", "model_variance")  # the scores of the paper's adversarial study
ATTEMPT_BATCH = 1000  # validation inputs attacked per round, rounds going on until enough succeed
SCORING_CHUNK = 500  # inputs per prediction, so K members' probabilities take K × 500 × C floats
# Evaluate fields a stored set depends on (besides the sample, baseline and distill sections).
CRAFTING_FIELDS = ("adv_examples", "adv_whitebox_examples", "adv_eot_members", "fgsm_eps_grid", "pgd_eps",
                   "pgd_steps", "pgd_step_size", "mog_components", "mog_fit_samples")

Job = tuple[str, str, str]  # (setting, source, attack)


@dataclass(frozen=True)
class AdversarialSet:
    """The successful examples of one (setting, source, attack), on the CPU: inputs ``x_adv`` [n, F],
    true labels ``y`` [n], the ε each was crafted with [n], their validation rows ``index`` [n], and how
    many validation inputs were attacked to find them."""

    x_adv: Tensor
    y: Tensor
    eps: Tensor
    index: Tensor
    n_attempted: int

    def summary(self) -> dict[str, float | int | None]:
        """Size, inputs attacked, success rate and mean ε (None where undefined, so JSON stays valid)."""
        n = len(self.y)
        return {"examples": n, "attempted": self.n_attempted,
                "success_rate": n / self.n_attempted if self.n_attempted else None,
                "mean_eps": float(self.eps.mean()) if n else None}


def evaluate_adversarial(ctx: RunContext, methods: dict[str, Posterior]) -> dict:
    """Gray-box transfer and white-box detection tables (module docstring) for ``methods``.

    Returns ``{"adversarial": {source: {attack: {target: cell}}}, "adversarial_whitebox": {target:
    {attack: cell}}, "adversarial_meta": …}`` where a cell is ``{score: {"auroc": percent}, "accuracy":
    fraction}`` and the meta part gives each set's size, success rate and mean ε, the number of clean
    inputs and each target's ensemble size.
    """
    e = ctx.cfg.evaluate
    sources = [name for name in dict.fromkeys(e.adv_sources) if name in methods]
    settings = (GRAY_BOX, WHITE_BOX) if e.adv_whitebox else (GRAY_BOX,)
    jobs = [(setting, source, attack)
            for setting in settings for source in sources for attack in ATTACK_NAMES]
    sets = {job: adversarial_set(ctx, methods[job[1]], *job) for job in
            ctx.progress(jobs, desc="adversarial examples", unit="set")}
    usable = {job: s for job, s in sets.items() if len(s.y)}
    for job in (job for job in sets if job not in usable):
        log.warning("adversarial %s %s/%s: no attack succeeded; left out of the tables", *job)
    x_clean = clean_inputs(ctx, max((len(s.y) for s in usable.values()), default=0))
    gray: dict[str, dict[str, dict]] = {}
    white: dict[str, dict[str, dict]] = {}
    members = {}
    for target, method in ctx.progress(methods.items() if usable else (), desc="adversarial detection",
                                       unit="method"):
        members[target] = member_count(method, e.adv_samples)
        scored_sets = {job: s for job, s in usable.items() if job[0] == GRAY_BOX or job[1] == target}
        generator = torch.Generator().manual_seed(_seed(ctx, "target-members", target))
        cells = detection_cells(fixed_members(method, members[target], generator), x_clean, scored_sets)
        for (setting, source, attack), cell in cells.items():
            if setting == GRAY_BOX:
                gray.setdefault(source, {}).setdefault(attack, {})[target] = cell
            else:
                white.setdefault(target, {})[attack] = cell
    meta = {setting: {} for setting in settings}
    for (setting, source, attack), adversarial in sets.items():
        meta[setting].setdefault(source, {})[attack] = adversarial.summary()
    return {"adversarial": gray, "adversarial_whitebox": white,
            "adversarial_meta": {**meta, "clean_inputs": len(x_clean), "members": members}}


# ---------------------------------------------------------------------------------------------- crafting


def adversarial_path(ctx: RunContext, setting: str, source: str, attack: str) -> Path:
    """``artifacts/NAME/adversarial/SOURCE-ATTACK.h5`` (gray-box) or ``whitebox-SOURCE-ATTACK.h5``."""
    prefix = "" if setting == GRAY_BOX else "whitebox-"
    return ctx.out_dir / "adversarial" / f"{prefix}{source}-{attack}.h5"


def adversarial_set(ctx: RunContext, method: Posterior, setting: str, source: str,
                    attack: str) -> AdversarialSet:
    """The stored set of (setting, source, attack) when its attributes match this config, else a freshly
    crafted one, stored for the next run."""
    path = adversarial_path(ctx, setting, source, attack)
    attrs = {"config_hash": crafting_hash(ctx, setting, source, attack), "setting": setting, "source": source,
             "attack": attack}
    adversarial = load_set(path, attrs)
    verb = "reused"
    if adversarial is None:
        e, data = ctx.cfg.evaluate, ctx.data
        limit = e.adv_examples if setting == GRAY_BOX else min(e.adv_examples, e.adv_whitebox_examples)
        generator = torch.Generator().manual_seed(_seed(ctx, "val-order"))
        order = torch.randperm(len(data.y_val), generator=generator)
        attack_name, arguments = attack_arguments(e, setting, attack)
        with attacked_model(ctx, method, setting, source) as model_fn:
            adversarial = craft_successful(model_fn, data.x_val.to(ctx.device), data.y_val, order, limit,
                                           attack_name, arguments)
        save_set(path, adversarial, attrs)
        verb = "crafted"
    summary = adversarial.summary()
    mean_eps = "—" if summary["mean_eps"] is None else f"{summary['mean_eps']:.3f}"
    log.info("adversarial %s %s/%s: %s %d examples (%d attacked, mean ε %s) in %s", setting, source, attack,
             verb, summary["examples"], summary["attempted"], mean_eps, path)
    return adversarial


def attack_arguments(e: EvaluateConfig, setting: str, attack: str) -> tuple[str, dict]:
    """The :func:`apd.attacks.craft` attack and its arguments: PGD(ε, steps, step size) in both settings;
    FGSM with the smallest successful ε of the grid (gray-box) or at ε = ``pgd_eps`` (white-box)."""
    if attack == "pgd":
        return "pgd", {"eps": e.pgd_eps, "steps": e.pgd_steps, "step_size": e.pgd_step_size}
    if setting == GRAY_BOX:
        return "fgsm_min_eps", {"eps_grid": e.fgsm_eps_grid}
    return "fgsm", {"eps": e.pgd_eps}


@contextmanager
def attacked_model(ctx: RunContext, method: Posterior, setting: str, source: str) -> Iterator[ModelFn]:
    """The model function the attacker of (setting, source) differentiates, from a seeded draw:

    - gray-box: one weight sample θ ~ q, x ↦ f(x; θ); for MC dropout the net in train mode, each call
      a fresh mask;
    - white-box: the expected predictive over M = ``adv_eot_members`` members, log (1/M) Σ_m p(y | x, θ_m)
      (for MC dropout M fresh masks per call).

    MC dropout's masks come from the global torch RNG, seeded here inside :func:`torch.random.fork_rng`,
    and its module is put back into its former train/eval mode on exit.
    """
    members = 1 if setting == GRAY_BOX else ctx.cfg.evaluate.adv_eot_members
    seed = _seed(ctx, "attacked-model", setting, source)
    if isinstance(method, MCDropout):
        devices = [] if method.device.type == "cpu" else [method.device]
        with torch.random.fork_rng(devices=devices), _train_mode(method.module):
            torch.manual_seed(seed)
            yield module_fn(method.module) if members == 1 else dropout_predictive_fn(method.module, members)
    elif isinstance(method, WeightSpacePosterior):
        weights = method.sample_weights(member_count(method, members), torch.Generator().manual_seed(seed))
        yield (weight_sample_fn(method.spec, weights[0]) if members == 1
               else expected_predictive_fn(method.spec, weights))
    else:
        raise TypeError(f"cannot attack {type(method).__name__}: neither weight-space nor MC dropout")


def dropout_predictive_fn(module: nn.Module, passes: int) -> ModelFn:
    """Log of the MC-dropout predictive over T fresh masks (Gal & Ghahramani, 2016), as log-probabilities:

    log p̄(y | x) = logsumexp_t log_softmax(f(x; mask_t))_y − log T,

    the T passes run as one forward pass on T stacked copies of x (masks are drawn per element, so each
    copy gets its own). ``module`` must be in train mode for the masks to be active.
    """
    log_passes = math.log(passes)

    def model_fn(x: Tensor) -> Tensor:
        logits = module(x.repeat(passes, *([1] * (x.dim() - 1)))).view(passes, x.shape[0], -1)
        return torch.logsumexp(torch.log_softmax(logits, dim=-1), dim=0) - log_passes

    return model_fn


def craft_successful(model_fn: ModelFn, x_val: Tensor, y_val: Tensor, order: Tensor, limit: int,
                     attack_name: str, arguments: dict) -> AdversarialSet:
    """Attack the validation inputs in ``order``, :data:`ATTEMPT_BATCH` at a time, and keep the first
    ``limit`` successes (argmax model_fn(x_adv) ≠ y). ``n_attempted`` counts the inputs attacked up to
    the last one kept (all of them when fewer than ``limit`` succeed)."""
    labels = y_val.to(x_val.device)
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    kept = attempted = 0
    for start in range(0, len(order), ATTEMPT_BATCH):
        rows = order[start:start + ATTEMPT_BATCH]
        crafted = craft(attack_name, model_fn, x_val[rows], labels[rows], **arguments)
        hits = crafted.success.nonzero().flatten().cpu()[:limit - kept]
        parts.append((crafted.x_adv[hits].cpu(), crafted.eps_used[hits].cpu(), rows[hits]))
        kept += len(hits)
        attempted = start + (int(hits[-1]) + 1 if kept == limit else len(rows))
        if kept == limit:
            break
    x_adv, eps, index = (torch.cat(field) for field in zip(*parts, strict=True))
    return AdversarialSet(x_adv.float(), y_val[index].long(), eps.float(), index.long(), attempted)


def crafting_hash(ctx: RunContext, setting: str, source: str, attack: str) -> str:
    """What a stored set depends on, hashed (SHA-256, 16 hex digits): the seed and the data, net, SGLD,
    baseline and distillation sections, the attack fields of the evaluate section, the digest of the
    source's artifact manifest, and (setting, source, attack). Other evaluate fields (runs, ensemble
    sizes, OOD sets) leave the sets valid."""
    cfg = ctx.cfg
    identity = {"sections": [config_hash(cfg, "distill"), config_hash(cfg, "baselines")],
                "evaluate": {name: getattr(cfg.evaluate, name) for name in CRAFTING_FIELDS},
                "artifact": _artifact_digest(ctx, source), "job": [setting, source, attack]}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _artifact_digest(ctx: RunContext, source: str) -> str:
    """Digest of the manifest of the artifact ``source`` is built from ("" when there is none)."""
    artifacts = {"sgd": baseline_path(ctx, "sgd"), "mcdropout": baseline_path(ctx, "mcdropout"),
                 "sgld": samples_path(ctx), "mog": samples_path(ctx), "apd": generator_path(ctx)}
    manifest = manifest_path(artifacts[source]) if source in artifacts else None
    return manifest_digest(manifest) if manifest is not None and manifest.is_file() else ""


def load_set(path: Path, attrs: dict[str, str]) -> AdversarialSet | None:
    """The set stored at ``path`` if every attribute in ``attrs`` matches; None when absent, stale or
    unreadable (a warning says which)."""
    if not path.is_file():
        return None
    try:
        with h5py.File(path, "r") as fh:
            if any(fh.attrs.get(key) != value for key, value in attrs.items()):
                log.info("%s: made for another configuration; crafting again", path)
                return None
            fields = (torch.from_numpy(fh[name][()]) for name in ("x_adv", "y", "eps", "index"))
            return AdversarialSet(*fields, n_attempted=int(fh.attrs["n_attempted"]))
    except (OSError, KeyError) as exc:
        log.warning("%s: unreadable (%s); crafting again", path, exc)
        return None


def save_set(path: Path, adversarial: AdversarialSet, attrs: dict[str, str]) -> None:
    """Write ``adversarial`` with ``attrs`` and ``n_attempted`` to a temporary file, then rename it over
    ``path``, so an interrupted write never leaves a partial set under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with h5py.File(tmp, "w") as fh:
            fh["x_adv"] = adversarial.x_adv.numpy().astype("float32")
            fh["y"] = adversarial.y.numpy().astype("int64")
            fh["eps"] = adversarial.eps.numpy().astype("float32")
            fh["index"] = adversarial.index.numpy().astype("int64")
            fh.attrs.update({**attrs, "n_attempted": adversarial.n_attempted})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------- detection


def member_count(method: Posterior, k: int) -> int:
    """Members a method can give: one for a point estimate, at most the store's size for SGLD (drawn
    without replacement), else k."""
    if isinstance(method, PointEstimate):
        return 1
    if isinstance(method, SGLDSamples):
        return min(k, len(method.store))
    return k


def fixed_members(method: Posterior, k: int, generator: torch.Generator) -> Callable[[Tensor], Tensor]:
    """x ↦ p_k(y | x) [K, N, C] for one draw of k members that every call shares (weight-space methods
    draw their K weight vectors once); MC dropout draws fresh masks per call, which changes nothing
    since its masks are independent per input anyway."""
    if isinstance(method, WeightSpacePosterior):
        weights = method.sample_weights(k, generator)
        return lambda x: predict_probs(method.spec, weights, x)
    return lambda x: method.predict_probs(x, k, generator)


@torch.no_grad()
def ensemble_scores(members: Callable[[Tensor], Tensor], x: Tensor) -> dict[str, Tensor]:
    """The :data:`DETECTION_SCORES` of :func:`apd.uncertainty.scores` and the predictive's argmax
    (``prediction``) for every input, over :data:`SCORING_CHUNK` inputs at a time (on the CPU)."""
    parts = []
    for start in range(0, len(x), SCORING_CHUNK):
        probs = members(x[start:start + SCORING_CHUNK])
        scores = uncertainty_scores(probs)
        parts.append({**{name: scores[name].cpu() for name in DETECTION_SCORES},
                      "prediction": probs.mean(0).argmax(-1).cpu()})
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def detection_cells(members: Callable[[Tensor], Tensor], x_clean: Tensor,
                    sets: dict[Job, AdversarialSet]) -> dict[Job, dict]:
    """Per set: the detection AUROC (percent; adversarial positive) of each score, n clean inputs
    (the first n of ``x_clean``) against the set's n examples, and the accuracy of the predictive
    argmax on the examples. One call of ``members`` per chunk covers the clean and every set's inputs."""
    scored = ensemble_scores(members, torch.cat([x_clean, *(s.x_adv for s in sets.values())]))
    cells, offset = {}, len(x_clean)
    for job, adversarial in sets.items():
        n = len(adversarial.y)
        part = slice(offset, offset + n)
        offset += n
        cell: dict = {score: {"auroc": 100.0 * detection(scored[score][:min(n, len(x_clean))],
                                                         scored[score][part])["auroc"]}
                      for score in DETECTION_SCORES}
        cell["accuracy"] = (scored["prediction"][part] == adversarial.y).float().mean().item()
        cells[job] = cell
    return cells


def clean_inputs(ctx: RunContext, n: int) -> Tensor:
    """The clean side of detection: min(n, test size) test inputs in a seeded random order."""
    x_test = ctx.data.x_test
    order = torch.randperm(len(x_test), generator=torch.Generator().manual_seed(_seed(ctx, "clean")))
    return x_test[order[:n]]


# ------------------------------------------------------------------------------------------------ helpers


def _seed(ctx: RunContext, *parts: str) -> int:
    """A seed for one random choice, derived from the pipeline seed and a name (stable across runs,
    unlike Python's salted ``hash``)."""
    text = json.dumps([ctx.cfg.seed, *parts])
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


@contextmanager
def _train_mode(module: nn.Module) -> Iterator[None]:
    was_training = module.training
    module.train()
    try:
        yield
    finally:
        module.train(was_training)
