"""Batched prediction over many LeNet-5 weight vectors vs a per-network loop, side by side in one run.

`predict_probs` on a CNN (`apd.nets.network(..., conv=[6, 16])`, 61,706 weights) runs the first convolution of
a chunk of networks as one convolution with all their filters, the later ones grouped on channels-last maps,
and pools by elementwise maxima of strided views; the loop copies each vector into the module
(`vector_to_parameters`) and runs it, with its `nn.MaxPool2d`. From N = 100 on most of the gain is the
pooling, whose `F.max_pool2d` forward is the slowest step of the module on this CPU. Shapes: K = 20 networks
on N = 2,000 inputs (evaluation), K = 200 on N = 1, 10, 100 (attacks, active learning). Prints time per
network for both, and their ratio. An optional argument sets torch's thread count; ``--out FILE`` writes the record.

Targets on a 2-core CPU: no slower than the loop at N = 2,000 (≥ 1×); ≥ 2× at N = 1 and 10.
"""

from __future__ import annotations

import torch
from record import BenchmarkRecord, parse_threads_and_out
from timing import best_time, loop_predict

from apd.nets import ParamSpec, network, predict_probs

SIZES, CONV = [784, 120, 84, 10], [6, 16]
CASES = [(20, 2_000), (200, 1), (200, 10), (200, 100)]


def main() -> None:
    args = parse_threads_and_out(__doc__.splitlines()[0])
    record = BenchmarkRecord("evaluate")
    torch.manual_seed(0)
    net = network(SIZES, CONV)
    spec = ParamSpec.from_module(net)
    print(f"threads {torch.get_num_threads()}; LeNet-5, {spec.numel:,} weights\n")
    header = f"{'K':>5} {'N':>6} | {'batched ms/net':>14} {'loop ms/net':>11} {'ratio':>6} | {'max diff':>8}"
    print(header)
    print("-" * len(header))
    ratios = {}
    for k, n in CASES:
        weights = torch.randn(k, spec.numel) * 0.05
        x = torch.randn(n, SIZES[0])
        with torch.no_grad():
            t_batch = best_time(lambda w=weights, x=x: predict_probs(spec, w, x), 3)
            t_loop = best_time(lambda w=weights, x=x: loop_predict(net, w, x), 3)
            diff = (predict_probs(spec, weights, x) - loop_predict(net, weights, x)).abs().max().item()
        ratios[n] = t_loop / t_batch
        print(f"{k:>5} {n:>6} | {1e3 * t_batch / k:>14.4f} {1e3 * t_loop / k:>11.4f} {t_loop / t_batch:>5.2f}× | "
              f"{diff:>8.1e}")
    record.add(f"`predict_probs` vs a loop, LeNet-5, K = {CASES[1][0]} (K = {CASES[0][0]} at N = {CASES[0][1]:,}), "
               f"{torch.get_num_threads()} thread(s) (`bench_predict_cnn.py`)",
               "; ".join(f"N = {n:,}: {ratios[n]:.2f}×" for n in sorted(ratios)), "≥ 2×, ≥ 2×, –, ≥ 1×")
    record.write(args.out)


if __name__ == "__main__":
    main()
