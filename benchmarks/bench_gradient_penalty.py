"""The WGAN-GP critic step with the interpolates scored on their own, side by side with one head pass over
[real; fake; interpolates], at fcNN1's distiller sizes.

The penalty needs g = ∂D/∂h at the interpolates' first-layer pre-activations, taken with ``create_graph``
(:func:`~apd.distillation.gan.scores_and_interpolate_grad_norm`). When the head scores the three batches in
one pass, g's backward and the loss's second-order terms run over all 3B rows, 2B of them with a zero
gradient; scored apart, over B. The objective is the same; the weight gradient is summed in two parts
instead of one, so the generators differ by float rounding (printed after the timed steps).

Sizes of ``pipelines/fashion-fc1.toml``: C = 4 chains' GANs stepped as one batched computation
(:class:`~apd.distillation.chain_generators.ChainTrainers`), codes of rank 35, z 32, hidden [128, 128],
batch 100, 5 critic steps per generator step. Prints milliseconds per step (the fastest of interleaved
rounds on this shared machine) and their ratio; about a minute on one thread.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from bench_chain_gans import BATCH, CODE, N_CRITIC, chain_trainers, flat
from record import BenchmarkRecord, add_out_argument
from timing import best_times
from torch import Tensor

from apd.distillation import gan

CHAINS = 4
REPEATS = 30  # steps timed per way, interleaved (the fastest counts)


def one_head_pass(critic: gan.Critic, real: Tensor, fake: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`~apd.distillation.gan.scores_and_interpolate_grad_norm` with the head applied once to
    [real; fake; mix] and g pulled back from the mix's scores through all three."""
    layer = critic.input_layer
    h_real, h_fake = layer(real), layer(fake)
    h_mix = torch.lerp(h_fake, h_real, alpha)
    d_real, d_fake, d_mix = critic.head(torch.cat([h_real, h_fake, h_mix], dim=-2)).squeeze(-1).split(
        real.shape[-2], dim=-1)
    (g,) = torch.autograd.grad(d_mix.sum(), h_mix, create_graph=True)
    sq_norm = ((g @ (layer.weight @ layer.weight.mT)) * g).sum(dim=-1)
    return d_real, d_fake, sq_norm.clamp_min(1e-12).sqrt()


def stepping(grad_norm: Callable[..., tuple[Tensor, Tensor, Tensor]], device: torch.device) -> tuple[
        Callable[[], None], Callable[[], Tensor]]:
    """One batched step of the chains' GANs whose critic loss computes the penalty with ``grad_norm``, and
    the generators' weights after the steps taken."""
    trainers = chain_trainers(list(range(CHAINS)), device, cuda_graph=False)
    real = torch.randn(CHAINS, BATCH, CODE, generator=torch.Generator().manual_seed(0)).to(device)
    batches = [lambda j=j: real[j] for j in range(CHAINS)]

    def step() -> None:
        packaged, gan.scores_and_interpolate_grad_norm = gan.scores_and_interpolate_grad_norm, grad_norm
        try:
            trainers.step(batches, N_CRITIC)
        finally:
            gan.scores_and_interpolate_grad_norm = packaged

    return step, lambda: flat(g.parameters() for g in trainers.generator.generators)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as the pipeline's distill runs)")
    add_out_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    record = BenchmarkRecord("distill")
    ways = {"one pass": stepping(one_head_pass, device),
            "apart": stepping(gan.scores_and_interpolate_grad_norm, device)}
    seconds = best_times({name: step for name, (step, _) in ways.items()}, REPEATS)
    gap = (ways["apart"][1]() - ways["one pass"][1]()).abs().max().item()
    ms = {name: 1e3 * s for name, s in seconds.items()}
    ratio = ms["one pass"] / ms["apart"]
    print(f"{CHAINS} chains' WGAN-GP steps ({N_CRITIC} critic + 1 generator), {torch.get_num_threads()} thread(s): "
          f"one head pass {ms['one pass']:.1f} ms, interpolates apart {ms['apart']:.1f} ms, {ratio:.2f}×; "
          f"max |Δθ_G| after {REPEATS + 1} steps {gap:.1e}")
    record.add(f"WGAN-GP step of fcNN1's {CHAINS} chains' GANs, interpolates scored apart against one head pass, "
               f"{torch.get_num_threads()} thread(s) (`bench_gradient_penalty.py`)",
               f"{ms['apart']:.1f} against {ms['one pass']:.1f} ms: {ratio:.2f}×")
    record.write(args.out)


if __name__ == "__main__":
    main()
