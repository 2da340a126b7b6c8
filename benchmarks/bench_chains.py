"""SGLD steps per second with one and two sampling workers, against one two-thread chain, and the joined
store's read speed against one file.

Chains are the project's :class:`apd.samplers.chain.SGLDChain` (the paper's SGLD: lr 0.05, N 50,000,
prior variance 0.02, batch 100) on random MNIST-shaped data, for fcNN1 784-100-10 and fcNN2
784-400-400-10. Three ways to spend the machine's cores, timed in interleaved blocks (median over
repetitions, so drift on a shared machine hits all alike):

- ``two-thread chain``: one chain, torch on 2 threads (noise drawn in the step: no core is free);
- ``W = 1``: one chain, 1 thread (noise on a worker thread where ``prefetch_noise = "auto"`` would);
- ``W = 2``: two processes (``torch.multiprocessing``, spawn), one chain and one thread each, started
  together; total steps per second = both processes' steps / the slower one's time.

Reading: a store of R rows written as one file, and the same rows as two shards joined by
:func:`apd.samplers.store.join_stores` (an HDF5 virtual dataset); 100 random rows (``read``), and all rows
in order (``read_all``), from the page cache; time joined / one file.
Run: .venv/bin/python benchmarks/bench_chains.py [--reps 5] [--steps 300] [--rows 400] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from record import BenchmarkRecord, add_out_argument

from apd.config import SGLDConfig
from apd.nets import ParamSpec, mlp
from apd.samplers.chain import ChainSeeds, SGLDChain
from apd.samplers.sgld import prefetch_pays
from apd.samplers.store import SampleStore
from apd.samplers.store_join import join_stores

NETS = {"fcNN1": [784, 100, 10], "fcNN2": [784, 400, 400, 10]}
CONFIG = SGLDConfig(lr=0.05, prior_var=0.02, batch_size=100, iterations=10**9, burn_in=0)
NUM_DATA = 50_000
TRAIN_ROWS = 5_000  # random images the minibatches are drawn from (the SGLD step sees N = 50,000)


def make_chain(sizes: list[int], seed: int, prefetch: bool) -> SGLDChain:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(TRAIN_ROWS, sizes[0], generator=generator) * 2 - 1
    y = torch.randint(0, sizes[-1], (TRAIN_ROWS,), generator=generator)
    chain = SGLDChain(sizes, CONFIG, seed, x, y, ChainSeeds(seed, seed + 1, seed + 2), prefetch)
    for group in chain.optimizer.param_groups:  # the paper's N, not the random subset's
        group["num_data"] = NUM_DATA
    return chain


def run_steps(chain: SGLDChain, start: int, steps: int) -> float:
    """Seconds for ``steps`` SGLD iterations of ``chain``."""
    began = time.perf_counter()
    for t in range(start, start + steps):
        chain.step(t)
    return time.perf_counter() - began


def _worker(rank: int, sizes: list[int], commands: mp.Queue, results: mp.Queue) -> None:
    """A sampling worker: one thread, its own chain; runs the number of steps it is sent."""
    torch.set_num_threads(1)
    chain = make_chain(sizes, 10 + rank, prefetch_pays(torch.device("cpu"), processes=2))
    run_steps(chain, 0, 20)
    results.put(("ready", rank, 0.0))
    t = 20
    while (steps := commands.get()) is not None:
        results.put(("done", rank, run_steps(chain, t, steps)))
        t += steps


def bench_net(name: str, sizes: list[int], reps: int, steps: int) -> dict[str, float]:
    """Median total steps per second of each arrangement."""
    context = mp.get_context("spawn")
    commands = [context.Queue() for _ in range(2)]
    results = context.Queue()
    workers = [context.Process(target=_worker, args=(rank, sizes, commands[rank], results)) for rank in range(2)]
    for worker in workers:
        worker.start()
    for _ in workers:
        results.get()
    torch.set_num_threads(2)
    two_thread = make_chain(sizes, 0, prefetch=False)
    torch.set_num_threads(1)
    one_thread = make_chain(sizes, 1, prefetch_pays(torch.device("cpu"), processes=1))
    rates: dict[str, list[float]] = {"two-thread chain": [], "W = 1": [], "W = 2": []}
    t = 0
    try:
        for _ in range(reps + 1):  # the first round warms up and is dropped
            torch.set_num_threads(2)
            two = steps / run_steps(two_thread, t, steps)
            torch.set_num_threads(1)
            one = steps / run_steps(one_thread, t, steps)
            for queue in commands:
                queue.put(steps)
            slowest = max(results.get()[2] for _ in workers)
            t += steps
            if t > steps:
                rates["two-thread chain"].append(two)
                rates["W = 1"].append(one)
                rates["W = 2"].append(2 * steps / slowest)
    finally:
        for queue in commands:
            queue.put(None)
        for worker in workers:
            worker.join()
    return {key: statistics.median(values) for key, values in rates.items()}


def bench_read(sizes: list[int], rows: int, reps: int) -> dict[str, float]:
    """Seconds to read 100 random rows and all rows, from one file and from two joined shards."""
    spec = ParamSpec.from_module(mlp(sizes))
    generator = np.random.default_rng(0)
    data = generator.standard_normal((rows, spec.numel), dtype=np.float32)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with SampleStore.create(folder / "one.h5", spec, {}) as store:
            store.append_many(data, steps=np.arange(rows), chains=np.arange(rows) * 2 // rows)
        for rank in range(2):
            part = slice(rank * rows // 2, (rank + 1) * rows // 2)
            with SampleStore.create(folder / f"shard-{rank}.h5", spec, {}) as store:
                store.append_many(data[part], steps=np.arange(rows)[part], chains=rank)
        join_stores(folder / "joined.h5", [folder / "shard-0.h5", folder / "shard-1.h5"])
        picks = [generator.integers(0, rows, 100) for _ in range(reps)]
        for name in ("one", "joined"):
            with SampleStore.open(folder / f"{name}.h5") as store:
                store.read_all()  # into the page cache
                assert np.array_equal(store.read(picks[0]).numpy(), data[picks[0]])
                random_times, all_times = [], []
                for pick in picks:
                    began = time.perf_counter()
                    store.read(pick)
                    random_times.append(time.perf_counter() - began)
                    began = time.perf_counter()
                    store.read_all()
                    all_times.append(time.perf_counter() - began)
                out[f"{name} random"] = statistics.median(random_times)
                out[f"{name} all"] = statistics.median(all_times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median taken)")
    parser.add_argument("--steps", type=int, default=300, help="SGLD iterations per timed block")
    parser.add_argument("--rows", type=int, default=400, help="rows of the stores read")
    parser.add_argument("--nets", default="fcNN1,fcNN2")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("sample")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} usable cores; load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"{'net':<6} {'two-thread chain':>17} {'W = 1':>10} {'W = 2':>10}   W=2 / two-thread   W=1 / two-thread"
          "   (total SGLD steps per second)")
    speed_ups = {}
    for name in args.nets.split(","):
        rates = bench_net(name, NETS[name], args.reps, args.steps)
        speed_ups[name] = rates["W = 2"] / rates["two-thread chain"], rates["W = 1"] / rates["two-thread chain"]
        two = rates["two-thread chain"]
        print(f"{name:<6} {two:>17.0f} {rates['W = 1']:>10.0f} {rates['W = 2']:>10.0f}   "
              f"{rates['W = 2'] / two:>16.2f}   {rates['W = 1'] / two:>16.2f}")
    print(f"\nreading {args.rows} fcNN1 rows: one file vs two shards joined (virtual dataset), page cache warm")
    times = bench_read(NETS["fcNN1"], args.rows, args.reps)
    labels = {"random": "100 random rows", "all": f"all {args.rows} rows in order"}
    for what, label in labels.items():
        one, joined = times[f"one {what}"], times[f"joined {what}"]
        print(f"  {label:<22} one file {1e3 * one:8.2f} ms   joined {1e3 * joined:8.2f} ms   "
              f"joined / one file {joined / one:.2f}")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    record.add("SGLD steps per second, paper's SGLD, batch 100: two one-thread workers (`workers = 2`) and one "
               "one-thread chain, each over one two-thread chain (`bench_chains.py`)",
               "; ".join(f"{name} {two:.2f}× and {one:.2f}×" for name, (two, one) in speed_ups.items()))
    record.add(f"reading a store of two shards joined (HDF5 virtual dataset) over one file, {args.rows} fcNN1 rows",
               ", ".join(f"{label} {times[f'joined {what}'] / times[f'one {what}']:.2f}×"
                         for what, label in labels.items()))
    record.write(args.out)


if __name__ == "__main__":
    main()
