"""The WGAN-GP critic step with the interpolates scored on their own, side by side with one head pass over
[real; fake; interpolates], at the sizes of fcNN1's per-chain distiller (codes of rank 35).

The penalty needs g = ∂D/∂h at the interpolates' first-layer pre-activations, taken with ``create_graph``
(:func:`~apd.distillation.gan.scores_and_interpolate_grad_norm`). When the head scores the three batches in
one pass, g's backward and the loss's second-order terms run over all 3B rows, 2B of them with a zero
gradient; scored apart, over B. The objective is the same; the weight gradient is summed in two parts
instead of one, so the generators differ by float rounding (printed after the timed steps).

Sizes of ``pipelines/fashion-fc1.toml``: C chains' GANs (1 and its 4 by default) stepped as one batched
computation (:class:`~apd.distillation.chain_generators.ChainTrainers`), codes of rank 35, z 32, hidden
[128, 128], batch 100, 5 critic steps per generator step. Prints milliseconds per step (the fastest of
interleaved rounds on this shared machine) and their ratio; about a minute on one thread.
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

CHAINS = [1, 4]  # one GAN (as LeNet-5's one generator told the chain), and fcNN1's four chains' GANs
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


def stepping(grad_norm: Callable[..., tuple[Tensor, Tensor, Tensor]], chains: int, device: torch.device) -> tuple[
        Callable[[], None], Callable[[], Tensor]]:
    """One batched step of the chains' GANs whose critic loss computes the penalty with ``grad_norm``, and
    the generators' weights after the steps taken."""
    trainers = chain_trainers(list(range(chains)), device, cuda_graph=False)
    real = torch.randn(chains, BATCH, CODE, generator=torch.Generator().manual_seed(0)).to(device)
    batches = [lambda j=j: real[j] for j in range(chains)]

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
    parser.add_argument("--chains", type=int, nargs="+", default=CHAINS, help="the numbers of chains C measured")
    add_out_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    record = BenchmarkRecord("distill")
    print(f"WGAN-GP steps ({N_CRITIC} critic + 1 generator) of C chains' GANs, {torch.get_num_threads()} thread(s)")
    measured = []
    for chains in args.chains:
        ways = {"one pass": stepping(one_head_pass, chains, device),
                "apart": stepping(gan.scores_and_interpolate_grad_norm, chains, device)}
        seconds = best_times({name: step for name, (step, _) in ways.items()}, REPEATS)
        gap = (ways["apart"][1]() - ways["one pass"][1]()).abs().max().item()
        ms = {name: 1e3 * s for name, s in seconds.items()}
        ratio = ms["one pass"] / ms["apart"]
        print(f"C = {chains}: one head pass {ms['one pass']:.1f} ms, interpolates apart {ms['apart']:.1f} ms, "
              f"{ratio:.2f}×; max |Δθ_G| after {REPEATS + 1} steps {gap:.1e}", flush=True)
        measured.append(f"C = {chains}: {ms['apart']:.1f} against {ms['one pass']:.1f} ms, {ratio:.2f}×")
    record.add("WGAN-GP step at fcNN1's per-chain distiller sizes, the penalty's interpolates scored apart against "
               f"one head pass over [real; fake; interpolates], {torch.get_num_threads()} thread(s) "
               "(`bench_gradient_penalty.py`)", "; ".join(measured))
    record.write(args.out)


if __name__ == "__main__":
    main()
