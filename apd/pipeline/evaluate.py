"""``apd evaluate``: compare every configured method (:mod:`apd.pipeline.methods`) on one protocol.

For each of R runs (fresh, seeded draws of every method's ensemble) the test set and the OOD sets are
scored in one batched prediction per method (:mod:`apd.evaluation.protocol`): accuracy, NLL, Brier and
ECE on the whole test set; detection (AUROC, AUPR-In, AUPR-Out, FPR95; OOD positive) of ``ood_size``
test images against as many images of each OOD set, for every uncertainty score (higher = more
uncertain; scores a single network cannot have are null). Results are mean ± std over runs (population
std, ddof 0). Beyond the paper's tables: storage per method, the fidelity of each weight-space method to SGLD,
which accuracy alone hides, and with ``mog_growth`` a mixture-of-Gaussians growth table; with ``[distill] seeds`` > 1,
every generator seed of APD judged alike (:mod:`apd.pipeline.replicates`; the main tables show seed 0);
with two chains or more, whether SGLD's reference numbers are settled (``reference_stability``: split halves
of its chains and jackknife errors, :mod:`apd.evaluation.stability`).

Everything is built in ``eval.partial/`` and swapped in for ``eval/`` when complete; the yardstick's kept sets,
each as soon as it is judged, wait in ``eval.kept.partial/`` until then, so that a run after an interrupt takes
them (:mod:`apd.pipeline.finished_parts`).
"""

from __future__ import annotations

import functools
import logging
import time
from contextlib import ExitStack

import numpy as np
import torch
from torch import Tensor

from apd.config import config_hash
from apd.errors import ArtifactError
from apd.evaluation.fidelity import bald_ratio, weight_fidelity
from apd.evaluation.kept_storage import AroundChainMeans, KeptStorage, kept_for, storage_key
from apd.evaluation.protocol import EvaluationInputs, Judgement, judge
from apd.evaluation.stability import ChainSums, reference_stability
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import (
    GAP_KEYS,
    Reference,
    curve_sizes,
    drawn_quality,
    kept_samples,
    reference_predictive,
    reference_sums,
    summarise,
)
from apd.io import hdf5_atomic, read_json, remove_tree, replace_directory, restore_directory, write_json_atomic
from apd.methods import MethodName
from apd.metrics import mean_of, mean_std
from apd.pipeline.adversarial import evaluate_adversarial
from apd.pipeline.finished_parts import FinishedParts, run_parts, taken_or_made
from apd.pipeline.layout import manifest_of
from apd.pipeline.manifests import file_digest, is_complete, manifest_record, write_manifest
from apd.pipeline.methods import METHODS, ensemble_sizes, fit_mixture, load_methods, method_inputs
from apd.pipeline.recipes import evaluation_inputs, store_alignment
from apd.pipeline.replicates import replicate_apd
from apd.pipeline.report import print_summary, report_again, write_report
from apd.pipeline.results import accuracy, mean_auroc, set_aurocs
from apd.pipeline.runtime import RunContext, machine, stopwatch, torch_threads
from apd.pipeline.sample_publish import stored_burn_in
from apd.posteriors import Posterior, SGLDSamples
from apd.samplers.store import SampleStore
from apd.uncertainty import bald

log = logging.getLogger(__name__)

HEADLINE_SCORE = "bald"
RECORDED_FILES = ("results.json", "scores.h5")  # eval/ files whose digests the manifest records (the rest
# are rendered from them)
MIXTURE_DRAWS = 3  # fresh ensemble draws per row of the mixture-growth table, for its spread


