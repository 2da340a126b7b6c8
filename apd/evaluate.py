"""``apd evaluate``: compare SGD, MC dropout, SGLD, APD and a mixture of Gaussians on one protocol.

For each of R runs (fresh, seeded draws of every method's ensemble) the test set and the OOD sets are
scored in one batched prediction per method: accuracy, NLL, Brier and ECE on the whole test set;
detection (AUROC, AUPR-In, AUPR-Out, FPR95; OOD positive) of ``ood_size`` test images against as many
images of each OOD set, for every uncertainty score (higher = more uncertain). Results are mean ± std
over runs. Beyond the paper's tables: storage per method, a mixture-of-Gaussians growth table, and the
fidelity of each weight-space method to SGLD (per-weight spread, in-distribution BALD, distance to the
nearest SGLD sample against the distance between held-out SGLD samples), which accuracy alone hides.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import Tensor

from apd.artifacts import is_complete, load_torch, manifest_digest, manifest_path, write_json_atomic, write_manifest
from apd.config import config_hash
from apd.data import available_ood, ood_set
from apd.distill import generator_path
from apd.errors import ArtifactError, DataError
from apd.experiments.adversarial import evaluate_adversarial
from apd.metrics import accuracy, brier, detection, ece, mean_std, nll
from apd.nets import ParamSpec, mlp
from apd.posteriors import (
    APDGenerator,
    GaussianMixture,
    MCDropout,
    PointEstimate,
    Posterior,
    SGLDSamples,
    WeightSpacePosterior,
    parameters_in_samples,
)
from apd.report import run_report, write_report
from apd.runtime import RunContext
from apd.sampling import baseline_path, samples_path
from apd.store import SampleStore
from apd.uncertainty import scores as uncertainty_scores

log = logging.getLogger(__name__)

METHODS = ("sgd", "mcdropout", "sgld", "apd", "mog")
HEADLINE_SCORE = "bald"


def eval_dir(ctx: RunContext) -> Path:
    return ctx.out_dir / "eval"


def _require(path: Path, stage: str, ctx: RunContext) -> None:
    if not manifest_path(path).is_file():
        raise ArtifactError(f"{path}: missing or incomplete; run `apd {stage} --config {ctx.cfg.source}` first")


def load_methods(ctx: RunContext, stack: ExitStack) -> tuple[dict[str, Posterior], SampleStore]:
    """Every method's Posterior from the stage artifacts (the MoG is fit here, to SGLD samples)."""
    e, device = ctx.cfg.evaluate, ctx.device
    spec = ParamSpec.from_module(mlp(ctx.net_sizes))
    for path, stage in ((baseline_path(ctx, "sgd"), "sample"), (baseline_path(ctx, "mcdropout"), "sample"),
                        (samples_path(ctx), "sample"), (generator_path(ctx), "distill")):
        _require(path, stage, ctx)
    sgd = mlp(ctx.net_sizes)
    dropout = mlp(ctx.net_sizes, dropout=ctx.cfg.baselines.dropout)
    for net, name in ((sgd, "sgd"), (dropout, "mcdropout")):
        try:
            net.load_state_dict(load_torch(baseline_path(ctx, name)))
        except RuntimeError:
            raise ArtifactError(f"{baseline_path(ctx, name)}: does not fit the {ctx.net_sizes} network; "
                                "run `apd sample --force`") from None
    store = stack.enter_context(SampleStore.open(samples_path(ctx), expect_spec=spec))
    if len(store) < e.sgld_samples:
        raise ArtifactError(f"{samples_path(ctx)}: {len(store)} samples, evaluation draws {e.sgld_samples}")
    methods: dict[str, Posterior] = {
        "sgd": PointEstimate(sgd.to(device).eval()),
        "mcdropout": MCDropout(dropout.to(device)),
        "sgld": SGLDSamples(store, device),
        "apd": APDGenerator.load(generator_path(ctx), expect_spec=spec, device=device),
    }
    mog_k = max(e.mog_components)
    methods["mog"] = fit_mixture(store, mog_k, e.mog_fit_samples, ctx.cfg.seed, device)
    return methods, store


