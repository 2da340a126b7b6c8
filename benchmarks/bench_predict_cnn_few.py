"""A few LeNet-5 networks on many images: the images convolved directly against the patches path, side by
side in one run.

`predict_logits` on a CNN block of at most `_CNN_DIRECT_NETWORKS` networks convolves the images themselves,
each network's first filters as ordinary output channels (`_cnn_direct_logits`); larger blocks build each
block of images' first-layer patches at every pooling offset and multiply them by the block's filters side
by side (`_cnn_logits`). Building the patches is a strided copy of 25 numbers per pixel, worth it only when
many networks share it. This benchmark times both paths for K = 1 to 8 networks on N = 4,000 images (an SGD
network, an MC-dropout trunk, four kept samples, an attacked network), best of 5 interleaved calls, and
prints their ratio and largest logit difference: the threshold is the largest K at which the direct path is
faster. An optional argument sets torch's thread count (default 1); ``--out FILE`` writes the record.
"""

from __future__ import annotations

import torch
from bench_predict_cnn import SIZES, seeded_lenet5
from record import BenchmarkRecord, parse_threads_and_out
from timing import best_times

from apd.nets import _CNN_CACHE_ELEMENTS, POOL, _cnn_direct_logits, _cnn_logits

NETWORKS, IMAGES = (1, 2, 3, 4, 6, 8), 4_000


def main() -> None:
    args = parse_threads_and_out(__doc__.splitlines()[0], default_threads=1)
    record = BenchmarkRecord("evaluate")
    net, spec = seeded_lenet5()
    x = torch.rand(IMAGES, SIZES[0])
    ratios = {}
    with torch.no_grad():
        for k in NETWORKS:
            weights = spec.flatten(net) + 0.05 * torch.randn(k, spec.numel)
            images = max(1, _CNN_CACHE_ELEMENTS * POOL * POOL // (k * spec.activation_width(SIZES[0])))
            paths = {"direct": lambda w=weights: _cnn_direct_logits(spec, w, x),
                     "patches": lambda w=weights, b=images: _cnn_logits(spec, w, x, len(w), b)}
            times = best_times(paths, 5)
            ratios[k] = times["patches"] / times["direct"]
            diff = (paths["direct"]() - paths["patches"]()).abs().max().item()
            print(f"K = {k}: direct {1e3 * times['direct']:.0f} ms, patches {1e3 * times['patches']:.0f} ms "
                  f"({ratios[k]:.2f}×), largest logit difference {diff:.1e}")
    record.add(f"LeNet-5, K networks on N = {IMAGES:,} images, {torch.get_num_threads()} thread(s): the images "
               "convolved directly against the first layer's patches (`bench_predict_cnn_few.py`)",
               "; ".join(f"K = {k}: {r:.2f}×" for k, r in ratios.items()))
    record.write(args.out)


if __name__ == "__main__":
    main()