def run_evaluate(ctx: RunContext) -> dict:
    cfg, layout = ctx.cfg, ctx.layout
    stage_hash = config_hash(cfg, "evaluate")
    restore_directory(layout.eval_dir)
    if not ctx.force and is_complete(layout.evaluate_manifest, stage_hash, method_inputs(ctx)):
        log.info("reusing %s (--force to redo)", layout.results)
        # figures already drawn from these results stay as they are (`apd report` draws them again)
        draw = cfg.evaluate.figures and not (layout.eval_dir / "figures").is_dir()
        print_summary(ctx, report_again(ctx, draw)[0])
        return {}
    if layout.eval_dir.is_symlink():
        raise ArtifactError(f"{layout.eval_dir}: a symbolic link; `apd evaluate` replaces this folder whole, so it "
                            "must be a folder of its own (put what the link points to in its place)")
    started = time.perf_counter()
    with ExitStack() as stack:
        stack.enter_context(torch_threads(cfg.evaluate.threads))
        details: dict[str, dict] = {}
        loading: dict[str, float] = {}
        methods, inputs = load_methods(ctx, stack, details, loading)
        built = layout.eval_dir.with_name("eval.partial")
        remove_tree(built)
        built.mkdir(parents=True)
        finished = run_parts(ctx, layout.eval_dir.with_name("eval.kept.partial"),
                             {"stage": stage_hash, "inputs": inputs})
        results = evaluate_methods(ctx, methods, stack, built, finished)
        results["peers"] = details
        results["timing"]["loading"] = loading  # per method: reading or fitting it (Laplace, MoG, Stein)
        if cfg.evaluate.adversarial.enabled:
            t0 = time.perf_counter()
            results.update(evaluate_adversarial(ctx, methods))
            results["timing"]["adversarial"] = round(time.perf_counter() - t0, 2)
    results["timing"]["total"] = round(time.perf_counter() - started, 2)
    write_json_atomic(built / "results.json", results)
    results = read_json(built / "results.json")  # tables from what results.json holds, as `apd report` makes them
    generator_json = layout.generator.with_suffix(".json")
    write_report(built, results, generator_json if generator_json.is_file() else None, cfg.evaluate.figures)
    digests = {name: file_digest(built / name) for name in RECORDED_FILES}
    write_manifest(built / layout.evaluate_manifest.name,
                   {**manifest_record("evaluate", stage_hash, inputs, seconds=results["timing"]["total"]),
                    "files": digests})
    replace_directory(built, layout.eval_dir)
    finished.remove()
    print_summary(ctx, results)
    return results