def fit_mixture(store: SampleStore, components: int, fit_samples: int, seed: int,
                device: torch.device) -> GaussianMixture:
    """MoG with ``components`` diagonal components fit to the last ``fit_samples`` SGLD samples."""
    n = min(len(store), fit_samples)
    if components > n:
        raise ArtifactError(f"a {components}-component mixture needs at least as many samples, the store has {n}")
    samples = store.read_all(len(store) - n, len(store))
    return GaussianMixture(samples, components, seed=seed, device=device, spec=store.spec)


def ensemble_sizes(ctx: RunContext) -> dict[str, int]:
    e = ctx.cfg.evaluate
    return {"sgd": 1, "mcdropout": e.mc_passes, "sgld": e.sgld_samples, "apd": e.networks, "mog": e.networks}


def ood_inputs(ctx: RunContext) -> tuple[Tensor, dict[str, Tensor]]:
    """The in-distribution test subset and each configured OOD set (scaled as configured)."""
    cfg, data = ctx.cfg, ctx.data
    e = cfg.evaluate
    n = min(e.ood_size, len(data.y_test))
    keep = torch.randperm(len(data.y_test), generator=torch.Generator().manual_seed(cfg.seed + 21))[:n]
    available = available_ood(cfg.data, data)
    sets = {}
    for name in cfg.data.ood:
        if name not in available:
            log.warning("skipping OOD set %r: not available here (%s)", name, ", ".join(available))
            continue
        sets[name] = ood_set(name, data, n, cfg.seed, cfg.data.ood_dirs) * e.ood_scale
    if not sets:
        raise DataError(f"none of the configured OOD sets ({', '.join(cfg.data.ood)}) is available")
    return data.x_test[keep], sets


def run_evaluate(ctx: RunContext) -> dict:
    cfg = ctx.cfg
    out = eval_dir(ctx)
    stage_hash = config_hash(cfg, "evaluate")
    inputs = {name: manifest_digest(manifest_path(path)) for name, path in (
        ("samples", samples_path(ctx)), ("sgd", baseline_path(ctx, "sgd")),
        ("mcdropout", baseline_path(ctx, "mcdropout")), ("generator", generator_path(ctx)))
        if manifest_path(path).is_file()}
    if not ctx.force and is_complete(out / "evaluate.json", stage_hash, inputs):
        log.info("reusing %s (--force to redo)", out / "results.json")
        run_report(ctx)
        return {}
    (out / "evaluate.json").unlink(missing_ok=True)
    started = time.perf_counter()
    with ExitStack() as stack:
        methods, store = load_methods(ctx, stack)
        results = evaluate_methods(ctx, methods, store)
        if cfg.evaluate.adversarial:
            t0 = time.perf_counter()
            results.update(evaluate_adversarial(ctx, methods))
            results["timing"]["adversarial"] = round(time.perf_counter() - t0, 2)
    results["timing"]["total"] = round(time.perf_counter() - started, 2)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", results)
    generator_json = manifest_path(generator_path(ctx))
    text = write_report(out, results, generator_json if generator_json.is_file() else None)
    write_manifest(out / "evaluate.json", "evaluate", stage_hash, inputs, seconds=results["timing"]["total"])
    print(text)
    return results


