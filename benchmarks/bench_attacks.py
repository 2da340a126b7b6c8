"""Gray-box attack throughput on fcNN1, and the adversarial part of `apd evaluate` on digits.

Part 1: adversarial examples crafted per second for FGSM at one ε, FGSM with the smallest ε of a 15-value
grid, and PGD-40, at batch sizes 100 and 1,000, on one weight vector of a 784-100-10 MLP on one CPU
thread (random weights scaled ×3 so that logits are as confident as a trained net's; random inputs in
[-1, 1], labelled with the net's own predictions). Each attack runs through ``weight_sample_fn`` (the batched
``predict_logits`` of the pipeline) and through ``module_fn`` on an ``nn.Sequential`` holding the same
weights; ``ratio`` = weight-vector rate / module rate. The last columns relate each attack's time to
single-ε FGSM at the same batch size (PGD-40 costs 40 gradients where FGSM costs one).

Part 2: wall time of ``evaluate_adversarial`` with the default digits pipeline (adversarial part on)
on the artifacts in ``artifacts/digits/`` when they are complete: first with crafting, then reusing the
stored sets (scoring only). The sets are written to a temporary directory, never into the artifacts.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import torch
from record import BenchmarkRecord, add_out_argument

from apd.config_load import load_config
from apd.evaluation.attacks import craft, module_fn, weight_sample_fn
from apd.nets import ParamSpec, mlp

SIZES = [784, 100, 10]
BATCHES = (100, 1000)
GRID = [round(0.02 * i, 2) for i in range(1, 16)]
ATTACKS: dict[str, tuple[str, dict]] = {
    "FGSM ε=0.1": ("fgsm", {"eps": 0.1}),
    "FGSM min-ε (15)": ("fgsm_min_eps", {"eps_grid": GRID}),
    "PGD-40": ("pgd", {"eps": 0.3, "steps": 40, "step_size": 0.02}),
}
DIGITS = Path("artifacts/digits")
DIGITS_ARTIFACTS = ("samples.h5", "samples.json", "generator.pt", "generator.json", "baselines")


def best_time(fn: Callable[[], object], budget: float = 1.0, min_repeats: int = 3) -> float:
    """Fastest call (seconds) of at least ``min_repeats`` after a warm-up, repeating until ``budget``
    seconds are spent: the fastest is the least disturbed by other load on a shared machine."""
    fn()
    times: list[float] = []
    while len(times) < min_repeats or sum(times) < budget:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def attack_throughput(record: BenchmarkRecord) -> None:
    torch.set_num_threads(1)  # one thread: the steadiest timings on a small shared CPU
    torch.manual_seed(0)
    net = mlp(SIZES)
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.mul_(3.0)
    spec = ParamSpec.from_module(net)
    by_vector, by_module = weight_sample_fn(spec, spec.flatten(net)), module_fn(net.eval())
    print(f"fcNN1 {'-'.join(map(str, SIZES))} ({spec.numel:,} parameters), one weight vector; "
          f"torch threads {torch.get_num_threads()}\n")
    best_time(partial(craft, "fgsm", by_vector, torch.zeros(10, SIZES[0]), torch.zeros(10, dtype=torch.long),
                      eps=0.1))  # the first autograd call of a process pays a one-off set-up
    print(f"{'attack':<16} {'batch':>5} | {'vector ex/s':>11} {'module ex/s':>11} {'ratio':>5} | "
          f"{'time / FGSM':>11} {'success':>7}")
    rates = {}
    for batch in BATCHES:
        generator = torch.Generator().manual_seed(batch)
        x = torch.rand(batch, SIZES[0], generator=generator) * 2 - 1
        with torch.no_grad():
            y = by_module(x).argmax(-1)
        fgsm_time = None
        for label, (name, arguments) in ATTACKS.items():
            vector = best_time(partial(craft, name, by_vector, x, y, **arguments))
            module = best_time(partial(craft, name, by_module, x, y, **arguments))
            fgsm_time = fgsm_time or vector
            success = craft(name, by_vector, x, y, **arguments).success.float().mean().item()
            rates[label, batch] = batch / vector
            print(f"{label:<16} {batch:>5} | {batch / vector:>11,.0f} {batch / module:>11,.0f} "
                  f"{module / vector:>5.2f} | {vector / fgsm_time:>10.1f}× {success:>7.1%}")
    batch = BATCHES[-1]
    record.add(f"FGSM (ε = 0.1) / PGD-40 crafting, fcNN1, batch {batch:,}, gray-box, 1 thread (`bench_attacks.py`)",
               f"{rates['FGSM ε=0.1', batch]:,.0f} / {rates['PGD-40', batch]:,.0f} examples per second")


def digits_evaluate(record: BenchmarkRecord) -> None:
    missing = [name for name in DIGITS_ARTIFACTS if not (DIGITS / name).exists()]
    if missing or not all((DIGITS / "baselines" / f"{m}.json").is_file() for m in ("sgd", "mcdropout")):
        print(f"\n(skipped the digits timing: {DIGITS} is incomplete; run `make sample distill` first)")
        return
    from apd.pipeline.adversarial import evaluate_adversarial
    from apd.pipeline.comparison_tables import adversarial_table
    from apd.pipeline.methods import load_methods
    from apd.pipeline.runtime import RunContext

    cfg = load_config("pipelines/digits.toml")
    # a 1-component MoG keeps the fit quick: its column is MoG-1, not the pipeline's MoG-60
    cfg.evaluate = dataclasses.replace(cfg.evaluate, mog_components=[1],
                                       adversarial=dataclasses.replace(cfg.evaluate.adversarial, enabled=True))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        root = Path(tmp)
        (root / cfg.name).mkdir()
        for path in DIGITS.iterdir():  # every stage's output (the store's shards included), not its evaluation
            if path.name not in ("eval", "experiments") and not path.name.startswith("."):
                (root / cfg.name / path.name).symlink_to(path.resolve())
        ctx = RunContext(cfg=cfg, artifacts_root=root, quiet=True)
        methods, _ = load_methods(ctx, stack)
        a = cfg.evaluate.adversarial
        print(f"\ndigits, evaluate_adversarial: sources {', '.join(a.sources)}; up to {a.examples:,} "
              f"examples (validation split {len(ctx.data.y_val)}); {a.samples:,} members per target "
              f"(torch threads {torch.get_num_threads()})")
        timings = {}
        for run in ("craft + score", "reuse + score"):
            start = time.perf_counter()
            results = evaluate_adversarial(ctx, methods)
            timings[run] = time.perf_counter() - start
        print(f"{'run':<14} {'seconds':>8}")
        for run, seconds in timings.items():
            print(f"{run:<14} {seconds:>8.1f}")
        print(f"crafting share: {1 - timings['reuse + score'] / timings['craft + score']:.0%}\n")
        record.add(f"the adversarial part of `apd evaluate` on digits (sources {', '.join(a.sources)}, "
                   f"{a.samples:,} members per target), crafting and scoring / scoring stored sets",
                   f"{timings['craft + score']:.1f} s / {timings['reuse + score']:.1f} s")
        print(adversarial_table(results).markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("evaluate")
    attack_throughput(record)
    digits_evaluate(record)
    record.write(args.out)


if __name__ == "__main__":
    main()
