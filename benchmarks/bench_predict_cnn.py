"""Batched prediction over many LeNet-5 weight vectors against the path it replaced, a per-network loop and
the convolution roofline, side by side in one run.

`predict_logits` on a CNN (`apd.nets.network(..., conv=[6, 16])`, 61,706 weights) works in blocks of networks ×
images: each block of images has its first-layer patches unfolded once at each pooling offset, multiplied
by a block of networks' filters side by side in one matrix product per offset (blocks small enough to stay
in a core's cache), the four products reduced by their maximum before the bias and ReLU; the later
convolution is grouped (one group a network) on channels-last maps, the head batched matrix products over
400 images at once. The path it
replaced took blocks of `auto_chunk` networks (one network at evaluation sizes) over all the images at once,
its first convolution a `conv2d` with the block's filters. The loop copies each vector into the module
(`vector_to_parameters`) and runs it. The roofline is the time the same floating-point operations take at
the rate of one large `conv2d` (64 × 32 × 32 × 32 channels-last inputs, 64 filters of 5 × 5 × 32) for the
convolutions and of a 2048² matmul for the dense layers, both timed in the same run.

Shapes: K = 100 networks on N = 2,000 images (a run's ensemble in evaluation), and K = 200 on N = 1, 10, 100
(attacks, active learning). Prints each path's time per network, the batched path's fraction of the
roofline at N = 2,000 and its speed-up over the others, and its largest probability difference from the
loop. An optional argument sets torch's thread count (default 2, evaluation's); ``--out FILE`` writes the
record.

Targets on a 2-core CPU at N = 2,000: ≥ 0.5 of the roofline and ≥ 3× the replaced path; ≥ 2× the loop at
N = 1 and 10.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from record import BenchmarkRecord, parse_threads_and_out
from timing import best_times, loop_predict

from apd.nets import (
    KERNEL,
    ParamSpec,
    _by_start,
    _cnn_head,
    _later_convolutions,
    _max_pool,
    auto_chunk,
    network,
    predict_probs,
)
from apd.nets import softmax_over_classes as softmax

SIZES, CONV = [784, 120, 84, 10], [6, 16]
EVALUATION = (100, 2_000)
SMALL = [(200, 1), (200, 10), (200, 100)]
CONV_INPUTS, CONV_FILTERS = (64, 32, 32, 32), (64, 32, KERNEL, KERNEL)
MATMUL = 2048


def seeded_lenet5() -> tuple[torch.nn.Module, ParamSpec]:
    """LeNet-5 (:data:`SIZES`, :data:`CONV`) and its spec, drawn after seeding torch with 0."""
    torch.manual_seed(0)
    net = network(SIZES, CONV)
    return net, ParamSpec.from_module(net)


def flops(spec: ParamSpec, side: int = 28) -> tuple[int, int]:
    """2 × multiply-adds per image of the convolutions (output positions × filters × filter size; the first
    padded, each pooled 2 × 2) and of the dense layers of the LeNet-style ``spec``."""
    conv = 0
    for layer, (_, _, out, inputs) in enumerate(spec.conv_layers()):
        side = side if layer == 0 else side - KERNEL + 1
        conv += 2 * side * side * out * inputs * KERNEL * KERNEL
        side //= 2
    return conv, sum(2 * out * inputs for _, _, out, inputs in spec.linear_layers())


def replaced_path(spec: ParamSpec, weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Logits [K, N, C] as `predict_logits` computed them before: blocks of `auto_chunk` networks over all the
    images, the first convolution one `conv2d` with the block's filters, then the later convolutions and the head
    as now."""
    convs, layers = spec.conv_layers(), spec.linear_layers()
    chunk = auto_chunk(len(x), spec.activation_width(x.shape[1]), len(weights))
    images = x.view(len(x), 1, 28, 28)
    out = []
    for start in range(0, len(weights), chunk):
        params = _by_start(spec, weights[start:start + chunk])
        w_start, b_start, _, _ = convs[0]
        first = F.conv2d(images, params[w_start].reshape(-1, 1, KERNEL, KERNEL), params[b_start].reshape(-1),
                         padding=KERNEL // 2)
        out.append(_cnn_head(layers, params, _later_convolutions(convs, params, _max_pool(first).relu_())))
    return torch.cat(out)


def rates() -> tuple[float, float]:
    """GFLOP/s of the large convolution and of the matmul, the fastest of interleaved calls."""
    inputs = torch.randn(*CONV_INPUTS).contiguous(memory_format=torch.channels_last)
    filters, a, b = torch.randn(*CONV_FILTERS), torch.randn(MATMUL, MATMUL), torch.randn(MATMUL, MATMUL)
    times = best_times({"conv": lambda: F.conv2d(inputs, filters), "matmul": lambda: a @ b}, 5)
    side = CONV_INPUTS[2] - KERNEL + 1
    conv = 2 * CONV_INPUTS[0] * side * side * CONV_FILTERS[0] * CONV_FILTERS[1] * KERNEL * KERNEL
    return conv / times["conv"] / 1e9, 2 * MATMUL**3 / times["matmul"] / 1e9


def timed(spec: ParamSpec, net: torch.nn.Module, k: int, n: int) -> dict[str, float]:
    """Seconds of the batched path, the replaced one and the loop on k random networks and n images, their
    calls interleaved, and the batched path's largest probability difference from the loop."""
    weights, x = torch.randn(k, spec.numel) * 0.05, torch.randn(n, SIZES[0])
    paths = {"batched": lambda: predict_probs(spec, weights, x),
             "replaced": lambda: softmax(replaced_path(spec, weights, x)),
             "loop": lambda: loop_predict(net, weights, x)}
    times = best_times(paths, 5)  # the fastest of 5 interleaved calls: this shared machine is noisy
    return {**times, "diff": (paths["batched"]() - paths["loop"]()).abs().max().item()}


def main() -> None:
    args = parse_threads_and_out(__doc__.splitlines()[0], default_threads=2)
    record = BenchmarkRecord("evaluate")
    net, spec = seeded_lenet5()
    conv_flops, dense_flops = flops(spec)
    threads = torch.get_num_threads()
    print(f"threads {threads}; LeNet-5, {spec.numel:,} weights, {(conv_flops + dense_flops) / 1e6:.3f} MFLOP an "
          "image\n")
    header = (f"{'K':>5} {'N':>6} | {'batched ms/net':>14} {'replaced':>9} {'loop':>9} | {'×replaced':>9} "
              f"{'×loop':>7} | {'max diff':>8}")
    print(header)
    print("-" * len(header))
    measured = {}
    with torch.no_grad():
        for k, n in [EVALUATION, *SMALL]:
            t = measured[n] = timed(spec, net, k, n)
            print(f"{k:>5} {n:>6} | {1e3 * t['batched'] / k:>14.4f} {1e3 * t['replaced'] / k:>9.4f} "
                  f"{1e3 * t['loop'] / k:>9.4f} | {t['replaced'] / t['batched']:>8.2f}× "
                  f"{t['loop'] / t['batched']:>6.2f}× | {t['diff']:>8.1e}")
        conv_rate, matmul_rate = rates()
    k, n = EVALUATION
    t = measured[n]
    roofline = k * n * (conv_flops / conv_rate + dense_flops / matmul_rate) / 1e9
    print(f"\nroofline at K = {k}, N = {n:,}: {roofline:.2f} s (conv2d {conv_rate:.0f} GFLOP/s, matmul "
          f"{matmul_rate:.0f} GFLOP/s); batched {t['batched']:.2f} s: {roofline / t['batched']:.2f} of it")
    record.add(f"`predict_probs` on LeNet-5, K = {k} networks on N = {n:,} images, {threads} thread(s), against the "
               "convolution roofline (one large conv2d, and a matmul for the dense layers, of the same FLOPs, timed in "
               "the same run) and against the path it replaced (`bench_predict_cnn.py`)",
               f"{roofline / t['batched']:.2f} of the roofline (conv2d {conv_rate:.0f} GFLOP/s, matmul "
               f"{matmul_rate:.0f} GFLOP/s); {t['replaced'] / t['batched']:.2f}× the replaced path, "
               f"{t['loop'] / t['batched']:.2f}× the loop", "≥ 0.5 of the roofline, ≥ 3× the replaced path")
    record.add(f"same against a `vector_to_parameters` loop (and the replaced path), K = {SMALL[0][0]}",
               "; ".join(f"N = {n:,}: {measured[n]['loop'] / measured[n]['batched']:.2f}× "
                         f"({measured[n]['replaced'] / measured[n]['batched']:.2f}×)" for _, n in SMALL),
               "≥ 2×, ≥ 2×, –")
    record.write(args.out)


if __name__ == "__main__":
    main()
