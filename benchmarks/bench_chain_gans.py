"""One WGAN-GP per chain (``[distill] per_chain``) at the sizes of fcNN1's per-chain distiller: the C chains'
GANs trained in turn (one :class:`~apd.distillation.gan.GANTrainer` each), as one batched computation (stacked
weights and batched matmuls, :class:`~apd.distillation.chain_generators.ChainTrainers`), and as ``torch.vmap`` over
``torch.func.functional_call`` of the stacked weights (``torch.func.stack_module_state``), side by side.

Sizes of the per-chain distiller ``pipelines/fashion-fc1.toml`` shipped before the generator told the chain: codes
of rank 35, z 32, generator and critic hidden [128, 128], batch 100, 5 critic steps per generator step, Adam (lr
1e-3, β (0.5, 0.9)). For C = 2, 4 and 8 chains it prints chain-steps per second (C generator steps, each with its 5
critic steps, per second of one iteration of all chains; best of a few on this noisy shared machine) and the
speed-ups over the chains in turn, then how far each batched way's generators are from the sequential ones after
those steps (float rounding). Takes about a minute on one thread. ``--device cuda`` measures the same on a GPU,
where a step of these small networks is a few hundred short kernels, and ``--chains`` sets the C measured (e.g. 12:
three generator seeds of fcNN1's four chains batched together); there a fourth way replays the batched step from
its CUDA graph (:class:`~apd.cuda_graphs.RecordedStep`), as the pipeline steps it on a GPU. The batched trainer was
kept: at every C it beat vmap, whose per-call overhead costs most at C = 2.

Beside them, timed in the same interleaved rounds, the other way to keep C modes apart: one generator told the
chain by 4 learned numbers (``[distill] mode_embedding = 4``,
:class:`~apd.distillation.conditioned.ConditionedTrainer`), one batch of 100 rows over all chains per step. Its
steps per second are set against the batched GANs' iterations (one step of every chain's generator) per second:
the cost of one step of the distiller each way, not of the same computation.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Iterable

import torch
from record import BenchmarkRecord, add_out_argument
from timing import best_times
from torch import Tensor
from torch.func import functional_call, grad, stack_module_state, vjp, vmap

from apd.distillation.chain_generators import ChainTrainers
from apd.distillation.conditioned import ConditionedGenerator, ConditionedTrainer, conditioned_critic, labelled
from apd.distillation.gan import Critic, GANTrainer, Generator, draw, seeded_streams

CHAINS = [2, 4, 8]
CODE, Z, HIDDEN, BATCH, N_CRITIC, GP = 35, 32, [128, 128], 100, 5, 10.0
ADAM = {"lr": 1e-3, "betas": (0.5, 0.9)}
REPEATS = 20  # iterations timed per way at each C, interleaved (the fastest counts)
EMBEDDING = 4  # the told generator's numbers per chain, as digits and fcNN1 ship


def networks(seed: int, device: torch.device) -> tuple[Generator, Critic]:
    torch.manual_seed(seed)
    return Generator(Z, HIDDEN, CODE).to(device), Critic(CODE, HIDDEN).to(device)


def chain_trainers(seeds: list[int], device: torch.device, cuda_graph: bool) -> ChainTrainers:
    """The chains' GANs of ``seeds`` as one batched trainer."""
    generators, critics = zip(*(networks(seed, device) for seed in seeds), strict=True)
    return ChainTrainers(generators, critics, torch.full((len(seeds),), 1 / len(seeds), device=device), "wgan-gp",
                         **ADAM, seeds=seeds, cuda_graph=cuda_graph)


def told_trainer(chains: int, device: torch.device) -> tuple[ConditionedTrainer, Tensor]:
    """One generator told the chain for ``chains`` equal chains, and a real batch of BATCH rows [codes, chain]."""
    torch.manual_seed(chains)
    shares = torch.full((chains,), 1 / chains, device=device)
    generator = ConditionedGenerator(Z, HIDDEN, CODE, shares, EMBEDDING).to(device)
    trainer = ConditionedTrainer(generator, conditioned_critic(CODE, HIDDEN, chains).to(device), "wgan-gp", **ADAM,
                                 seed=0, cuda_graph=False)
    rows = torch.randn(BATCH, CODE, generator=torch.Generator().manual_seed(chains)).to(device)
    return trainer, labelled(rows, torch.arange(BATCH, device=device) % chains)


def generator_weights(trainer: ChainTrainers | VmapTrainer, chains: int) -> Tensor:
    """The chains' generator weights, flattened chain after chain."""
    if isinstance(trainer, ChainTrainers):
        return flat(g.parameters() for g in trainer.generator.generators)
    return flat((trainer.g_params[name][j] for name in trainer.g_params) for j in range(chains))


