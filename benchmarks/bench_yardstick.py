"""The kept-samples yardstick's judgement of one subset at Fashion-MNIST fcNN1's sizes (784-100-10, 20,000
stacked inputs: 10,000 test, 2,000 in-distribution, four OOD sets of 2,000), three ways side by side in one
run: as the yardstick does it (each stored sample's entropies H[p_s] kept beside its predictions, and a size's
subsets stacked into buffers allocated once: :meth:`StoredPredictions.members`); with every subset stacked
into fresh memory, as it was before; and with every member's entropies computed again for each subset too, as
it was before that.

Run: ``.venv/bin/python benchmarks/bench_yardstick.py [--subsets 20] [--out FILE]`` (one thread). It prints,
for k = 10 and 50 kept samples, the seconds per subset of each way, interleaved subset by subset, and their
ratios (every summary of the three ways checked equal), and what keeping the entropies costs once: the seconds
per stored sample of its prediction, and of its entropies (computed for every sample before the subsets are
timed, as 200 subsets a size drawn from the whole store come to do in the yardstick). The store holds 400
samples of 4 chains, a fresh network's weights plus N(0, 0.05²) noise, and the inputs are Gaussian pixels:
the cost depends only on the sizes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from record import BenchmarkRecord, add_out_argument

from apd.evaluation.protocol import EvaluationInputs, judge_probs
from apd.evaluation.stored import StoredPredictions
from apd.evaluation.yardstick import SCORES, Reference, judge_rows, summarise
from apd.metrics import auroc
from apd.nets import ParamSpec, mlp
from apd.posteriors.kept import random_rows
from apd.samplers.store import SampleStore

CHAINS, PER_CHAIN = 4, 100
SIZES = (10, 50)


def fcnn1_store(path: Path) -> SampleStore:
    """:data:`CHAINS` × :data:`PER_CHAIN` fcNN1 weight vectors about a fresh network's."""
    torch.manual_seed(0)
    net = mlp([784, 100, 10])
    spec = ParamSpec.from_module(net)
    with SampleStore.create(path, spec, {}) as store:
        for chain in range(CHAINS):
            rows = spec.flatten(net) + 0.05 * torch.randn(PER_CHAIN, spec.numel)
            store.append_many(rows, steps=np.arange(PER_CHAIN), chains=chain)
    return SampleStore.open(path)


def fashion_sized_inputs() -> EvaluationInputs:
    g = torch.Generator().manual_seed(1)
    return EvaluationInputs(torch.randn(10_000, 784, generator=g), torch.randint(10, (10_000,), generator=g),
                            torch.randn(2_000, 784, generator=g),
                            {f"ood{i}": 2 * torch.randn(2_000, 784, generator=g) for i in range(4)})


def reference_of(stored: StoredPredictions, inputs: EvaluationInputs) -> Reference:
    """Every stored sample's ensemble as the reference (the yardstick takes SGLD's evaluated numbers)."""
    judged = judge_probs(stored.probs(np.arange(len(stored))), inputs, SCORES, auroc)
    aurocs = {score: judged.set_aurocs(score) for score in SCORES}
    return Reference(aurocs["bald"], aurocs["max_prob"], judged.accuracy["nll"], judged.predictive,
                     judged.information, len(stored))


def recomputing(stored: StoredPredictions, rows: np.ndarray, inputs: EvaluationInputs, reference: Reference) -> dict:
    """:func:`judge_rows` as it was first: the members' entropies computed again from their predictions."""
    return summarise(judge_probs(stored.probs(rows), inputs, SCORES, auroc), reference)


def per_subset(stored: StoredPredictions, k: int, subsets: int, inputs: EvaluationInputs,
               reference: Reference) -> dict[str, float]:
    """Mean seconds per subset of k rows (stratified by chain) of the three ways, interleaved."""
    generator = torch.Generator().manual_seed(k)
    buffers = stored.member_buffers(k)
    ways = {"buffers": lambda rows: judge_rows(stored, rows, inputs, reference, buffers=buffers),
            "fresh": lambda rows: judge_rows(stored, rows, inputs, reference),
            "recomputed": lambda rows: recomputing(stored, rows, inputs, reference)}
    seconds = dict.fromkeys(ways, 0.0)
    for _ in range(subsets):
        rows = random_rows(len(stored), k, generator, stored.store.chains)
        found = {}
        for way, judge in ways.items():
            start = time.perf_counter()
            found[way] = judge(rows)
            seconds[way] += time.perf_counter() - start
        if not found["buffers"] == found["fresh"] == found["recomputed"]:
            raise AssertionError(f"k = {k}: the ways disagree")
    return {way: total / subsets for way, total in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subsets", type=int, default=20, help="subsets timed per size and way")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("evaluate")
    torch.set_num_threads(1)
    inputs = fashion_sized_inputs()
    with tempfile.TemporaryDirectory() as tmp, fcnn1_store(Path(tmp) / "samples.h5") as store:
        stored = StoredPredictions(store, inputs.stacked("cpu"), "cpu")
        start = time.perf_counter()
        stored.prefetch(np.arange(len(store)))
        fill = (time.perf_counter() - start) / len(store)
        start = time.perf_counter()
        stored.members(np.arange(len(store)))  # every sample's entropies computed and kept, as the yardstick's
        entropies = (time.perf_counter() - start) / len(store)  # 200 subsets a size come to do
        print(f"per stored sample, once: predicted and kept {1e3 * fill:.1f} ms, its entropies computed and kept "
              f"{1e3 * entropies:.1f} ms")
        reference = reference_of(stored, inputs)
        timed = {}
        for k in SIZES:
            t = timed[k] = per_subset(stored, k, args.subsets, inputs, reference)
            print(f"k = {k}: {1e3 * t['recomputed']:.0f} ms per subset recomputing the entropies, "
                  f"{1e3 * t['fresh']:.0f} ms with them kept, {1e3 * t['buffers']:.0f} ms stacked into buffers "
                  f"({t['recomputed'] / t['fresh']:.1f}×, then {t['fresh'] / t['buffers']:.1f}×)")
    record.add("the yardstick's judgement of one subset of k kept samples, fcNN1 on 20,000 inputs, 1 thread: "
               "members' entropies computed for each subset → kept once per stored sample → and each size's "
               "subsets stacked into buffers allocated once (`bench_yardstick.py`)",
               "; ".join(f"k = {k}: {1e3 * t['recomputed']:.0f} ms → {1e3 * t['fresh']:.0f} ms → "
                         f"{1e3 * t['buffers']:.0f} ms ({t['recomputed'] / t['fresh']:.1f}×, "
                         f"{t['fresh'] / t['buffers']:.1f}×)" for k, t in timed.items())
               + f"; once per stored sample {1e3 * entropies:.1f} ms of entropies beside {1e3 * fill:.1f} ms "
                 "predicting it")
    record.write(args.out)


if __name__ == "__main__":
    main()
