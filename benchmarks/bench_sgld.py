"""SGLD step time against SGD step time on the paper's nets (fcNN1 784-100-10, fcNN2 784-400-400-10).

One training iteration (zero_grad, forward, mean cross-entropy, backward, optimizer step) on batches of
100 random MNIST-shaped inputs, for torch.optim.SGD (lr 0.05, weight decay 0.001) and apd.samplers.sgld.SGLD (the
paper's run: lr 0.05, N 50,000, prior variance 0.02) with and without noise prefetching (drawing the next
step's noise on a worker thread, which ``prefetch_noise = "auto"`` does when torch leaves a core free).
Methods are timed in interleaved blocks and each reports the median over repetitions, so drift on a
shared machine hits all alike. "noise" is one standard-normal draw of D values alone; its share is noise / SGLD step.
The forward and backward pass within each iteration is timed too: with prefetching, the draw on the other
core slows it (on fcNN1 here by about half of what the prefetched iteration costs beyond SGD's).
Run: .venv/bin/python benchmarks/bench_sgld.py [--reps 9] [--steps 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from record import BenchmarkRecord, add_out_argument
from torch import nn

from apd.nets import ParamSpec, mlp
from apd.samplers.sgld import SGLD

NETS = {"fcNN1": [784, 100, 10], "fcNN2": [784, 400, 400, 10]}
LR, NUM_DATA, PRIOR_VAR, BATCH = 0.05, 50_000, 0.02, 100


class TrainingStep:
    """Iteration ``i`` on batch ``i mod len(batches)``; adds the seconds its forward and backward pass take
    (zero_grad to backward) to ``gradient_seconds``, so that what the optimizer's step costs beside them is
    told apart from what it slows them by (a noise draw running on the other core meanwhile)."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer, batches: list) -> None:
        self.net, self.optimizer, self.batches = net, optimizer, batches
        self.gradient_seconds = 0.0

    def __call__(self, i: int) -> None:
        x, y = self.batches[i % len(self.batches)]
        started = time.perf_counter()
        self.optimizer.zero_grad()
        nn.functional.cross_entropy(self.net(x), y).backward()
        self.gradient_seconds += time.perf_counter() - started
        self.optimizer.step()


def ms_per_call(fn: Callable[[int], object], calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e3


def bench_net(sizes: list[int], reps: int, steps: int) -> dict[str, float]:
    """Median ms per iteration of each method, and of the noise draw alone; ``METHOD gradient``: the median
    ms of the forward and backward pass within each method's iteration."""
    torch.manual_seed(0)
    base = mlp(sizes)
    batches = [(torch.rand(BATCH, sizes[0]) * 2 - 1, torch.randint(0, sizes[-1], (BATCH,))) for _ in range(8)]
    methods: dict[str, Callable[[int], object]] = {}
    for name, make in {
        "sgd": lambda p: torch.optim.SGD(p, lr=LR, weight_decay=1 / (NUM_DATA * PRIOR_VAR)),
        "sgld": lambda p: SGLD(p, LR, NUM_DATA, PRIOR_VAR**0.5, seed=0, prefetch_noise=False),
        "sgld_prefetch": lambda p: SGLD(p, LR, NUM_DATA, PRIOR_VAR**0.5, seed=0, prefetch_noise=True),
    }.items():
        net = copy.deepcopy(base)
        methods[name] = TrainingStep(net, make(net.parameters()), batches)
    generator = torch.Generator().manual_seed(0)
    buffer = torch.empty(ParamSpec.from_module(base).numel)
    methods["noise"] = lambda i: buffer.normal_(generator=generator)

    for fn in methods.values():  # warm-up: allocator, thread pools, the prefetch worker
        ms_per_call(fn, steps)
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(reps):
        for name, fn in methods.items():
            before = getattr(fn, "gradient_seconds", 0.0)
            times[name].append(ms_per_call(fn, steps))
            if isinstance(fn, TrainingStep):
                times.setdefault(f"{name} gradient", []).append((fn.gradient_seconds - before) / steps * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 5 blocks of 20 proved too short here: the prefetched ratio came out 1.71 / 1.75 where two runs of
    # 9 × 50 gave 1.36–1.37 / 1.05–1.09 (fcNN1 / fcNN2, one thread)
    parser.add_argument("--reps", type=int, default=9, help="interleaved repetitions (median taken)")
    parser.add_argument("--steps", type=int, default=50, help="iterations per timed block")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("sample")

    default_threads = torch.get_num_threads()
    header = (f"{'threads':>7} {'net':>6} {'D':>7} {'SGD ms':>7} {'SGLD ms':>8} {'+pref ms':>8} "
              f"{'ratio':>6} {'r pref':>6} {'noise ms':>8} {'share':>6}")
    print(header)
    print("-" * len(header))
    measured: dict[int, dict[str, dict[str, float]]] = {}
    for threads in sorted({default_threads, 1}, reverse=True):
        torch.set_num_threads(threads)
        for name, sizes in NETS.items():
            t = measured.setdefault(threads, {})[name] = bench_net(sizes, args.reps, args.steps)
            numel = ParamSpec.from_module(mlp(sizes)).numel
            print(f"{threads:>7} {name:>6} {numel:>7} {t['sgd']:>7.3f} {t['sgld']:>8.3f} "
                  f"{t['sgld_prefetch']:>8.3f} {t['sgld'] / t['sgd']:>6.2f} "
                  f"{t['sgld_prefetch'] / t['sgd']:>6.2f} {t['noise']:>8.3f} {t['noise'] / t['sgld']:>6.1%}",
                  flush=True)
    torch.set_num_threads(default_threads)
    print("ratio = SGLD / SGD step (target <= 1.3); r pref = with noise prefetched on a worker thread;"
          " share = noise draw alone / SGLD step")
    for threads, by_net in measured.items():
        print(f"{threads} thread(s), forward + backward ms within SGD / SGLD / prefetched SGLD: " + "; ".join(
            f"{name} {t['sgd gradient']:.3f} / {t['sgld gradient']:.3f} / {t['sgld_prefetch gradient']:.3f}"
            for name, t in by_net.items()))

    def ratios(threads: int, method: str) -> str:
        return ", ".join(f"{name} {t[method] / t['sgd']:.2f}" for name, t in measured[threads].items())

    one = measured[1]
    record.add("SGLD step / SGD step, batch 100, 1 compute thread, noise drawn on the idle second core (the "
               'default, `prefetch_noise = "auto"`; `bench_sgld.py`)', ratios(1, "sgld_prefetch"), "≤ 1.3")
    record.add('same, noise drawn in the step (`prefetch_noise = "off"`)',
               f"{ratios(1, 'sgld')}; drawing D Gaussians takes " + ", ".join(
                   f"{t['noise']:.2f} ms ({100 * t['noise'] / t['sgld']:.0f} % of the {name} step)"
                   for name, t in one.items()))
    if default_threads > 1:
        record.add(f"same, {default_threads} compute threads (prefetching then only competes for a core, so "
                   "`auto` turns it off)", f"{ratios(default_threads, 'sgld')} (prefetched: "
                   f"{ratios(default_threads, 'sgld_prefetch')})")
    record.add("forward and backward pass within the prefetched SGLD iteration / within SGD's, 1 compute "
               "thread (the next step's noise is drawn on the other core meanwhile)",
               ", ".join(f"{name} {t['sgld_prefetch gradient'] / t['sgd gradient']:.2f}" for name, t in one.items()))
    record.write(args.out)


if __name__ == "__main__":
    main()
