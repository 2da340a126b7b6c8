"""SGLD chain-steps per second of C chains stepped together (:class:`apd.samplers.chain.SGLDChains`), the
batched gradient against ``torch.func.vmap``, several worker processes against one, and the joined store's
read speed against one file.

Chains take the paper's SGLD (lr 0.05, N 50,000, prior variance 0.02, batch 100) for fcNN1 784-100-10 and
fcNN2 784-400-400-10 on random MNIST-shaped data resident on the device (50,000 rows on a GPU, 5,000 on
the CPU; a minibatch gather costs the same whatever the pixels). Every rate is a median over repetitions
timed in interleaved blocks, so drift on a shared machine hits all alike.

- ``C chains``: one process, torch on 1 thread on the CPU; chain-steps per second = C × iterations / s.
  Target on the CPU: C = 8 at least as fast per chain-step as C = 1. On CUDA (the card is named in the
  record): C = 1 … 1,024 fcNN1 chains, the step recorded as a CUDA graph (the default), the fused update
  (Triton) replayed kernel by kernel, and a torch generator per chain; then the graph with TF32 matmuls,
  for scale only (the pipeline multiplies in float32).
- ``vmap``: the gradient of C chains' minibatch NLL as the project computes it (one batched forward and
  backward, :func:`apd.nets.per_network_logits`) against ``vmap(grad(functional_call))`` over stacked
  parameters (``torch.func``), at C = 8 on the CPU and C = 256 on CUDA.
- ``workers``: two processes (spawn), one chain and one thread each, against one chain on two threads.
- ``reading``: a store of R rows of four chains as one file and as two shards of two chains each joined
  (HDF5 virtual dataset), read from the shards (as :class:`~apd.samplers.store.SampleStore` reads a joined
  store) and through HDF5's own mapping.

Run: .venv/bin/python benchmarks/bench_chains.py [--reps 5] [--steps 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from record import BenchmarkRecord, add_out_argument

from apd.config import SGLDConfig
from apd.nets import ParamSpec, mlp, network, per_network_logits
from apd.samplers.chain import ChainSeeds, SGLDChains
from apd.samplers.sgld import prefetch_pays
from apd.samplers.store import SampleStore
from apd.samplers.store_join import join_stores

NETS = {"fcNN1": [784, 100, 10], "fcNN2": [784, 400, 400, 10]}
CONFIG = SGLDConfig(lr=0.05, prior_var=0.02, batch_size=100, iterations=10**9, burn_in=0)
NUM_DATA = 50_000


def make_chains(sizes: list[int], chains: int, device: torch.device, prefetch: bool = False,
                fused: bool | None = None, graph: bool | None = None) -> SGLDChains:
    """``chains`` chains on random data (``NUM_DATA`` rows on CUDA, 5,000 on the CPU) with the paper's N;
    ``fused=False`` makes CUDA chains draw their noise from torch generators, ``graph=False`` steps the fused
    update without recording the step as a CUDA graph."""
    rows = NUM_DATA if device.type == "cuda" else 5_000
    generator = torch.Generator().manual_seed(chains)
    x = (torch.rand(rows, sizes[0], generator=generator) * 2 - 1).to(device)
    y = torch.randint(0, sizes[-1], (rows,), generator=generator).to(device)
    batch = SGLDChains(sizes, CONFIG, list(range(chains)), x, y,
                       [ChainSeeds(3 * c, 3 * c + 1, 3 * c + 2) for c in range(chains)], prefetch, fused_update=fused,
                       cuda_graph=graph)
    batch.num_data = NUM_DATA  # the paper's N, not the random subset's
    return batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    began = time.perf_counter()
    work()
    _sync(device)
    return time.perf_counter() - began


def chain_step_rates(sizes: list[int], counts: list[int], device: torch.device, reps: int, steps: int,
                     fused: bool | None = None, graph: bool | None = None) -> dict[int, float]:
    """Median chain-steps per second of each chain count, timed in interleaved blocks of ``steps``."""
    batches = {c: make_chains(sizes, c, device, prefetch_pays(device), fused, graph) for c in counts}
    clock = {c: 0 for c in counts}
    rates: dict[int, list[float]] = {c: [] for c in counts}

    def block(c: int) -> None:
        for t in range(clock[c], clock[c] + steps):
            batches[c].step(t)
        clock[c] += steps
        if graph and not batches[c].graph_recorded:
            raise RuntimeError(f"C = {c}: the CUDA graph was not recorded; these would be eager rates")

    for rep in range(reps + 1):  # the first round warms up and is dropped
        for c in counts:
            seconds = timed(lambda c=c: block(c), device)
            if rep:
                rates[c].append(c * steps / seconds)
    return {c: statistics.median(values) for c, values in rates.items()}


def gradient_rates(sizes: list[int], chains: int, device: torch.device, reps: int, steps: int) -> dict[str, float]:
    """Chain-gradients per second: the project's batched forward and backward against vmap over
    ``functional_call`` and ``grad``."""
    net = network(sizes).to(device)
    spec = ParamSpec.from_module(net)
    theta = torch.randn(chains, spec.numel, device=device) * 0.05
    x = torch.rand(chains, CONFIG.batch_size, sizes[0], device=device) * 2 - 1
    y = torch.randint(0, sizes[-1], (chains, CONFIG.batch_size), device=device)

    def batched() -> None:
        weights = theta.detach().requires_grad_(True)
        logits = per_network_logits(spec, weights, x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(chains, -1).mean(1)
        torch.autograd.grad(loss.sum(), weights)

    stacked = {name: value.detach() for name, value in spec.unflatten(theta).items()}

    def one_chain_loss(params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(net, params, (xb,)), yb)

    vmapped_grad = torch.func.vmap(torch.func.grad(one_chain_loss))

    def vmapped() -> None:
        vmapped_grad(stacked, x, y)

    ways = {"batched": batched, "vmap": vmapped}
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for rep in range(reps + 1):
        for name, work in ways.items():
            seconds = timed(lambda work=work: [work() for _ in range(steps)], device)
            if rep:
                rates[name].append(chains * steps / seconds)
    return {name: statistics.median(values) for name, values in rates.items()}


def _worker(rank: int, sizes: list[int], commands: mp.Queue, results: mp.Queue) -> None:
    """A sampling worker: one thread, one chain; runs the number of steps it is sent."""
    torch.set_num_threads(1)
    batch = make_chains(sizes, 1, torch.device("cpu"), prefetch_pays(torch.device("cpu"), processes=2))
    for t in range(20):
        batch.step(t)
    results.put(("ready", rank, 0.0))
    t = 20
    while (steps := commands.get()) is not None:
        began = time.perf_counter()
        for step in range(t, t + steps):
            batch.step(step)
        results.put(("done", rank, time.perf_counter() - began))
        t += steps


def worker_rates(sizes: list[int], reps: int, steps: int) -> dict[str, float]:
    """Median total steps per second of two one-thread workers and of one chain on two threads."""
    context = mp.get_context("spawn")
    commands = [context.Queue() for _ in range(2)]
    results = context.Queue()
    workers = [context.Process(target=_worker, args=(rank, sizes, commands[rank], results)) for rank in range(2)]
    for worker in workers:
        worker.start()
    for _ in workers:
        results.get()
    cpu = torch.device("cpu")
    two_thread = make_chains(sizes, 1, cpu)
    rates: dict[str, list[float]] = {"two-thread chain": [], "W = 2": []}
    t = 0
    try:
        for rep in range(reps + 1):
            torch.set_num_threads(2)
            seconds = timed(lambda t=t: [two_thread.step(s) for s in range(t, t + steps)], cpu)
            torch.set_num_threads(1)
            for queue in commands:
                queue.put(steps)
            slowest = max(results.get()[2] for _ in workers)
            t += steps
            if rep:
                rates["two-thread chain"].append(steps / seconds)
                rates["W = 2"].append(2 * steps / slowest)
    finally:
        for queue in commands:
            queue.put(None)
        for worker in workers:
            worker.join()
    return {key: statistics.median(values) for key, values in rates.items()}


def bench_read(sizes: list[int], rows: int, reps: int) -> dict[str, float]:
    """Seconds to read 100 random rows and all rows of a store of four chains: from one file, from two shards
    of two chains each (written interleaved, as a worker stepping them together writes them) joined, as
    :class:`SampleStore` reads them (from the shards), and through HDF5's own mapping of the virtual dataset."""
    spec = ParamSpec.from_module(mlp(sizes))
    generator = np.random.default_rng(0)
    data = generator.standard_normal((rows, spec.numel), dtype=np.float32)  # rows ordered by chain, as joined
    per_chain = rows // 4
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with SampleStore.create(folder / "one.h5", spec, {}) as store:
            store.append_many(data, steps=np.arange(rows), chains=np.arange(rows) // per_chain)
        for rank in range(2):
            chains = [rank, rank + 2]
            interleaved = np.stack([data[c * per_chain:(c + 1) * per_chain] for c in chains], axis=1)
            with SampleStore.create(folder / f"shard-{rank}.h5", spec, {}) as store:
                store.append_many(interleaved.reshape(-1, spec.numel), steps=np.arange(per_chain).repeat(2),
                                  chains=np.tile(chains, per_chain))
        join_stores(folder / "joined.h5", [folder / "shard-0.h5", folder / "shard-1.h5"])
        picks = [generator.integers(0, rows, 100) for _ in range(reps)]
        for name in ("one", "joined", "mapped"):
            with SampleStore.open(folder / f"{'joined' if name == 'mapped' else name}.h5") as store:
                if name == "mapped":  # no shard reader: HDF5 reads the virtual dataset itself, as before
                    store._shards.close()
                    store._shards = None
                store.read_all()  # into the page cache
                assert np.array_equal(store.read(picks[0]).numpy(), data[picks[0]])
                random_times, all_times = [], []
                for pick in picks:
                    random_times.append(timed(lambda pick=pick: store.read(pick), torch.device("cpu")))
                    all_times.append(timed(store.read_all, torch.device("cpu")))
                out[f"{name} random"] = statistics.median(random_times)
                out[f"{name} all"] = statistics.median(all_times)
    return out


def cpu_rows(record: BenchmarkRecord, nets: list[str], reps: int, steps: int) -> None:
    cpu = torch.device("cpu")
    torch.set_num_threads(1)
    print("\nCPU, 1 thread: chain-steps per second of C chains stepped together")
    found = {}
    for name in nets:
        rates = chain_step_rates(NETS[name], [1, 8, 32], cpu, reps, steps)
        found[name] = rates
        print(f"  {name:<6} " + "   ".join(f"C = {c}: {rate:7.0f}" for c, rate in rates.items())
              + f"   C = 8 / C = 1: {rates[8] / rates[1]:.2f}")
    record.add("SGLD chain-steps per second, C chains stepped together in one process, 1 thread, paper's SGLD, "
               "batch 100: C = 8 and C = 32 per chain-step over C = 1 (`bench_chains.py`)",
               "; ".join(f"{name} {r[8] / r[1]:.2f}× and {r[32] / r[1]:.2f}× ({r[1]:.0f} chain-steps/s at C = 1)"
                         for name, r in found.items()), "C = 8 ≥ 1×")
    grads = gradient_rates(NETS["fcNN1"], 8, cpu, reps, steps)
    print(f"  gradients of 8 fcNN1 chains: batched {grads['batched']:.0f}/s, vmap {grads['vmap']:.0f}/s "
          f"(batched / vmap {grads['batched'] / grads['vmap']:.2f})")
    record.add("gradient of C = 8 fcNN1 chains' minibatch NLL, 1 thread: one batched forward and backward over "
               "vmap(grad(functional_call))", f"{grads['batched'] / grads['vmap']:.2f}× faster")
    speed = {}
    for name in nets:
        rates = worker_rates(NETS[name], reps, steps)
        speed[name] = rates["W = 2"] / rates["two-thread chain"]
        print(f"  {name:<6} two one-thread workers / one two-thread chain: {speed[name]:.2f}")
    record.add("SGLD steps per second, two one-thread workers (`workers = 2`) over one chain on two threads",
               "; ".join(f"{name} {ratio:.2f}×" for name, ratio in speed.items()))


def cuda_rows(record: BenchmarkRecord, reps: int, steps: int) -> None:
    device = torch.device("cuda")
    card = torch.cuda.get_device_name(device)
    counts = [1, 32, 256, 1024]
    print(f"\n{card}: fcNN1 chain-steps per second, data resident on the card")
    graphed = chain_step_rates(NETS["fcNN1"], counts, device, reps, steps, graph=True)
    fused = chain_step_rates(NETS["fcNN1"], counts, device, reps, steps, graph=False)
    plain = chain_step_rates(NETS["fcNN1"], counts, device, reps, max(steps // 10, 10), fused=False)
    for c in counts:
        print(f"  C = {c:>5}: CUDA graph {graphed[c]:>10.0f}   fused update {fused[c]:>10.0f}   "
              f"torch generator per chain {plain[c]:>10.0f}")
    record.add(f"SGLD chain-steps per second on {card}, fcNN1, batch 100: the step recorded as a CUDA graph "
               "(the fused update with keyed noise, not recorded; a torch generator per chain)",
               "; ".join(f"C = {c:,}: {graphed[c]:,.0f} ({fused[c]:,.0f}; {plain[c]:,.0f})" for c in counts),
               "≥ 200,000 at C = 256, ≥ 400,000 at C = 1,024")
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = chain_step_rates(NETS["fcNN1"], counts[2:], device, reps, steps, graph=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    print("  TF32 matmuls (not what the pipeline computes): "
          + ", ".join(f"C = {c}: {tf32[c]:.0f}" for c in tf32))
    record.add(f"the same CUDA graph with TF32 matmuls on {card}, for scale (the pipeline multiplies in float32)",
               "; ".join(f"C = {c:,}: {tf32[c]:,.0f}" for c in tf32))
    grads = gradient_rates(NETS["fcNN1"], 256, device, reps, steps)
    print(f"  gradients of 256 fcNN1 chains: batched {grads['batched']:.0f}/s, vmap {grads['vmap']:.0f}/s")
    record.add(f"gradient of C = 256 fcNN1 chains on {card}: one batched forward and backward over vmap",
               f"{grads['batched'] / grads['vmap']:.2f}× faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median taken)")
    parser.add_argument("--steps", type=int, default=200, help="SGLD iterations per timed block")
    parser.add_argument("--rows", type=int, default=400, help="rows of the stores read")
    parser.add_argument("--nets", default="fcNN1,fcNN2")
    parser.add_argument("--cuda-only", action="store_true", help="only the CUDA rows (on a GPU machine)")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("sample")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} usable cores; load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if torch.cuda.is_available():
        cuda_rows(record, args.reps, args.steps)
    if not args.cuda_only:
        cpu_rows(record, args.nets.split(","), args.reps, args.steps)
        print(f"\nreading {args.rows} fcNN1 rows of four chains: one file vs two shards of two chains joined "
              "(virtual dataset), page cache warm")
        times = bench_read(NETS["fcNN1"], args.rows, args.reps)
        labels = {"random": "100 random rows", "all": f"all {args.rows} rows in order"}
        for what, label in labels.items():
            one, joined, mapped = (times[f"{name} {what}"] for name in ("one", "joined", "mapped"))
            print(f"  {label:<22} one file {1e3 * one:8.2f} ms   joined {1e3 * joined:8.2f} ms   "
                  f"through HDF5's mapping {1e3 * mapped:8.2f} ms")
        record.add(f"reading a store of four chains as two shards of two chains joined (HDF5 virtual dataset) over "
                   f"one file, {args.rows} fcNN1 rows; in brackets, read through HDF5's own mapping",
                   ", ".join(f"{label} {times[f'joined {what}'] / times[f'one {what}']:.2f}× "
                             f"({times[f'mapped {what}'] / times[f'one {what}']:.2f}×)"
                             for what, label in labels.items()))
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    record.write(args.out)


if __name__ == "__main__":
    main()