def flat(chains: Iterable[Iterable[Tensor]]) -> Tensor:
    """Every chain's tensors, flattened and joined chain after chain."""
    return torch.cat([t.detach().reshape(-1) for tensors in chains for t in tensors])


class VmapTrainer:
    """The chains' WGAN-GP steps as ``vmap(grad(loss))`` of one chain's loss over stacked weights: the same
    objective, penalty at the critic's first layer, per-chain streams and fused Adam as the batched trainer."""

    def __init__(self, seeds: list[int], device: torch.device) -> None:
        generators, critics = zip(*(networks(seed, device) for seed in seeds), strict=True)
        self.generator, self.critic = copy.deepcopy(generators[0]).to("meta"), copy.deepcopy(critics[0]).to("meta")
        self.head = self.critic.net[1:]  # keeps the critic's layer names, "2.weight", …
        self.g_params, _ = stack_module_state(list(generators))
        self.c_params, _ = stack_module_state(list(critics))
        self.g_opt = torch.optim.Adam(self.g_params.values(), **ADAM, fused=True)
        self.c_opt = torch.optim.Adam(self.c_params.values(), **ADAM, fused=True)
        self.rng = seeded_streams(seeds, device)
        self.critic_grad = vmap(grad(self.critic_loss, has_aux=True))
        self.generator_grad = vmap(grad(self.generator_loss, has_aux=True))

    def critic_loss(self, params: dict[str, Tensor], real: Tensor, fake: Tensor,
                    alpha: Tensor) -> tuple[Tensor, Tensor]:
        """One chain's WGAN-GP critic loss (and its Wasserstein estimate), as WassersteinGP computes it."""
        first = {"weight": params["net.0.weight"], "bias": params["net.0.bias"]}
        rest = {name.removeprefix("net."): value for name, value in params.items() if not name.startswith("net.0.")}
        h_real, h_fake = (functional_call(self.critic.net[0], first, (x,)) for x in (real, fake))
        h_mix = torch.lerp(h_fake, h_real, alpha)

        def head(h: Tensor) -> Tensor:
            return functional_call(self.head, rest, (h,)).squeeze(-1)

        # as scores_and_interpolate_grad_norm: the head on [real; fake], and on the mix with g pulled back
        d_real, d_fake = head(torch.cat([h_real, h_fake])).split(len(real))
        d_mix, pullback = vjp(head, h_mix)
        (g,) = pullback(torch.ones_like(d_mix))
        weight = params["net.0.weight"]
        norm = ((g @ (weight @ weight.T)) * g).sum(-1).clamp_min(1e-12).sqrt()
        wasserstein = d_real.mean() - d_fake.mean()
        return GP * (norm - 1).square().mean() - wasserstein, wasserstein

    def generator_loss(self, params: dict[str, Tensor], critic: dict[str, Tensor], z: Tensor) -> tuple[Tensor, Tensor]:
        loss = -functional_call(self.critic, critic, (functional_call(self.generator, params, (z,)),)).mean()
        return loss, loss

    def step(self, real: Tensor) -> None:
        """n_critic critic updates on ``real`` [C, B, CODE], then one generator update."""
        like = real
        for _ in range(N_CRITIC):
            with torch.no_grad():
                fake = vmap(lambda p, z: functional_call(self.generator, p, (z,)))(
                    self.g_params, draw(torch.randn, (BATCH, Z), like, self.rng))
            alpha = draw(torch.rand, (BATCH, 1), like, self.rng)
            grads, stats = self.critic_grad(self.c_params, real, fake, alpha)
            self._update(self.c_opt, self.c_params, grads)
            stats.tolist()  # the trainers read their statistics back every step
        critic = {name: value.detach() for name, value in self.c_params.items()}
        grads, stats = self.generator_grad(self.g_params, critic, draw(torch.randn, (BATCH, Z), like, self.rng))
        self._update(self.g_opt, self.g_params, grads)
        stats.tolist()

    @staticmethod
    def _update(optimizer: torch.optim.Optimizer, params: dict[str, Tensor], grads: dict[str, Tensor]) -> None:
        for name, param in params.items():
            param.grad = grads[name]
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as the pipeline's distill "
                        "runs on a shared machine)")
    parser.add_argument("--device", default="cpu", help="where the GANs train (cpu, cuda)")
    parser.add_argument("--chains", type=int, nargs="+", default=CHAINS, help="the numbers of chains C measured")
    add_out_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    record = BenchmarkRecord("distill")
    print(f"{device}, threads {torch.get_num_threads()}; codes {CODE}, z {Z}, hidden {HIDDEN}, batch {BATCH}, "
          f"{N_CRITIC} critic steps per generator step, wgan-gp, Adam\n")
    ways_measured = ["in turn", "batched", "vmap", *(["recorded"] if device.type == "cuda" else [])]
    header = (f"{'C':>3} | " + " ".join(f"{w:>8}" for w in ways_measured) + "  chain-steps/s | "
              + " ".join(f"{w:>8}" for w in ways_measured[1:]) + "  speed-up | "
              + " ".join(f"{w:>8}" for w in ways_measured[1:]) + "  max |Δθ_G| vs in turn")
    print(header)
    print("-" * len(header))
    rates: dict[int, dict[str, float]] = {}
    for c in args.chains:
        seeds = list(range(c))
        real = torch.randn(c, BATCH, CODE, generator=torch.Generator().manual_seed(c)).to(device)
        real_batches = [lambda j=j, real=real: real[j] for j in range(c)]
        sequential = [GANTrainer(*networks(seed, device), "wgan-gp", **ADAM, seed=seed, cuda_graph=False)
                      for seed in seeds]
        trainers = {"batched": chain_trainers(seeds, device, cuda_graph=False), "vmap": VmapTrainer(seeds, device)}
        if device.type == "cuda":
            trainers["recorded"] = chain_trainers(seeds, device, cuda_graph=True)
        ways = {"in turn": lambda seq=sequential, real=real: [t.step(lambda j=j: real[j], N_CRITIC)
                                                              for j, t in enumerate(seq)],
                "vmap": lambda v=trainers["vmap"], real=real: v.step(real)}
        for name in ("batched", "recorded"):
            if name in trainers:
                ways[name] = lambda b=trainers[name], rb=real_batches: b.step(rb, N_CRITIC)
        told, rows = told_trainer(c, device)
        ways["told"] = lambda told=told, rows=rows: told.step(lambda: rows, N_CRITIC)
        rates[c] = {name: (1 if name == "told" else c) / seconds for name, seconds in best_times(ways, REPEATS).items()}
        reference = flat(t.generator.parameters() for t in sequential)
        gaps = {name: (generator_weights(trainer, c) - reference).abs().max() for name, trainer in trainers.items()}
        r = rates[c]
        print(f"{c:>3} | " + " ".join(f"{r[w]:>8.1f}" for w in ways_measured) + "                | "
              + " ".join(f"{r[w] / r['in turn']:>7.2f}×" for w in ways_measured[1:]) + "           | "
              + " ".join(f"{gaps[w]:>8.1e}" for w in ways_measured[1:]), flush=True)
    print(f"\nchain-steps/s: C / seconds of one iteration of all C chains ({N_CRITIC} critic + 1 generator steps "
          "each); Δθ_G: after the same steps from the same weights and streams. The first three ways step as "
          "usual; recorded (CUDA): the batched step replayed from its CUDA graph.\n")
    print(f"{'C':>3} | {'per chain, batched':>18} {'told the chain':>15}  distiller steps/s | told / per chain")
    for c, r in rates.items():
        print(f"{c:>3} | {r['batched'] / c:>18.1f} {r['told']:>15.1f}                    | "
              f"{r['told'] * c / r['batched']:>7.2f}×")
    print(f"\ndistiller steps/s: steps of every chain's generator (batched GANs, one iteration) or of the one "
          f"generator told the chain by {EMBEDDING} numbers (a batch of {BATCH} rows over all chains), per second.")
    rows = {c: " / ".join(f"{r[w]:.0f}" for w in ways_measured) for c, r in rates.items()}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} thread(s)"
    record.add(f"one WGAN-GP per chain at fcNN1's per-chain distiller sizes, {where}, chain-steps/s "
               f"{' / '.join(ways_measured)} (`bench_chain_gans.py`)",
               "; ".join(f"C = {c}: {v}" for c, v in rows.items()))
    over = {c: {w: f"{r[w] / r['in turn']:.2f}×" for w in ways_measured[1:]} for c, r in rates.items()}
    speed_ups = [f"{x['batched']} ({x['vmap']})" + (f", recorded {x['recorded']}" if "recorded" in x else "")
                 for x in over.values()]
    record.add("the chains' GANs as one batched computation against the chains in turn (vmap in brackets)",
               f"{'; '.join(speed_ups)} at C = {', '.join(map(str, args.chains))}")
    record.add(f"one generator told the chain ({EMBEDDING} numbers) against one per chain batched, distiller "
               f"steps/s, {where}",
               "; ".join(f"C = {c}: {r['told']:.0f} against {r['batched'] / c:.0f}, {r['told'] * c / r['batched']:.2f}×"
                         for c, r in rates.items()))
    record.write(args.out)


if __name__ == "__main__":
    main()
