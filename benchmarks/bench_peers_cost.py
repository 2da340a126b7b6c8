"""What the peers (kept and Stein-thinned SGLD samples, SWAG, the deep ensemble, three Laplace
approximations) add to ``apd evaluate``'s cost, measured side by side with the paper's methods (SGD, MC
dropout, SGLD, APD, MoG) in one run on a pipeline's complete artifacts.

Run: ``.venv/bin/python benchmarks/bench_peers_cost.py [--config pipelines/fashion-fc1.toml]`` after
``make sample distill`` for that pipeline. For each configured method it times loading (or fitting: the
MoG's EM, Laplace's curvature, Stein's gradients) and judging one run (one draw of its ensemble scored on
the test set and every OOD set, :func:`apd.evaluation.protocol.judge`), and prints the method's cost for
the pipeline's ``evaluate.runs`` runs (loading + runs × one run), then the peers' total over the paper
methods' total. The steps over all methods (fidelity, the kept-samples yardstick, MoG growth,
adversarial) are not part of this comparison; ``results.json``'s ``timing`` has them for a real run.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from pathlib import Path

import torch
from record import BenchmarkRecord, add_out_argument

from apd.config_load import load_config
from apd.evaluation.protocol import judge
from apd.pipeline.locks import artifact_lock
from apd.pipeline.methods import ensemble_sizes, load_methods
from apd.pipeline.recipes import evaluation_inputs
from apd.pipeline.runtime import RunContext, torch_threads

PAPER_METHODS = ("sgd", "mcdropout", "sgld", "apd", "mog")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="pipelines/digits.toml")
    parser.add_argument("--artifacts", default="artifacts")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("evaluate")
    ctx = RunContext(cfg=load_config(args.config, []), artifacts_root=Path(args.artifacts), quiet=True)
    runs = ctx.cfg.evaluate.runs
    threads = ctx.cfg.evaluate.threads or ctx.cfg.threads  # as `apd evaluate` runs
    with artifact_lock(ctx.layout.lock, shared=True), ExitStack() as stack, torch_threads(threads):
        loading: dict[str, float] = {}
        methods, _ = load_methods(ctx, stack, loading=loading)
        inputs = evaluation_inputs(ctx)
        sizes = ensemble_sizes(ctx, methods)
        generator = torch.Generator().manual_seed(0)
        cost = {}
        used_threads = torch.get_num_threads()
        print(f"{ctx.cfg.name}: {runs} runs, {used_threads} torch thread(s)")
        print(f"{'method':<14}{'members':>8}{'loading s':>11}{'one run s':>11}{f'{runs} runs s':>12}")
        for name, method in methods.items():
            started = time.perf_counter()
            judge(method, inputs, sizes[name], generator, ctx.cfg.evaluate.scores)
            one_run = time.perf_counter() - started
            cost[name] = loading[name] + runs * one_run
            print(f"{name:<14}{sizes[name]:>8}{loading[name]:>11.1f}{one_run:>11.2f}{cost[name]:>12.1f}")
    paper = sum(c for name, c in cost.items() if name in PAPER_METHODS)
    peers = sum(c for name, c in cost.items() if name not in PAPER_METHODS)
    print(f"paper's methods {paper:.1f} s, peers {peers:.1f} s: the peers add {peers / paper:.2f}× the paper "
          f"methods' cost ({(paper + peers) / paper:.2f}× in all)")
    record.add(f"what the peers add to `apd evaluate` on {ctx.cfg.name} ({runs} runs, {used_threads} torch "
               "thread(s); loading or fitting each method plus its runs; `bench_peers_cost.py`)",
               f"paper's methods {paper:.1f} s, peers {peers:.1f} s: {peers / paper:.2f}× the paper methods' cost")
    record.write(args.out)


if __name__ == "__main__":
    main()
