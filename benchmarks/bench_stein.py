"""Stein thinning at the project's sizes: 1,000 candidates → 20 picks for the digits net (64-100-10,
D = 7,510, N = 1,000 training examples) and fcNN1 (784-100-10, D = 79,510, N = 50,000).

Run: ``.venv/bin/python benchmarks/bench_stein.py [--fcnn1-gradients 20] [--out FILE]`` (one thread). It prints

* the time of the full-training-set scores ∇ log p(θ | D) (``log_posterior_gradients``) for the
  candidates: all 1,000 for digits; for fcNN1 (about 1.2·10¹⁰ multiply-adds per candidate) a smaller
  number, scaled to 1,000 (the cost is linear in the candidates);
* the time of the greedy selection (``stein_thin``, "sclmed"), which costs O(candidates·D) per pick;
* for LeNet-5 (D = 61,706), the scores of 20 candidates on N = 10,000 images in blocks of networks ×
  images (``apd.nets.gradient_blocks``) against one network at a time, interleaved, best of two: the
  ratio is what Stein's loading saves on the CNN pipeline.

Inputs are random (digits-sized and Fashion-MNIST-sized Gaussian pixels, a fresh network's weights
plus N(0, 0.05²) per candidate): the cost depends only on the sizes. The ``stein-thinning`` package's
own ``thin`` is not run here: it builds a dense D×D preconditioner (451 MB at D = 7,510, where one pick
took 62 s on this machine's single thread; 50.6 GB at D = 79,510).
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_predict_cnn import seeded_lenet5
from record import BenchmarkRecord, add_out_argument

from apd.nets import ParamSpec, mlp
from apd.posteriors.stein import log_posterior_gradients, stein_thin


def case(sizes: list[int], n_train: int, candidates: int, timed: int, picks: int) -> tuple[float, float]:
    """Seconds of the scores of all ``candidates`` (scaled from ``timed``) and of the selection."""
    torch.manual_seed(0)
    net = mlp(sizes)
    spec = ParamSpec.from_module(net)
    weights = spec.flatten(net) + 0.05 * torch.randn(candidates, spec.numel)
    x, y = torch.randn(n_train, sizes[0]), torch.randint(sizes[-1], (n_train,))
    start = time.perf_counter()
    gradients = log_posterior_gradients(spec, weights[:timed], x, y, prior_var=0.02)
    seconds = time.perf_counter() - start
    scores = seconds * candidates / timed  # the cost is linear in the candidates
    print(f"D = {spec.numel:,}, N = {n_train:,}: scores of {timed} candidates {seconds:.1f} s "
          f"(→ {scores:.0f} s for {candidates:,})")
    gradients = gradients.repeat((candidates + timed - 1) // timed, 1)[:candidates]
    gradients += torch.randn_like(gradients)  # distinct scores for the candidates that were not timed
    start = time.perf_counter()
    chosen = stein_thin(weights, gradients, picks)
    selection = time.perf_counter() - start
    print(f"D = {spec.numel:,}: Stein thinning {candidates:,} → {picks} in {selection:.1f} s "
          f"({len(set(chosen.tolist()))} distinct)")
    return scores, selection


def cnn_blocks_against_one_at_a_time(candidates: int = 20, n_train: int = 10_000) -> tuple[float, float]:
    """Best-of-two seconds of LeNet-5's scores of ``candidates`` networks: one at a time, then in blocks."""
    net, spec = seeded_lenet5()
    weights = spec.flatten(net) + 0.05 * torch.randn(candidates, spec.numel)
    x, y = torch.rand(n_train, 784), torch.randint(10, (n_train,))

    def one_at_a_time() -> torch.Tensor:
        return torch.cat([log_posterior_gradients(spec, row[None], x, y, prior_var=0.02) for row in weights])

    def in_blocks() -> torch.Tensor:
        return log_posterior_gradients(spec, weights, x, y, prior_var=0.02)

    best, scores = {one_at_a_time: float("inf"), in_blocks: float("inf")}, {}
    for _ in range(2):
        for path in best:
            start = time.perf_counter()
            scores[path] = path()
            best[path] = min(best[path], time.perf_counter() - start)
    reference = scores[one_at_a_time]
    difference = float((scores[in_blocks] - reference).abs().max() / reference.abs().max())
    print(f"LeNet-5, {candidates} candidates on N = {n_train:,}: one at a time {best[one_at_a_time]:.1f} s, "
          f"in blocks {best[in_blocks]:.1f} s ({best[one_at_a_time] / best[in_blocks]:.1f}×; largest "
          f"difference {difference:.1e} of the largest score)")
    return best[one_at_a_time], best[in_blocks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fcnn1-gradients", type=int, default=20, help="fcNN1 candidates whose scores are timed")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("evaluate")
    torch.set_num_threads(1)
    digits = case([64, 100, 10], 1_000, 1_000, 1_000, 20)
    fcnn1 = case([784, 100, 10], 50_000, 1_000, args.fcnn1_gradients, 20)
    record.add("Stein thinning, 1,000 candidates → 20, 1 thread: full-data scores, then the greedy selection "
               "(`bench_stein.py`)", f"digits (D = 7,510, N = 1,000) {digits[0]:.1f} s + {digits[1]:.1f} s; fcNN1 "
               f"(D = 79,510, N = 50,000) {fcnn1[0]:.0f} s (scaled from {args.fcnn1_gradients}) + {fcnn1[1]:.1f} s")
    single, blocks = cnn_blocks_against_one_at_a_time()
    record.add("LeNet-5's full-data scores, 20 candidates on 10,000 images, 1 thread: in blocks of networks × "
               "images against one network at a time (`bench_stein.py`)",
               f"{single:.1f} s → {blocks:.1f} s ({single / blocks:.1f}×)")
    record.write(args.out)


if __name__ == "__main__":
    main()