def evaluate_methods(ctx: RunContext, methods: dict[str, Posterior], store: SampleStore) -> dict:
    """Accuracy, OOD detection, storage, MoG growth and fidelity for ``methods`` (see module docstring)."""
    cfg, e, data, device = ctx.cfg, ctx.cfg.evaluate, ctx.data, ctx.device
    x_in, ood = ood_inputs(ctx)
    x_all = torch.cat([data.x_test, x_in, *ood.values()]).to(device)
    y_test = data.y_test.to(device)
    n_test, n_in = len(data.y_test), len(x_in)
    sizes = ensemble_sizes(ctx)
    generator = torch.Generator().manual_seed(cfg.seed + 31)
    per_run: dict[str, dict[str, list]] = {m: {"acc": [], "nll": [], "brier": [], "ece": []} for m in methods}
    detections: dict = {s: {sc: {m: [] for m in methods} for sc in e.scores} for s in ood}
    timing: dict[str, float] = {m: 0.0 for m in methods}
    eval_dir(ctx).mkdir(parents=True, exist_ok=True)
    scores_file = h5py.File(eval_dir(ctx) / "scores.h5.tmp", "w")
    bar = ctx.progress(total=e.runs * len(methods), desc="evaluate", unit="draw")
    with bar, scores_file:
        scores_file["test_labels"] = data.y_test.numpy()
        for run in range(e.runs):
            for name, method in methods.items():
                t0 = time.perf_counter()
                probs = method.predict_probs(x_all, sizes[name], generator=generator)
                timing[name] += time.perf_counter() - t0
                test_probs = probs[:, :n_test].mean(0)
                for metric, fn in (("acc", accuracy), ("nll", nll), ("brier", brier), ("ece", ece)):
                    per_run[name][metric].append(fn(test_probs, y_test))
                member_scores = uncertainty_scores(probs[:, n_test:])
                for score in e.scores:
                    values = member_scores[score].cpu().numpy()
                    inside = values[:n_in]
                    for index, set_name in enumerate(ood):
                        outside = values[n_in * (index + 1):n_in * (index + 2)]
                        detections[set_name][score][name].append(detection(inside, outside))
                        if run == 0:
                            scores_file[f"{name}/out/{set_name}/{score}"] = outside
                    if run == 0:
                        scores_file[f"{name}/in/{score}"] = inside
                if run == 0:
                    scores_file[f"{name}/test_probs"] = test_probs.cpu().numpy()
                bar.update()
        scores_file["sgld_first_layer"] = _first_layer_images(store, data.image_shape)
    eval_dir(ctx).joinpath("scores.h5.tmp").replace(eval_dir(ctx) / "scores.h5")
    results = {
        "pipeline": cfg.name, "config_hash": config_hash(cfg, "evaluate"), "dataset": data.name,
        "sizes": data.sizes(), "device": str(device), "runs": e.runs, "ensemble": sizes,
        "methods": list(methods),
        "accuracy": {m: {k: mean_std(v) for k, v in runs.items()} for m, runs in per_run.items()},
        "ood": {s: {sc: {m: _summarise_detection(runs) for m, runs in by_m.items()} for sc, by_m in by_sc.items()}
                for s, by_sc in detections.items()},
        "ood_meta": {"n_in": n_in, "n_out": n_in, "ratio_in_out": "1:1", "scale": e.ood_scale},
        "storage": {m: _storage(ctx, m, method, store) for m, method in methods.items()},
        "timing": {m: round(t, 2) for m, t in timing.items()},
    }
    t0 = time.perf_counter()
    results["fidelity"] = {m: fidelity(methods[m], methods["sgld"], data.x_test.to(device), e.networks, cfg.seed)
                           for m in ("apd", "mog") if m in methods}
    results["mog"], results["apd_share"] = mixture_growth(ctx, methods, store, x_in, ood, results)
    results["timing"]["mog_growth_and_fidelity"] = round(time.perf_counter() - t0, 2)
    return results


def _summarise_detection(runs: list[dict]) -> dict:
    return {key: mean_std([100.0 * r[key] for r in runs]) for key in ("auroc", "aupr_in", "aupr_out", "fpr95")}


def _storage(ctx: RunContext, name: str, method: Posterior, store: SampleStore) -> dict:
    parameters = method.stored_parameters()
    files = {"sgd": baseline_path(ctx, "sgd"), "mcdropout": baseline_path(ctx, "mcdropout"),
             "sgld": store.path, "apd": generator_path(ctx)}
    size = files[name].stat().st_size if name in files else 4 * parameters
    return {"parameters": int(parameters), "bytes": int(size),
            "in_sgld_samples": round(parameters_in_samples(method), 3)}


def _first_layer_images(store: SampleStore, shape: tuple[int, int], count: int = 16) -> np.ndarray:
    """The first ``count`` hidden units' input weights of the last SGLD sample, as images."""
    first = store.spec.unflatten(store.read([len(store) - 1])[0])[store.spec.names[0]]
    return first[:count].reshape(-1, *shape).numpy()