def evaluate_methods(ctx: RunContext, methods: dict[str, Posterior], stack: ExitStack, out,
                     finished: FinishedParts | None = None) -> dict:
    """Accuracy, OOD detection, storage, fidelity and (``mog_growth``) MoG growth for ``methods`` (module
    docstring); the yardstick's kept sets an interrupted run finished are taken from ``finished``."""
    cfg, e, data, device = ctx.cfg, ctx.cfg.evaluate, ctx.data, ctx.device
    inputs = evaluation_inputs(ctx)
    stored = stored_predictions(ctx, methods, inputs)
    sizes = ensemble_sizes(ctx, methods)
    # one stream per method: a method's draws do not depend on which other methods are compared
    generators = {name: torch.Generator().manual_seed(ctx.seed("evaluate", "draws", name)) for name in methods}
    judgements: dict[str, list[Judgement]] = {m: [] for m in methods}
    timing: dict[str, float] = {m: 0.0 for m in methods}
    scores_file = stack.enter_context(hdf5_atomic(out / "scores.h5"))
    scores_file["test_labels"] = data.y_test.numpy()
    bar = stack.enter_context(ctx.progress(total=e.runs * len(methods), desc="evaluate", unit="draw"))
    for _ in range(e.runs):
        for name, method in methods.items():
            t0 = time.perf_counter()
            judgements[name].append(judge(method, inputs, sizes[name], generators[name], e.scores, stored))
            timing[name] += time.perf_counter() - t0
            bar.update()
    for name, runs in judgements.items():
        first = runs[0]
        scores_file[f"{name}/test_probs"] = first.test_probs.cpu().numpy()
        for score, values in first.inside.items():
            scores_file[f"{name}/in/{score}"] = values
        for set_name, by_score in first.outside.items():
            for score, values in by_score.items():
                scores_file[f"{name}/out/{set_name}/{score}"] = values
    store = SampleStore.open(ctx.layout.samples) if data.image_shape is not None else None
    if store is not None:  # first-layer weights drawn as images (toy2d has no image)
        with store:
            scores_file["sgld_first_layer"] = _first_layer_images(store, data.image_shape)
    sampled = _sample_record(ctx)
    results = {
        "pipeline": cfg.name, "config_hash": config_hash(cfg, "evaluate"), "dataset": data.name,
        "sizes": data.sizes(), "device": str(device), "machine": machine(device), "runs": e.runs,
        "ensemble": sizes, "methods": list(methods),
        "std": "population standard deviation over runs (ddof 0)",
        "accuracy": {m: {k: mean_std([j.accuracy[k] for j in runs]) for k in runs[0].accuracy}
                     for m, runs in judgements.items()},
        "ood": {s: {sc: {m: _summarise_detection([j.detection[s][sc] for j in judgements[m]]) for m in methods}
                    for sc in e.scores} for s in inputs.ood},
        "ood_meta": {"n_in": len(inputs.x_in), "n_out": len(inputs.x_in), "ratio_in_out": "1:1",
                     "scale": e.ood_scale, "paper_variation_ratio": "max_prob (1 − max p̄)"},
        "storage": {m: _storage(ctx, m, method) for m, method in methods.items()},
        "timing": {m: round(t, 2) for m, t in timing.items()},
        "sgld_diagnostics": sampled.get("diagnostics"), "samples_digest": sampled.get("samples_digest"),
        "burn_in": _burn_in(ctx),
    }
    with stopwatch(results["timing"], "fidelity"):
        results["fidelity"] = fidelity_to_sgld(ctx, methods, judgements, sizes, inputs.x_test)
    with stopwatch(results["timing"], "reference_and_quality"):
        sums = reference_sums(stored, inputs, e.yardstick_reference)
        reference = sgld_reference(results, sums)
        results["reference_stability"] = reference_stability(sums, inputs.y_test, ctx.seed("evaluate", "stability"))
        results["quality"] = {m: method_quality(results, m, runs, reference) for m, runs in judgements.items()}
        results["at_networks"] = at_networks(ctx, methods, inputs, sizes, judgements, results, reference, stored)
    if "mog" in methods and e.mog_growth:
        with stopwatch(results["timing"], "mog_growth"):
            results["mog"], results["apd_share"] = mixture_growth(ctx, methods, inputs, results, reference)
    with stopwatch(results["timing"], "yardstick"):
        results["yardstick"] = yardstick(ctx, methods, inputs, reference, stored, finished)
    if MethodName.APD in methods and cfg.distill.seeds > 1:
        with stopwatch(results["timing"], "replicates"):
            results["replicates"] = {MethodName.APD: replicate_apd(
                ctx, methods[MethodName.APD].spec, inputs, sizes[MethodName.APD], judgements[MethodName.APD],
                reference, results["yardstick"])}
    return results


def stored_predictions(ctx: RunContext, methods: dict[str, Posterior], inputs: EvaluationInputs) -> StoredPredictions:
    """The stored samples SGLD draws from (the store, or its rows after the burn-in:
    :func:`~apd.pipeline.methods.sgld_samples`), each predicted once on the stacked inputs for every table that
    scores an ensemble of them: SGLD's draws, the kept and Stein-thinned samples, the
    yardstick's reference and its kept subsets."""
    sgld = methods[MethodName.SGLD]
    if not isinstance(sgld, SGLDSamples):
        raise TypeError(f"the sgld method is a {type(sgld).__name__}, not the store's samples")
    return StoredPredictions(sgld.store, inputs.stacked(ctx.device), ctx.device, progress=ctx.progress)


