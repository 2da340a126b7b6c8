"""Adversarial-example detection: the protocol of Wang et al. (ICML 2018), plus a white-box variant.

**Gray-box** (the paper's): for each source method the attacker sees one member only — one weight
sample θ ~ q (SGLD, APD, MoG, the SGD net, or MC dropout with one dropout mask fixed for the whole
attack). Two attacks are crafted on it from the validation split, each input visited once in a seeded
order until ``examples`` of them succeed. An attack succeeds only on an input the member classified
correctly before the attack and misclassifies after it; the member's clean accuracy on the attacked
inputs and the success rate among the correctly classified ones are reported:

- FGSM with, per example, the smallest ε of ``fgsm_eps_grid`` that succeeds (the reference code's
  search);
- PGD, ``pgd_steps`` signed-gradient steps of ``pgd_step_size`` inside the L∞ ball of ``pgd_eps``,
  no random start (Madry et al. 2018).

Every method (the target) then scores the successful examples (a predictive-only method, without
weights, is a target but never a source) and as many clean test inputs with an
ensemble of ``samples`` members (one draw per target, shared by all its inputs): the detection
AUROC of predictive entropy, BALD and model variance (adversarial positive) and the ensemble's
accuracy on the adversarial inputs — the source × target transfer table of the paper.

**White-box** (``whitebox``): each source is also attacked through its own expected predictive
p̄(y | x) = (1/M) Σ_m p(y | x, θ_m) over ``eot_members`` fixed members (expectation over
transformation, Athalye et al. 2018), with PGD and with FGSM at ε = ``pgd_eps``, and scored by that
method alone.

Crafted sets are stored in ``artifacts/NAME/adversarial/`` (HDF5, written to a temporary name and
renamed) and reused while the config sections and the source's artifact they depend on are unchanged.
Every random choice draws from a named stream of the pipeline seed (:mod:`apd.pipeline.seeds`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import torch
from torch import Tensor

from apd.config import AdversarialConfig, config_hash
from apd.evaluation.attacks import ModelFn, craft, expected_predictive_fn, weight_sample_fn
from apd.io import hdf5_atomic
from apd.metrics import detection
from apd.pipeline.layout import manifest_of
from apd.pipeline.manifests import manifest_digest
from apd.pipeline.methods import METHODS
from apd.pipeline.runtime import RunContext
from apd.posteriors import Posterior
from apd.uncertainty import ENSEMBLE_SCORES
from apd.uncertainty import scores as uncertainty_scores

log = logging.getLogger(__name__)

ATTACK_NAMES = ("fgsm", "pgd")
GRAY_BOX, WHITE_BOX = "gray-box", "white-box"
DETECTION_SCORES = ("entropy", "bald", "model_variance")  # the scores of the paper's adversarial study
ATTEMPT_BATCH = 1000  # validation inputs attacked per round, rounds going on until enough succeed
SCORING_CHUNK = 500  # inputs per prediction, so K members' probabilities take K × 500 × C floats
# Evaluate fields a stored set depends on (besides the sample, baseline and distill sections).
CRAFTING_FIELDS = ("examples", "whitebox_examples", "eot_members", "fgsm_eps_grid", "pgd_eps", "pgd_steps",
                   "pgd_step_size")

Job = tuple[str, str, str]  # (setting, source, attack)


@dataclass(frozen=True)
class AdversarialSet:
    """The successful examples of one (setting, source, attack), on the CPU: inputs ``x_adv`` [n, F],
    true labels ``y`` [n], the ε each was crafted with [n], their validation rows ``index`` [n], how
    many validation inputs were attacked to find them, and how many of those the source classified
    correctly before the attack."""

    x_adv: Tensor
    y: Tensor
    eps: Tensor
    index: Tensor
    n_attempted: int
    n_clean_correct: int

    def summary(self) -> dict[str, float | int | None]:
        """Size, inputs attacked, the source's clean accuracy on them, the success rate among the
        correctly classified ones and mean ε (None where undefined, so JSON stays valid)."""
        n = len(self.y)
        return {"examples": n, "attempted": self.n_attempted,
                "clean_accuracy": self.n_clean_correct / self.n_attempted if self.n_attempted else None,
                "success_rate": n / self.n_clean_correct if self.n_clean_correct else None,
                "mean_eps": float(self.eps.mean()) if n else None}


def evaluate_adversarial(ctx: RunContext, methods: dict[str, Posterior]) -> dict:
    """Gray-box transfer and white-box detection tables (module docstring) for ``methods``.

    Returns ``{"adversarial": {source: {attack: {target: cell}}}, "adversarial_whitebox": {target:
    {attack: cell}}, "adversarial_meta": …}`` where a cell is ``{score: {"auroc": percent}, "accuracy":
    fraction}`` and the meta part gives each set's size, success rate and mean ε, the number of clean
    inputs and each target's ensemble size.
    """
    a = ctx.cfg.evaluate.adversarial
    sources = [name for name in dict.fromkeys(a.sources) if name in methods and methods[name].has_weights]
    for name in dict.fromkeys(a.sources):
        if name in methods and not methods[name].has_weights:
            log.warning("adversarial: %s has no weights to attack; it is scored as a target only", name)
    settings = (GRAY_BOX, WHITE_BOX) if a.whitebox else (GRAY_BOX,)
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
        members[target] = method.ensemble_size(a.samples)
        scored_sets = {job: s for job, s in usable.items() if job[0] == GRAY_BOX or job[1] == target}
        generator = torch.Generator().manual_seed(ctx.seed("attack", "target-members", target))
        cells = detection_cells(method.members(members[target], generator), x_clean, scored_sets,
                                single=members[target] == 1)
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


def adversarial_set(ctx: RunContext, method: Posterior, setting: str, source: str,
                    attack: str) -> AdversarialSet:
    """The stored set of (setting, source, attack) when its attributes match this config, else a freshly
    crafted one, stored for the next run."""
    path = ctx.layout.adversarial_set(setting == WHITE_BOX, source, attack)
    attrs = {"config_hash": crafting_hash(ctx, setting, source, attack), "setting": setting, "source": source,
             "attack": attack}
    adversarial = load_set(path, attrs)
    verb = "reused"
    if adversarial is None:
        a, data = ctx.cfg.evaluate.adversarial, ctx.data
        limit = a.examples if setting == GRAY_BOX else min(a.examples, a.whitebox_examples)
        generator = torch.Generator().manual_seed(ctx.seed("attack", "val-order"))
        order = torch.randperm(len(data.y_val), generator=generator)
        attack_name, arguments = attack_arguments(a, setting, attack)
        model_fn = attacked_model(ctx, method, setting, source)
        adversarial = craft_successful(model_fn, data.x_val.to(ctx.device), data.y_val, order, limit,
                                       attack_name, arguments)
        save_set(path, adversarial, attrs)
        verb = "crafted"
    summary = adversarial.summary()
    mean_eps = "—" if summary["mean_eps"] is None else f"{summary['mean_eps']:.3f}"
    log.info("adversarial %s %s/%s: %s %d examples (%d attacked, %d classified correctly, mean ε %s) in %s",
             setting, source, attack, verb, summary["examples"], summary["attempted"], adversarial.n_clean_correct,
             mean_eps, path)
    return adversarial


def attack_arguments(e: AdversarialConfig, setting: str, attack: str) -> tuple[str, dict]:
    """The :func:`apd.evaluation.attacks.craft` attack and its arguments: PGD(ε, steps, step size) in both settings;
    FGSM with the smallest successful ε of the grid (gray-box) or at ε = ``pgd_eps`` (white-box)."""
    if attack == "pgd":
        return "pgd", {"eps": e.pgd_eps, "steps": e.pgd_steps, "step_size": e.pgd_step_size}
    if setting == GRAY_BOX:
        return "fgsm_min_eps", {"eps_grid": e.fgsm_eps_grid}
    return "fgsm", {"eps": e.pgd_eps}


def attacked_model(ctx: RunContext, method: Posterior, setting: str, source: str) -> ModelFn:
    """The model function the attacker of (setting, source) differentiates, from a seeded draw:

    - gray-box: one fixed member θ ~ q, x ↦ f(x; θ);
    - white-box: the expected predictive over M = ``eot_members`` fixed members,
      log (1/M) Σ_m p(y | x, θ_m).
    """
    members = 1 if setting == GRAY_BOX else ctx.cfg.evaluate.adversarial.eot_members
    generator = torch.Generator().manual_seed(ctx.seed("attack", "attacked-model", setting, source))
    weights = method.sample_weights(method.ensemble_size(members), generator)
    return weight_sample_fn(method.spec, weights[0]) if members == 1 else expected_predictive_fn(method.spec, weights)


def craft_successful(model_fn: ModelFn, x_val: Tensor, y_val: Tensor, order: Tensor, limit: int,
                     attack_name: str, arguments: dict) -> AdversarialSet:
    """Attack the validation inputs in ``order``, :data:`ATTEMPT_BATCH` at a time, and keep the first
    ``limit`` successes (argmax model_fn(x_adv) ≠ y). ``n_attempted`` counts the inputs attacked up to
    the last one kept (all of them when fewer than ``limit`` succeed)."""
    labels = y_val.to(x_val.device)
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    kept = attempted = correct = 0
    for start in range(0, len(order), ATTEMPT_BATCH):
        rows = order[start:start + ATTEMPT_BATCH]
        crafted = craft(attack_name, model_fn, x_val[rows], labels[rows], **arguments)
        hits = crafted.success.nonzero().flatten().cpu()[:limit - kept]
        parts.append((crafted.x_adv[hits].cpu(), crafted.eps_used[hits].cpu(), rows[hits]))
        kept += len(hits)
        seen = int(hits[-1]) + 1 if kept == limit else len(rows)
        attempted = start + seen
        correct += int(crafted.clean_correct[:seen].sum())
        if kept == limit:
            break
    x_adv, eps, index = (torch.cat(field) for field in zip(*parts, strict=True))
    return AdversarialSet(x_adv.float(), y_val[index].long(), eps.float(), index.long(), attempted, correct)


def crafting_hash(ctx: RunContext, setting: str, source: str, attack: str) -> str:
    """What a stored set depends on, hashed (SHA-256, 16 hex digits): the seed and the data, net, SGLD,
    baseline and distillation sections, the attack fields of the evaluate section, the digest of the
    source's artifact manifest, the evaluate fields the peers fit at evaluation time depend on (Stein's
    candidates, Laplace's NLL tolerance), and (setting, source, attack). Other evaluate fields (runs,
    ensemble sizes, OOD sets) leave the sets valid."""
    cfg = ctx.cfg
    identity = {"sections": [config_hash(cfg, "distill"), config_hash(cfg, "baselines")],
                "adversarial": {name: getattr(cfg.evaluate.adversarial, name) for name in CRAFTING_FIELDS},
                "mog": [cfg.evaluate.mog_components, cfg.evaluate.mog_fit_samples],
                "peers": [cfg.evaluate.stein_candidates, cfg.evaluate.laplace_nll_tolerance],
                "artifact": _artifact_digest(ctx, source), "job": [setting, source, attack]}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _artifact_digest(ctx: RunContext, source: str) -> str:
    """Digest of the manifest of the artifact ``source`` is built from ("" when there is none)."""
    manifest = manifest_of(METHODS[source].artifact(ctx.layout)) if source in METHODS else None
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
            return AdversarialSet(*fields, n_attempted=int(fh.attrs["n_attempted"]),
                                  n_clean_correct=int(fh.attrs["n_clean_correct"]))
    except (OSError, KeyError) as exc:
        log.warning("%s: unreadable (%s); crafting again", path, exc)
        return None


def save_set(path: Path, adversarial: AdversarialSet, attrs: dict[str, str]) -> None:
    """Write ``adversarial`` with ``attrs`` and ``n_attempted`` to a temporary file, then rename it over
    ``path``, so an interrupted write never leaves a partial set under the real name."""
    with hdf5_atomic(path) as fh:
        fh["x_adv"] = adversarial.x_adv.numpy().astype("float32")
        fh["y"] = adversarial.y.numpy().astype("int64")
        fh["eps"] = adversarial.eps.numpy().astype("float32")
        fh["index"] = adversarial.index.numpy().astype("int64")
        fh.attrs.update({**attrs, "n_attempted": adversarial.n_attempted,
                         "n_clean_correct": adversarial.n_clean_correct})


# --------------------------------------------------------------------------------------------- detection


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


def detection_cells(members: Callable[[Tensor], Tensor], x_clean: Tensor, sets: dict[Job, AdversarialSet],
                    single: bool = False) -> dict[Job, dict]:
    """Per set: the detection AUROC (percent; adversarial positive) of each score, n clean inputs
    (the first n of ``x_clean``) against the set's n examples, and the accuracy of the predictive
    argmax on the examples. One call of ``members`` per chunk covers the clean and every set's inputs.
    A ``single`` network has no disagreement between members: its ensemble-only scores are None (n/a)."""
    scored = ensemble_scores(members, torch.cat([x_clean, *(s.x_adv for s in sets.values())]))
    cells, offset = {}, len(x_clean)
    for job, adversarial in sets.items():
        n = len(adversarial.y)
        part = slice(offset, offset + n)
        offset += n
        cell: dict = {score: None if single and score in ENSEMBLE_SCORES else
                      {"auroc": 100.0 * detection(scored[score][:min(n, len(x_clean))], scored[score][part])["auroc"]}
                      for score in DETECTION_SCORES}
        cell["accuracy"] = (scored["prediction"][part] == adversarial.y).float().mean().item()
        cells[job] = cell
    return cells


def clean_inputs(ctx: RunContext, n: int) -> Tensor:
    """The clean side of detection: min(n, test size) test inputs in a seeded random order."""
    x_test = ctx.data.x_test
    order = torch.randperm(len(x_test), generator=torch.Generator().manual_seed(ctx.seed("attack", "clean")))
    return x_test[order[:n]]
