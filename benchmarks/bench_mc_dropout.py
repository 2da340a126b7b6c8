"""MC dropout with the layers no mask reaches run once, against every pass or member running them, side by side.

Two places pay for MC dropout's passes. The MC-dropout baseline picks its epoch by the MC predictive of
``baselines.mc_passes`` passes over the validation images; `mc_dropout_probs` now runs the layers before the
first dropout once per piece of the images and only the rest once per pass (bit for bit the whole passes),
timed against the whole network per pass. The evaluation's MC-dropout ensemble (K masks as K weight vectors)
now runs the shared trunk once (`apd.nets.predict_logits_on_trunk`), timed against `predict_probs` over the K
weight vectors (float rounding apart: the largest probability difference is printed).

Networks of the Fashion pipelines (fcNN1 784-100-10, fcNN2 784-400-400-10, LeNet-5) with dropout 0.5 on
random inputs: 50 validation passes over N = 10,000 images (``mc_passes`` of fcNN2 and LeNet-5), and K = 100
members on N = 2,000 inputs. Prints seconds and speed-ups, the fastest of 3 interleaved calls. An optional
argument sets torch's thread count (default 1, the sample stage's); ``--out FILE`` writes the record, filed under
the sample stage, its ensemble row saying that it is what ``apd evaluate`` pays.
"""

from __future__ import annotations

import torch
from record import BenchmarkRecord, parse_threads_and_out
from timing import best_times

from apd.nets import network, predict_probs
from apd.posteriors import MCDropout
from apd.samplers.baselines import mc_dropout_probs

NETWORKS = {"fcNN1": ([784, 100, 10], ()), "fcNN2": ([784, 400, 400, 10], ()), "LeNet-5": ([784, 120, 84, 10], (6, 16))}
PASSES, VALIDATION = 50, 10_000
MEMBERS, INPUTS = 100, 2_000
BATCH = 4096  # mc_dropout_probs' rows per forward call


def whole_passes(net: torch.nn.Module, x: torch.Tensor, passes: int) -> torch.Tensor:
    """Every pass through the whole network, piece by piece, as `mc_dropout_probs` computed them before."""
    net.train()
    with torch.no_grad():
        out = torch.stack([torch.cat([torch.softmax(net(x[i:i + BATCH]), -1) for i in range(0, len(x), BATCH)])
                           for _ in range(passes)])
    net.eval()
    return out


def timed(sizes: list[int], conv: tuple[int, ...]) -> dict[str, float]:
    """Seconds of the split and whole validation passes, of the members on their trunk and as weight vectors
    (the fastest of 3 interleaved calls), and the largest probability difference between the last two."""
    torch.manual_seed(0)
    net = network(sizes, list(conv), dropout=0.5)
    x_val, x = torch.rand(VALIDATION, sizes[0]) * 2 - 1, torch.rand(INPUTS, sizes[0]) * 2 - 1
    posterior = MCDropout(net, 0.5)
    weights = posterior.sample_weights(MEMBERS, torch.Generator().manual_seed(1))
    on_trunk = posterior.members(MEMBERS, torch.Generator().manual_seed(1))
    with torch.no_grad():
        t = best_times({"split": lambda: mc_dropout_probs(net, x_val, PASSES),
                        "whole": lambda: whole_passes(net, x_val, PASSES),
                        "trunk": lambda: on_trunk(x),
                        "vectors": lambda: predict_probs(posterior.spec, weights, x)}, 3)
        return {**t, "diff": (on_trunk(x) - predict_probs(posterior.spec, weights, x)).abs().max().item()}


def main() -> None:
    args = parse_threads_and_out(__doc__.splitlines()[0], default_threads=1)
    record = BenchmarkRecord("sample")
    threads = torch.get_num_threads()
    print(f"threads {threads}\n")
    passes, members = [], []
    for name, (sizes, conv) in NETWORKS.items():
        t = timed(sizes, conv)
        diff = t["diff"]
        print(f"{name:>8}: {PASSES} validation passes on {VALIDATION:,}: {t['split']:.2f} s against {t['whole']:.2f} s "
              f"({t['whole'] / t['split']:.2f}×); {MEMBERS} members on {INPUTS:,}: {t['trunk']:.2f} s against "
              f"{t['vectors']:.2f} s ({t['vectors'] / t['trunk']:.2f}×, max diff {diff:.1e})")
        passes.append(f"{name} {t['whole'] / t['split']:.2f}×")
        members.append(f"{name} {t['vectors'] / t['trunk']:.2f}× (max diff {diff:.1e})")
    record.add(f"MC-dropout baseline's {PASSES} validation passes on {VALIDATION:,} images, the layers before the "
               f"first dropout once per piece, against every pass through the whole network, {threads} thread(s) "
               "(`bench_mc_dropout.py`)", "; ".join(passes))
    record.add(f"(what `apd evaluate` pays) MC-dropout ensemble of {MEMBERS} members on {INPUTS:,} inputs, the "
               "trunk once (`predict_logits_on_trunk`), against `predict_probs` over the members' weight vectors",
               "; ".join(members))
    record.write(args.out)


if __name__ == "__main__":
    main()