def _sample_record(ctx: RunContext) -> dict:
    """The sample manifest ``apd sample`` wrote: its convergence diagnostics and the digest of the samples
    (:func:`apd.samplers.store_digest.content_digest`); empty without one."""
    manifest = manifest_of(ctx.layout.samples)
    return read_json(manifest) if manifest.is_file() else {}


def _burn_in(ctx: RunContext) -> dict:
    """The burn-in the store's log-likelihood trace gives (:func:`apd.samplers.burn_in.trace_burn_in`) and
    whether SGLD's reference and the kept samples dropped it (``evaluate.burn_in_from_trace``)."""
    with SampleStore.open(ctx.layout.samples) as store:
        return {**stored_burn_in(store), "applied": ctx.cfg.evaluate.burn_in_from_trace}


def _summarise_detection(runs: list[dict | None]) -> dict | None:
    if any(r is None for r in runs):
        return None
    return {key: mean_std([100.0 * r[key] for r in runs]) for key in ("auroc", "aupr_in", "aupr_out", "fpr95")}


# The methods whose artifact is the method as stored, so that its file's size is their storage; the others
# are measured at four bytes a parameter.
STORED_AS_FILE = (MethodName.SGD, MethodName.MCDROPOUT, MethodName.APD)


def _storage(ctx: RunContext, name: str, method: Posterior) -> dict:
    parameters = method.stored_parameters()
    artifact = METHODS[name].artifact(ctx.layout)
    if name == MethodName.SGLD:
        with SampleStore.open(artifact) as store:
            size = store.file_bytes
    else:
        size = artifact.stat().st_size if name in STORED_AS_FILE else 4 * parameters
    return {"parameters": int(parameters), "bytes": int(size),
            "in_sgld_samples": round(method.storage_in_samples(), 3)}


def _first_layer_images(store: SampleStore, shape: tuple[int, int], count: int = 16) -> np.ndarray:
    """The first ``count`` hidden units' input weights of the last SGLD sample, as images of ``shape``; for a
    CNN, its first convolution layer's filters."""
    first = store.spec.unflatten(store.read([len(store) - 1])[0])[store.spec.names[0]]
    if first.dim() == 4:  # [channels out, 1, kernel, kernel]
        shape = first.shape[-2:]
    return first[:count].reshape(-1, *shape).numpy()


def _share(value: float | None, reference: float | None) -> float:
    return value / reference if value is not None and reference else float("nan")


