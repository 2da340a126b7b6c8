"""WGAN-GP training speed at the paper's sizes: critic and generator steps per second, side by side with
a textbook critic step that differentiates through explicit interpolates.

Paper architecture (Wang et al., 2018): generator z 32 → 100 → 100 → 100 → D, critic D → 100 → 100 →
100 → 1, batch 100, random real data, output dimension D = 7,510 (digits 64-100-10), 79,510 (fcNN1) and
478,410 (fcNN2). Each D is timed over a few steps only (best of a few on this noisy shared machine), so
the whole run takes about two minutes on a 2-core CPU. Prints parameter counts, steps per second,
milliseconds per full iteration (5 critic + 1 generator steps, timed as one ``trainer.step``), the
textbook critic step's time and the speed-up over it, and the process's peak RSS after each D (the
textbook step runs after the RSS reading: its [B, D] interpolates and gradients would raise it).
"""

from __future__ import annotations

import argparse
import resource

import torch
from record import BenchmarkRecord, add_out_argument
from timing import best_time

from apd.distillation.gan import Critic, GANTrainer, Generator

DIMS = [7_510, 79_510, 478_410]
REPEATS = {7_510: 10, 79_510: 3, 478_410: 2}  # steps timed per kind at each D
BATCH = 100
N_CRITIC = 5


def textbook_critic_step(trainer: GANTrainer, real: torch.Tensor, gp_weight: float = 10.0) -> None:
    """The usual WGAN-GP critic update (Gulrajani et al., 2017): interpolates built in R^D, three critic
    forward passes, the penalty on autograd's [B, D] input gradient."""
    critic = trainer.critic
    with torch.no_grad():
        fake = trainer.generator.sample(len(real), generator=trainer.rng)
    alpha = torch.rand(len(real), 1, generator=trainer.rng)
    mixed = (fake + alpha * (real - fake)).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
    loss = critic(fake).mean() - critic(real).mean() + gp_weight * (grad.norm(dim=1) - 1).square().mean()
    trainer.critic_opt.zero_grad(set_to_none=True)
    loss.backward()
    trainer.critic_opt.step()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("distill")
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; batch {BATCH}; z 32; hidden [100, 100, 100]; wgan-gp, Adam\n")
    header = (f"{'D':>8} | {'G params':>10} {'C params':>10} | {'critic/s':>8} {'gen/s':>7} "
              f"{'ms/iter':>8} | {'textbook critic ms':>18} {'speed-up':>8} | {'peak RSS MB':>11}")
    print(header)
    print("-" * len(header))
    iterations, speed_ups = {}, {}
    for dim in DIMS:
        generator, critic = Generator(32, [100, 100, 100], dim), Critic(dim, [100, 100, 100])
        trainer = GANTrainer(generator, critic, "wgan-gp", seed=0)
        real = torch.randn(BATCH, dim)
        trainer.critic_step(real)  # warm-up: allocates optimiser state
        trainer.generator_step(BATCH)
        repeats = REPEATS[dim]
        critic_s = best_time(lambda real=real, trainer=trainer: trainer.critic_step(real), repeats)
        generator_s = best_time(lambda trainer=trainer: trainer.generator_step(BATCH), repeats)
        iteration_s = best_time(lambda real=real, trainer=trainer: trainer.step(lambda: real, N_CRITIC), 1)
        rss = peak_rss_mb()
        textbook_s = best_time(lambda real=real, trainer=trainer: textbook_critic_step(trainer, real), 1)
        iterations[dim], speed_ups[dim] = iteration_s, textbook_s / critic_s
        g_params = sum(p.numel() for p in generator.parameters())
        c_params = sum(p.numel() for p in critic.parameters())
        print(f"{dim:>8,} | {g_params:>10,} {c_params:>10,} | {1 / critic_s:>8.2f} {1 / generator_s:>7.2f} "
              f"{iteration_s * 1e3:>8.0f} | {textbook_s * 1e3:>18.0f} {textbook_s / critic_s:>7.2f}x | "
              f"{rss:>11.0f}", flush=True)
        del trainer, generator, critic, real
    print(f"\nms/iter: one trainer.step with {N_CRITIC} critic steps and 1 generator step; "
          "speed-up: textbook critic step time / apd.distillation.gan critic step time.")
    record.add(f"WGAN-GP iteration ({N_CRITIC} critic + 1 generator steps), paper architecture, batch {BATCH}, "
               f"{torch.get_num_threads()} thread(s) (`bench_gan.py`)",
               "; ".join(f"D = {dim:,}: {seconds:.2f} s" for dim, seconds in iterations.items()))
    record.add("critic step, the gradient penalty taken at the critic's first layer against the textbook one",
               ", ".join(f"{speed_up:.1f}×" for speed_up in speed_ups.values()) + " faster at those D")
    record.write(args.out)


if __name__ == "__main__":
    main()