@torch.no_grad()
def fidelity(method: WeightSpacePosterior, sgld: SGLDSamples, x_test: Tensor, k: int, seed: int) -> dict:
    """How closely a weight-space method matches SGLD beyond accuracy (k draws of each):

    - ``weight_std_ratio``: median over weights of std_method / std_SGLD;
    - ``bald_ratio``: mean test-set BALD of the method's ensemble over SGLD's;
    - ``nn_distance``: mean Euclidean distance from a generated vector to its nearest SGLD sample
      (k reference samples), against ``heldout_nn_distance``, the same for k other SGLD samples;
      ``nn_ratio`` = their quotient (≪ 1 suggests memorised samples, ≫ 1 vectors off the posterior).
    """
    generator = torch.Generator().manual_seed(seed + 41)
    reference = sgld.sample_weights(2 * k, generator)
    reference, heldout = reference[:k], reference[k:]
    generated = method.sample_weights(k, generator).to(reference.device)
    std_ratio = (generated.std(0) / reference.std(0).clamp_min(1e-12)).median().item()
    bald_method = uncertainty_scores(method.predict_probs(x_test, k, generator))["bald"].mean().item()
    bald_sgld = uncertainty_scores(sgld.predict_probs(x_test, k, generator))["bald"].mean().item()
    nn_generated = torch.cdist(generated, reference).min(1).values.mean().item()
    nn_heldout = torch.cdist(heldout, reference).min(1).values.mean().item()
    return {"weight_std_ratio": std_ratio, "bald_ratio": bald_method / bald_sgld, "nn_distance": nn_generated,
            "heldout_nn_distance": nn_heldout, "nn_ratio": nn_generated / nn_heldout}


def _share(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def mixture_growth(ctx: RunContext, methods: dict[str, Posterior], store: SampleStore, x_in: Tensor,
                   ood: dict[str, Tensor], results: dict) -> tuple[list[dict], dict]:
    """MoG with a growing number of components: its storage and its accuracy and mean BALD AUROC as a
    share of SGLD's (one draw of ``networks`` each), and APD's on the same footing."""
    cfg, e, device = ctx.cfg, ctx.cfg.evaluate, ctx.device
    sgld_acc = results["accuracy"]["sgld"]["acc"]["mean"]
    sgld_auroc = _mean_auroc(results, "sgld")
    rows = []
    for k in ctx.progress(e.mog_components, desc="MoG growth", unit="fit"):
        mixture = methods["mog"] if k == max(e.mog_components) else fit_mixture(
            store, k, e.mog_fit_samples, cfg.seed, device)
        acc, auroc = _accuracy_and_bald_auroc(ctx, mixture, x_in, ood)
        rows.append({"components": k, "parameters": mixture.stored_parameters(),
                     "in_sgld_samples": round(parameters_in_samples(mixture), 3), "accuracy": acc,
                     "accuracy_share": _share(acc, sgld_acc), "bald_auroc": auroc,
                     "bald_auroc_share": _share(auroc, sgld_auroc)})
    apd = methods["apd"]
    apd_acc = results["accuracy"]["apd"]["acc"]["mean"]
    apd_share = {"parameters": apd.stored_parameters(), "in_sgld_samples": round(parameters_in_samples(apd), 3),
                 "accuracy_share": _share(apd_acc, sgld_acc),
                 "bald_auroc_share": _share(_mean_auroc(results, "apd"), sgld_auroc)}
    return rows, apd_share


def _mean_auroc(results: dict, method: str, score: str = HEADLINE_SCORE) -> float:
    values = [by_score[score][method]["auroc"]["mean"] for by_score in results["ood"].values()
              if score in by_score]
    return float(np.mean(values)) if values else float("nan")


def _accuracy_and_bald_auroc(ctx: RunContext, method: Posterior, x_in: Tensor,
                             ood: dict[str, Tensor]) -> tuple[float, float]:
    e, data = ctx.cfg.evaluate, ctx.data
    generator = torch.Generator().manual_seed(ctx.cfg.seed + 51)
    x = torch.cat([data.x_test, x_in, *ood.values()]).to(ctx.device)
    probs = method.predict_probs(x, e.networks, generator)
    n_test, n_in = len(data.y_test), len(x_in)
    acc = accuracy(probs[:, :n_test].mean(0), data.y_test.to(ctx.device))
    bald = uncertainty_scores(probs[:, n_test:])["bald"].cpu().numpy()
    aurocs = [100.0 * detection(bald[:n_in], bald[n_in * (i + 1):n_in * (i + 2)])["auroc"] for i in range(len(ood))]
    return acc, float(np.mean(aurocs))
