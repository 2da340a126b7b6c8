"""Batched prediction over many weight vectors vs a per-network loop, side by side in one run.

Shapes: K = 100 fcNN1 (784-100-10) networks on N = 10,000 inputs (evaluation), and K = 1,000 on N = 1,
10, 100 (what attacks and active learning see). Prints time per network for `predict_probs` and for a
loop of `vector_to_parameters` + forward, their ratio, the achieved GFLOP/s as a fraction of a plain
4096×4096 float32 matmul timed in the same run, the bfloat16 path's speed-up and largest probability
error, and the process's peak memory. An optional argument sets torch's thread count.

Targets on a 2-core CPU: ≥ 0.7 of the matmul rate at N = 10,000; ≥ 2× the loop at N = 1 and 10;
≥ 1.3× at N = 100; peak memory under 2 GB at K = 1,000.
"""

from __future__ import annotations

import resource

import torch
from record import BenchmarkRecord, parse_threads_and_out
from timing import best_time, loop_predict

from apd.nets import ParamSpec, mlp, predict_probs

SIZES = [784, 100, 10]
CASES = [(100, 10_000), (1_000, 1), (1_000, 10), (1_000, 100)]


def matmul_gflops() -> float:
    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    return 2 * 4096**3 / best_time(lambda: a @ b, 5) / 1e9


def main() -> None:
    args = parse_threads_and_out(__doc__.splitlines()[0])
    record = BenchmarkRecord("evaluate")
    torch.manual_seed(0)
    net = mlp(SIZES)
    spec = ParamSpec.from_module(net)
    flops_per_input = 2 * sum(a * b for a, b in zip(SIZES[:-1], SIZES[1:], strict=True))
    peak = matmul_gflops()
    print(f"threads {torch.get_num_threads()}; 4096² float32 matmul: {peak:.0f} GFLOP/s\n")
    header = (f"{'K':>5} {'N':>6} | {'batched ms/net':>14} {'loop ms/net':>11} {'ratio':>6} | "
              f"{'GFLOP/s':>7} {'of matmul':>9} | {'bf16 speed-up':>13} {'bf16 max err':>12}")
    print(header)
    print("-" * len(header))
    measured = {}
    for k, n in CASES:
        weights = torch.randn(k, spec.numel) * 0.05
        x = torch.randn(n, SIZES[0])
        repeats = 3 if n >= 10_000 else 5
        with torch.no_grad():
            t_batch = best_time(lambda w=weights, x=x: predict_probs(spec, w, x), repeats)
            t_loop = best_time(lambda w=weights, x=x: loop_predict(net, w, x), repeats)
            t_bf16 = best_time(lambda w=weights, x=x: predict_probs(spec, w, x, compute_dtype=torch.bfloat16),
                               repeats)
            err = (predict_probs(spec, weights, x, compute_dtype=torch.bfloat16)
                   - predict_probs(spec, weights, x)).abs().max().item()
        gflops = flops_per_input * n * k / t_batch / 1e9
        measured[k, n] = {"ratio": t_loop / t_batch, "of_matmul": gflops / peak, "bf16": t_batch / t_bf16,
                          "bf16_error": err}
        print(f"{k:>5} {n:>6} | {1e3 * t_batch / k:>14.4f} {1e3 * t_loop / k:>11.4f} "
              f"{t_loop / t_batch:>5.2f}× | {gflops:>7.1f} {gflops / peak:>9.2f} | "
              f"{t_batch / t_bf16:>12.2f}× {err:>12.1e}")
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\npeak memory of this process (RSS, includes K = 1,000 weight matrices): {peak_rss:.2f} GB")
    threads = f"{torch.get_num_threads()} thread(s)"
    small = [(k, n) for k, n in CASES if n < 10_000]
    record.add(f"`predict_probs` vs a `vector_to_parameters` loop, fcNN1, K = {small[0][0]:,}, {threads} "
               "(`bench_predict.py`)", "; ".join(f"N = {n}: {measured[k, n]['ratio']:.2f}×" for k, n in small),
               "≥ 2×, ≥ 2×, ≥ 1.3×")
    k, n = CASES[0]
    record.add(f"same, K = {k}, N = {n:,}", f"{measured[k, n]['of_matmul']:.3f} of the 4096² matmul rate timed "
               f"in the same run ({measured[k, n]['ratio']:.2f}× the loop)", "≥ 0.7 of the matmul rate")
    record.add(f"peak memory, K = {small[0][0]:,} fcNN1", f"{peak_rss:.2f} GB", "< 2 GB")
    record.add("bfloat16 compute option: speed-up over float32, largest probability error",
               "; ".join(f"N = {n:,}: {m['bf16']:.1f}×" for (_, n), m in measured.items())
               + f"; error ≤ {max(m['bf16_error'] for m in measured.values()):.1e}")
    record.write(args.out)


if __name__ == "__main__":
    main()