def mixture_growth(ctx: RunContext, methods: dict[str, Posterior], inputs: EvaluationInputs,
                   results: dict, reference: Reference | None = None) -> tuple[list[dict], dict]:
    """MoG with a growing number of components (one EM fit each, the largest being the evaluated ``mog``),
    each judged on :data:`MIXTURE_DRAWS` fresh draws of ``networks`` members: its storage and its accuracy
    and mean BALD AUROC (mean and std over the draws) as a share of SGLD's, and APD's on the same footing.
    With ``reference``, each row also has the yardstick's quality (:mod:`apd.evaluation.yardstick`: worst
    per-set BALD and max-prob AUROC gaps, NLL gap, KL to SGLD's predictive), mean and std over the draws."""
    e, device = ctx.cfg.evaluate, ctx.device
    sgld_acc = accuracy(results, "sgld").mean
    sgld_auroc = mean_auroc(results, "sgld", HEADLINE_SCORE)
    rows = []
    with SampleStore.open(ctx.layout.samples) as store:
        for k in ctx.progress(e.mog_components, desc="MoG growth", unit="fit"):
            mixture = methods.get("mog") if k == max(e.mog_components) else None
            mixture = mixture or fit_mixture(store, k, e.mog_fit_samples, ctx.seed("evaluate", "mog", k), device,
                                             store_alignment(ctx, store))
            generator = torch.Generator().manual_seed(ctx.seed("evaluate", "mog-draws", k))
            accuracies, aurocs, qualities = [], [], []
            for _ in range(MIXTURE_DRAWS):
                judged = judge(mixture, inputs, e.networks, generator, [HEADLINE_SCORE, "max_prob"])
                accuracies.append(judged.accuracy["acc"])
                aurocs.append(judged.mean_auroc(HEADLINE_SCORE))
                if reference is not None:
                    qualities.append(_judgement_quality(judged, reference))
            acc, auroc = mean_std(accuracies), mean_std(aurocs)
            rows.append({"components": k, "parameters": mixture.stored_parameters(),
                         "in_sgld_samples": round(mixture.storage_in_samples(), 3), "draws": MIXTURE_DRAWS,
                         "accuracy": acc, "accuracy_share": _share(mean_of(acc), sgld_acc), "bald_auroc": auroc,
                         "bald_auroc_share": _share(mean_of(auroc), sgld_auroc), "em_converged": mixture.converged})
            if qualities:
                rows[-1]["quality"] = {key: mean_std([q[key] for q in qualities]) for key in qualities[0]
                                       if all(q[key] is not None for q in qualities)}
    apd_share = {}
    if "apd" in methods:
        apd = methods["apd"]
        apd_share = {"parameters": apd.stored_parameters(), "in_sgld_samples": round(apd.storage_in_samples(), 3),
                     "accuracy_share": _share(accuracy(results, "apd").mean, sgld_acc),
                     "bald_auroc_share": _share(mean_auroc(results, "apd", HEADLINE_SCORE), sgld_auroc)}
    return rows, apd_share


# ------------------------------------------------------------------------------- the kept-samples yardstick


def sgld_reference(results: dict, sums: ChainSums) -> Reference:
    """SGLD's side of the yardstick: its evaluated per-set BALD and max_prob AUROC and test NLL (means over
    runs), and the predictive and per-input BALD on the test inputs and the OOD sets of the stored samples
    whose per-chain sums are ``sums`` (:func:`~apd.evaluation.yardstick.reference_sums`)."""
    per_set = {score: {name: value for name, value in set_aurocs(results, "sgld", score).items() if value is not None}
               for score in ("bald", "max_prob")}
    predictive, information, samples = reference_predictive(sums)
    return Reference(per_set["bald"], per_set["max_prob"], accuracy(results, "sgld", "nll").mean, predictive,
                     information, samples)


def _judgement_quality(judged: Judgement, reference: Reference) -> dict:
    """The gaps to SGLD (:data:`~apd.evaluation.yardstick.GAP_KEYS`) of one judged ensemble."""
    summary = summarise(judged, reference)
    return {key: summary[key] for key in GAP_KEYS}


FIT_TO_ALIGNED = (MethodName.APD, MethodName.MOG, MethodName.MODES)  # fit to the samples as distill aligns them


def fidelity_to_sgld(ctx: RunContext, methods: dict[str, Posterior], judgements: dict[str, list[Judgement]],
                     sizes: dict[str, int], x_test: Tensor) -> dict:
    """Each method with weights (not SGLD, not SGD's one network) against SGLD:
    :func:`~apd.evaluation.fidelity.weight_fidelity` against SGLD's samples in the frame the method was fit
    in (``sgld_frame``: aligned as ``apd distill`` aligns them for the methods fit to the aligned samples,
    the mode mixture's modes counted among them, else as stored; per-weight spreads differ between the
    frames, since the raw samples hold permuted copies of a mode), and the
    :func:`~apd.evaluation.fidelity.bald_ratio` of its first run's ensemble (``sizes``: each method's members)
    to that of as many SGLD samples drawn afresh (``bald_members``; BALD's plug-in estimate shrinks with K)."""
    sgld = methods[MethodName.SGLD]
    perms = store_alignment(ctx, sgld.store)
    aligned = None if perms is None else SGLDSamples(sgld.store, ctx.device, perms=perms)
    found = {}
    for m, method in methods.items():
        if m in (MethodName.SGLD, MethodName.SGD) or not method.has_weights:
            continue
        generator = torch.Generator().manual_seed(ctx.seed("evaluate", "fidelity", m))
        frame = aligned if aligned is not None and m in FIT_TO_ALIGNED else sgld
        members = sgld.ensemble_size(sizes[m])
        sgld_bald = bald(sgld.predict_probs(x_test, members, generator)).double().cpu()  # as judgements hold it
        found[m] = {**weight_fidelity(method, frame, ctx.cfg.evaluate.networks, generator),
                    "bald_ratio": bald_ratio(judgements[m][0].information["test"], sgld_bald),
                    "sgld_frame": "aligned" if frame is aligned else "as stored", "bald_members": members}
    return found


