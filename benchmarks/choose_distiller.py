"""Choose among distilled generators by the one rule of docs/design.md ("Choosing a distiller"), on
validation images and the OOD tuning pool only (apd.evaluation.choice).

Each candidate is a pipeline's artifact folder holding a generator distilled from one and the same sample
store (made with ``apd distill --artifacts ROOT --set …`` on a copy or hard link of the store); each is
loaded as ``apd.load(folder, "apd")`` loads it (checked as the command line checks it) and judged in the
pipeline's ``[evaluate] runs`` draws of ``networks`` members against SGLD's predictive (up to
``yardstick_reference`` stored samples) on the validation images and the OOD tuning pool. Prints, per
candidate, its storage, the criterion (mean ± std over runs) and, for the record only, the yardstick's
AUROC and NLL gaps and the four function-space gaps; then the choice. Run from the repository root:

    python benchmarks/choose_distiller.py --config pipelines/digits.toml --budget 25 \\
        shipped=artifacts/digits embedding-4=artifacts/e4/digits

``--json FILE`` also writes the rows, the choice and where it was made (the machine, the store's file and
samples' digests: :func:`apd.experiments.outputs.provenance`); each row names the machine its generator was
trained on (``trained_on``, from its manifest), thread count included: a GAN trained on another number of
threads rounds differently and can come out another generator, so candidates judged against each other are
trained on as many threads. ``--ceiling`` also judges every stored sample's own
coordinates in the pipeline's subspace at its rank and precision (:func:`apd.experiments.precision.sgld_coordinates`):
the best any generator in that subspace can do, recorded beside the candidates, never chosen.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

import apd
from apd.config_load import load_config
from apd.distillation.generator import part_precisions
from apd.evaluation.choice import Candidate, choice_markdown, choose, run_criterion
from apd.evaluation.protocol import judge
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import FUNCTION_KEYS, SCORES, summarise
from apd.experiments.outputs import provenance
from apd.experiments.precision import sgld_coordinates
from apd.experiments.storage import sgld_reference
from apd.io import read_json
from apd.pipeline.layout import manifest_of
from apd.pipeline.manifests import manifest_digest
from apd.pipeline.recipes import evaluation_inputs, training_samples
from apd.pipeline.runtime import RunContext
from apd.samplers.store import SampleStore

RECORDED = ("bald_gap", "max_prob_gap", "nll_gap", *FUNCTION_KEYS)  # reported, deciding nothing


def candidate(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=FOLDER")
    return name, Path(folder)


def judged_row(ctx: RunContext, name: str, method, inputs, reference) -> dict:
    """``method`` judged in ``[evaluate] runs`` draws of ``networks`` members against ``reference``: its name,
    storage, per-run criteria, their mean and std, and the recorded gaps averaged over the runs."""
    e = ctx.cfg.evaluate
    draws = torch.Generator().manual_seed(ctx.seed("experiment", "choice"))
    summaries = [summarise(judge(method, inputs, e.networks, draws, SCORES), reference) for _ in range(e.runs)]
    criteria = [run_criterion(s) for s in summaries]
    return {"name": name, "storage": method.storage_in_samples(), "criteria": criteria,
            "criterion": float(np.mean(criteria)), "criterion_std": float(np.std(criteria)),
            **{key: float(np.mean([s[key] for s in summaries])) for key in RECORDED}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the pipeline the candidates were distilled for")
    parser.add_argument("--budget", type=float, default=math.inf, help="storage budget, SGLD samples' worth")
    parser.add_argument("--json", type=Path, help="also write the rows and the choice here")
    parser.add_argument("--ceiling", action="store_true",
                        help="also judge every SGLD sample's coordinates in the pipeline's subspace (not a candidate)")
    parser.add_argument("candidates", nargs="+", type=candidate, help="NAME=FOLDER, e.g. shipped=artifacts/digits")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    first = args.candidates[0][1]
    if first.name != cfg.name:
        parser.error(f"{first}: the pipeline's artifact folder is named after it, {cfg.name!r}")
    stores = {manifest_digest(folder / "samples.json") for _, folder in args.candidates}
    if len(stores) != 1:
        parser.error("the candidates were distilled from different sample stores")
    ctx = RunContext(cfg=cfg, artifacts_root=first.parent, quiet=True)
    e, inputs = cfg.evaluate, evaluation_inputs(ctx, role="tuning")
    with SampleStore.open(ctx.layout.samples) as store:
        _, reference = sgld_reference(ctx, StoredPredictions(store, inputs.stacked(ctx.device), ctx.device), inputs)
    rows, judged = [], []
    for name, folder in args.candidates:
        post = apd.load(folder, "apd")
        rows.append({**judged_row(ctx, name, post, inputs, reference),
                     "trained_on": read_json(manifest_of(folder / ctx.layout.generator.name)).get("machine")})
        judged.append(Candidate(name, rows[-1]["storage"], tuple(rows[-1].pop("criteria"))))
        print(f"{name}: storage {judged[-1].storage:.2f}, criterion {judged[-1].mean:.4f} ± {judged[-1].std:.4f}",
              file=sys.stderr)
    ceiling = None
    if args.ceiling:
        with SampleStore.open(ctx.layout.samples) as store:
            stored_as = part_precisions(cfg.distill)
            coordinates = sgld_coordinates(ctx, store, training_samples(ctx, store, cfg.distill),
                                           cfg.distill.subspace_rank).stored_at(stored_as)
            ceiling = judged_row(ctx, f"ceiling: SGLD coordinates r={cfg.distill.subspace_rank}, "
                                      f"{stored_as.codec_only().describe()}", coordinates, inputs, reference)
        ceiling.pop("criteria")
        ceiling["storage_precision"] = coordinates.precision
    budget = None if math.isinf(args.budget) else args.budget
    record = {"budget": budget, "runs": e.runs, "networks": e.networks, "ood": list(inputs.ood),
              "recorded": list(RECORDED), "rows": rows, **({"ceiling": ceiling} if ceiling else {}),
              **choose(judged, args.budget), "provenance": provenance(ctx)}
    print(choice_markdown(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