def method_quality(results: dict, method: str, runs: list[Judgement], reference: Reference) -> dict:
    """The yardstick's quality of one evaluated method: each gap to SGLD averaged over its runs, and its
    per-set AUROC gaps likewise (:func:`apd.evaluation.yardstick.drawn_quality`), so that it stands against
    the kept samples as one draw of its ensemble, as each random subset does."""
    return {"in_sgld_samples": results["storage"][method]["in_sgld_samples"],
            "members": results["ensemble"][method],
            **drawn_quality([summarise(j, reference) for j in runs])}


def at_networks(ctx: RunContext, methods: dict[str, Posterior], inputs: EvaluationInputs, sizes: dict[str, int],
                judgements: dict[str, list[Judgement]], results: dict, reference: Reference,
                stored: StoredPredictions) -> dict:
    """Every method at ``networks`` members where it can draw that many (None where it cannot: a kept
    set, an ensemble, one network): accuracy, NLL, mean BALD AUROC and quality, over ``runs`` draws. A
    method whose own size is already ``networks`` is not drawn again."""
    e = ctx.cfg.evaluate
    out: dict[str, dict | None] = {}
    for name, method in methods.items():
        if method.ensemble_size(e.networks) < e.networks:
            out[name] = None
            continue
        if sizes[name] == e.networks:
            runs = judgements[name]
        else:
            generator = torch.Generator().manual_seed(ctx.seed("evaluate", "at-networks", name))
            runs = [judge(method, inputs, e.networks, generator, ["bald", "max_prob"], stored) for _ in range(e.runs)]
        qualities = [_judgement_quality(j, reference) for j in runs]
        aurocs = [j.mean_auroc("bald") for j in runs]
        out[name] = {"members": e.networks,
                     "acc": mean_std([j.accuracy["acc"] for j in runs]),
                     "nll": mean_std([j.accuracy["nll"] for j in runs]),
                     "mean_bald_auroc": mean_std(aurocs),
                     **{key: mean_std([q[key] for q in qualities]) for key in qualities[0]
                        if all(q[key] is not None for q in qualities)}}
    return out


def yardstick(ctx: RunContext, methods: dict[str, Posterior], inputs: EvaluationInputs, reference: Reference,
              stored: StoredPredictions, finished: FinishedParts | None = None) -> dict:
    """The kept-samples curve (k of ``yardstick_sizes``) and, for each method of storage S below the store's
    size, ⌈S⌉ kept samples: evenly spaced and ``yardstick_subsets`` random subsets
    (:mod:`apd.evaluation.yardstick`). A method stored at a lower precision P is also set against the kept
    samples its storage buys stored as compactly: ⌈S / s_P⌉ of them each rounded whole at P (s_P: one
    sample's storage at it; ``kept`` key "K P", the entry's ``at_precision``), and the fewest that take S
    stored at P about their chains' means, the means at the precision of the method's own mean
    (:class:`~apd.evaluation.kept_storage.AroundChainMeans`; key "K P around chain means at M", the entry's
    ``around_means``). The kept samples' predictions come from ``stored``, the sets judged one storage after
    another (float32's first: :meth:`StoredPredictions.one_storage_at_a_time`), so that every storage's rows
    fit where the one before's were kept (a row past its ``kept_bytes`` is predicted again for every subset
    that draws it); a progress bar counts the sets judged, and one beneath it the samples a set has predicted
    (``stored``'s, made with ``ctx.progress``). Each set judged is kept in
    ``finished``, and one found there (an interrupted run judged it under the same configuration, inputs and
    machine: :mod:`apd.pipeline.finished_parts`) is taken, not judged again, its seed stream set where judging
    it left it."""
    e = ctx.cfg.evaluate
    n, dim = len(stored), stored.store.spec.numel
    # key -> (k, storage, stream): the curve's sizes draw from one stream in increasing order, every other
    # size and storage from its own, so that the subsets of k do not depend on the other methods
    generator = torch.Generator().manual_seed(ctx.seed("evaluate", "yardstick"))
    curve_ks = curve_sizes(e.yardstick_sizes, n)
    sets: dict[str, tuple[int, KeptStorage, torch.Generator]] = {str(k): (k, "float32", generator) for k in curve_ks}
    around: dict[tuple[str, str], AroundChainMeans] = {}  # by (precision, the means' precision)

    def kept_set(worth: float, storage: KeptStorage) -> dict:
        k = kept_for(worth, dim, storage, n)
        name = storage_key(storage)
        key = str(k) if name == "float32" else f"{k} {name}"
        if key not in sets:
            parts = (k,) if name == "float32" else (k, name)
            seed = ctx.seed("evaluate", "yardstick", *parts)
            sets[key] = (k, storage, torch.Generator().manual_seed(seed))
        return {"k": k, "key": key}

    equal = {}
    for name, method in methods.items():
        worth = method.storage_in_samples()
        if name in (MethodName.SGLD, MethodName.KEPT) or kept_for(worth, dim, "float32", n) >= n:  # kept: the yardstick
            continue
        equal[name] = {"in_sgld_samples": round(worth, 3), "k": kept_set(worth, "float32")["k"]}
        if method.precision != "float32":
            p, mean_at = method.precision, method.mean_precision
            if (p, mean_at) not in around:
                around[p, mean_at] = AroundChainMeans.of(stored.store, p, mean_at)
            equal[name]["at_precision"] = {"precision": p, **kept_set(worth, p)}
            equal[name]["around_means"] = {"precision": p, "mean_at": mean_at,
                                           **kept_set(worth, around[p, mean_at])}
    # float32's sets first (the curve's sizes in their order: they share a stream)
    order = stored.one_storage_at_a_time({key: storage for key, (_, storage, _) in sets.items()})
    bar = ctx.progress(order, total=len(sets), desc="yardstick", unit="set")

    def judged(key: str, k: int, storage: KeptStorage, stream: torch.Generator) -> dict:
        ctx.show(bar, "yardstick", judging=f'kept samples "{key}"')
        return kept_samples(stored, k, inputs, reference, e.yardstick_subsets, stream, storage)

    # a set taken sets its stream where judging it left it
    kept = {key: taken_or_made(finished, f'yardstick: kept samples "{key}"',
                               functools.partial(judged, key, *sets[key]), sets[key][2]) for key in bar}
    by_size = sorted((k, key) for key, (k, storage, _) in sets.items() if storage_key(storage) == "float32")
    stored_otherwise = [key for key, (_, storage, _) in sets.items() if storage_key(storage) != "float32"]
    return {"reference": {"bald_auroc": reference.bald_auroc, "max_prob_auroc": reference.max_prob_auroc,
                          "nll": reference.nll, "kl_samples": reference.samples},
            "curve": [kept[str(k)] for k in curve_ks],
            "kept": {key: kept[key] for key in [key for _, key in by_size] + stored_otherwise},
            "equal_storage": equal}
