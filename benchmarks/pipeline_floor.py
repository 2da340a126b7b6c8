"""The arithmetic floor of a published pipeline on this machine: the fewest seconds its protocol could take here,
from what it must compute, beside the end-to-end record and the target.

Every count is made with the project's own code under torch's ``FlopCounterMode`` (matrix products and
convolutions, forward and backward: the arithmetic every other operation of a step rides on) and multiplied by
how often the published run does it, read from the pipeline's file and its published manifests:

- ``apd sample``: chains × iterations SGLD iterations of one chain (:class:`~apd.samplers.chain.SGLDChains`: the
  minibatch forward and backward), as many draws of D Gaussians (the Langevin noise), the baselines' and
  peers' epochs of minibatch SGD (each step the products of an SGLD iteration at the baselines' batch size) and
  their predictions of the validation split (each epoch's SGD networks, SWAG's draws, MC dropout's passes);
- ``apd distill``: seeds × steps GAN steps of the distiller as it trains (the chains' GANs stacked where
  ``per_chain``, the conditioned GAN where ``mode_embedding``), each ``n_critic`` critic steps and a generator step,
  and the generated networks the selection predicts on its validation images every ``eval_every`` steps;
- ``apd evaluate``: every stored sample the yardstick predicts on the stacked evaluation inputs, once per
  storage it is judged at (a precision, or a precision about the chains' means; the reference's rows and the
  union of the kept selections' and random subsets' rows, the subsets drawn again with
  :func:`~apd.posteriors.kept.random_rows` over the published chains' lengths), every network the methods
  that draw weight vectors must predict (runs × ensemble size; members that share all but their last layer,
  that layer alone), and Stein thinning's full-training-set gradient of each candidate.

Left out, so the floor is below what the protocol needs: the alignment, the mixtures' and Laplace fits, the
attacks, MC dropout's passes in evaluate and every non-product operation (scores, softmax, Adam, the SGLD update).
The rates are this machine's best, measured in the same run on every core, the highest of three rounds: the faster
of the 4096² float32 matmul and the large float32 ``conv2d`` of ``bench_predict_cnn.py``'s roofline for the
products, and ``torch.randn`` on one thread pinned to each core, summed over the cores, for the noise. The floor
is

    T_floor = Σ FLOPs / peak + Gaussian draws / draw rate,

each stage's arithmetic at the machine's best rate with nothing else to do. A target below it cannot be met on
this machine by any implementation of the protocol that draws its noise with torch's generator.

Run: ``.venv/bin/python benchmarks/pipeline_floor.py fashion-fc1 fashion-fc2 fashion-lenet5 [--out-dir DIR]``,
nothing else running; with ``--out-dir`` each pipeline's record goes to ``DIR/PIPELINE/floor.json``
(``docs/results`` publishes them, and ``make docs`` renders them beside the end-to-end records).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from bench_predict_cnn import rates as roofline_rates
from record import run_header
from timing import best_time
from torch.utils.flop_counter import FlopCounterMode

from apd.config import PipelineConfig
from apd.config_load import load_config
from apd.data import MinibatchOrder, load_dataset
from apd.distillation.conditioned import labelled
from apd.distillation.training import make_chain_trainers, make_conditioned_trainer, make_trainer
from apd.methods import MethodName
from apd.nets import ParamSpec, network, predict_logits
from apd.pipeline.recipes import MONITOR_SIZE
from apd.posteriors.kept import evenly_spaced_rows, last_rows, random_rows
from apd.samplers.chain import ChainSeeds, SGLDChains

RESULTS = Path("docs/results")
# The methods whose members differ in every layer, so that each is a network predicted whole on the stacked inputs
# (the stored samples' rows are counted with the yardstick's; MC dropout shares its trunk and the GLM predictive
# linearises: not counted; the last-layer Laplace and the one SGD network are counted apart).
WHOLE = (MethodName.APD, MethodName.MOG, MethodName.MODES, MethodName.SWAG, MethodName.ENSEMBLE,
         MethodName.LAPLACE_KFAC)
COUNTED_INPUTS = 100  # inputs one network's prediction is counted on, scaled to the stacked inputs (linear in them)


def counted_flops(run) -> int:
    """The FLOPs of the matrix products and convolutions ``run()`` dispatches (torch's ``FlopCounterMode``)."""
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


@dataclass(frozen=True)
class Part:
    """One counted part of a stage: ``count`` units of ``flops`` each (or of ``draws`` Gaussians each)."""

    stage: str
    what: str
    count: int
    flops: int = 0
    draws: int = 0

    def seconds(self, peak_flops: float, draws_per_second: float) -> float:
        return self.count * (self.flops / peak_flops + self.draws / draws_per_second)


def sgld_iteration_flops(cfg: PipelineConfig, sizes: list[int], x_train: torch.Tensor, y_train: torch.Tensor) -> int:
    """One SGLD iteration of one chain: its minibatch forward and backward (:class:`SGLDChains`, as sampled)."""
    chains = SGLDChains(sizes, cfg.sgld, [0], x_train, y_train, [ChainSeeds(1, 2, 3)], conv=cfg.net.conv)
    chains.step(0)  # the first iteration outside the count: lazily built state
    return counted_flops(lambda: chains.step(1))


def gan_step_flops(cfg: PipelineConfig, code_dim: int, chains: int) -> int:
    """One GAN step (``n_critic`` critic steps and a generator step) of the distiller ``cfg.distill`` trains over
    codes of ``code_dim`` from a store of ``chains`` chains."""
    d, device = cfg.distill, torch.device("cpu")
    shares = torch.full((chains,), 1 / chains)

    def codes() -> torch.Tensor:
        return torch.randn(d.batch_size, code_dim)

    def coded_rows() -> torch.Tensor:  # a conditioned critic's rows: the codes and each one's chain
        return labelled(codes(), torch.randint(chains, (d.batch_size,)))

    if d.per_chain:
        trainer, batches = make_chain_trainers(d, code_dim, list(range(chains)), shares, device), [codes] * chains
    elif d.mode_embedding:
        trainer, batches = make_conditioned_trainer(d, code_dim, 0, shares, device), coded_rows
    else:
        trainer, batches = make_trainer(d, code_dim, 0, device), codes
    trainer.step(batches, d.n_critic)  # the first step outside the count: lazily built optimiser state
    return counted_flops(lambda: trainer.step(batches, d.n_critic))


def prediction_flops(spec: ParamSpec, x: torch.Tensor, inputs: int) -> int:
    """One network's prediction (:func:`~apd.nets.predict_logits`) on ``inputs`` inputs like ``x``'s rows."""
    weights = torch.zeros(1, spec.numel)
    with torch.no_grad():
        per_input = counted_flops(lambda: predict_logits(spec, weights, x[:COUNTED_INPUTS])) / COUNTED_INPUTS
    return round(per_input * inputs)


def yardstick_rows(yardstick: dict, chain_lengths: list[int], seed: int = 0) -> dict[str, int]:
    """How many distinct stored samples the yardstick predicts in each storage (the kept sets' ``precision``:
    a precision, or one about the chains' means): at float32 the reference's (:func:`evenly_spaced_rows` of the
    store) and, in every storage, each kept size's evenly spaced and last rows and the rows of its random
    subsets, drawn again over chains of ``chain_lengths`` rows (the published
    draws' streams are the evaluation's; the union's size hardly varies with the draw)."""
    n = sum(chain_lengths)
    chains = np.repeat(np.arange(len(chain_lengths)), chain_lengths)
    rows = {"float32": set(evenly_spaced_rows(n, min(yardstick["reference"]["kl_samples"], n)).tolist())}
    generator = torch.Generator().manual_seed(seed)
    for kept in yardstick["kept"].values():
        k, found = kept["k"], rows.setdefault(kept["precision"], set())
        found.update(evenly_spaced_rows(n, k, chains).tolist(), last_rows(n, k, chains).tolist())
        for _ in range(kept["subsets"]):
            found.update(random_rows(n, k, generator, chains).tolist())
    return {precision: len(found) for precision, found in rows.items()}


def chain_lengths(samples: dict, results: dict) -> list[int]:
    """Each chain's stored samples after the burn-in the evaluation dropped."""
    burn = results["burn_in"]
    per_chain = burn["samples_per_chain"] - (burn["burn_in"] if burn["applied"] else 0)
    return [per_chain] * samples["chains"]


def stacked_inputs(results: dict) -> int:
    """The inputs every network is predicted on: the test set, the in-distribution side and each OOD set."""
    return results["sizes"]["test"] + results["ood_meta"]["n_in"] * (1 + len(results["ood"]))


def baseline_epochs(cfg: PipelineConfig) -> int:
    """Epochs of minibatch SGD ``apd sample`` trains the baselines and peers with: the SGD network and MC dropout
    ``[baselines] epochs`` each, each member of the deep ensemble as many, and SWAG ``swag_epochs`` at each of its
    learning rates (the peers where ``evaluate.methods`` compares them)."""
    b, p, methods = cfg.baselines, cfg.peers, cfg.evaluate.methods
    return (2 * b.epochs + (p.ensemble_members * b.epochs if MethodName.ENSEMBLE in methods else 0)
            + (len(p.swag_lrs) * p.swag_epochs if MethodName.SWAG in methods else 0))


def validation_passes(cfg: PipelineConfig) -> int:
    """Whole networks ``apd sample`` predicts the validation split with while it trains the baselines and peers:
    the SGD network and each member of the deep ensemble once an epoch (the epoch kept is the best one), and
    SWAG's ``swag_val_samples`` draws at each of its learning rates (MC dropout's passes are counted apart)."""
    b, p, methods = cfg.baselines, cfg.peers, cfg.evaluate.methods
    return ((1 + (p.ensemble_members if MethodName.ENSEMBLE in methods else 0)) * b.epochs
            + (len(p.swag_lrs) * p.swag_val_samples if MethodName.SWAG in methods else 0))


def whole_networks(results: dict) -> int:
    """Networks the evaluation must predict whole on the stacked inputs for the methods that draw weight vectors:
    every member of every run of the methods of :data:`WHOLE`, the SGD network once (every run's is the same), and
    the last-layer Laplace's layers before its last once a run (its members differ in the last layer alone)."""
    runs, ensemble = results["runs"], results["ensemble"]
    return (sum(runs * ensemble[m] for m in WHOLE if m in ensemble) + (MethodName.SGD in ensemble)
            + (runs if MethodName.LAPLACE_LL in ensemble else 0))


def last_layer_flops(spec: ParamSpec, inputs: int) -> int:
    """One pass of the network's last linear layer on ``inputs`` inputs (what a last-layer Laplace member adds)."""
    last = ParamSpec(spec.names[-2:], spec.shapes[-2:])  # the last linear layer's weight and bias
    return prediction_flops(last, torch.zeros(COUNTED_INPUTS, last.linear_layers()[0][3]), inputs)


def tail_flops(spec: ParamSpec, inputs: int) -> int:
    """One pass of the layers after the network's first linear layer (:meth:`ParamSpec.trunk_and_tail`: those
    MC dropout's masks reach) on ``inputs`` inputs."""
    tail = spec.trunk_and_tail()[1]
    return prediction_flops(tail, torch.zeros(COUNTED_INPUTS, tail.linear_layers()[0][3]), inputs)


def count_parts(pipeline: str, root: Path) -> list[Part]:
    """The counted parts of ``pipeline``'s published run (module docstring)."""
    cfg = load_config(pipeline)
    samples = json.loads((root / pipeline / "samples.json").read_text())
    results = json.loads((root / pipeline / "results.json").read_text())
    data = load_dataset(cfg.data, cfg.seed)
    sizes = [data.num_features, *cfg.net.hidden, data.num_classes]
    spec = ParamSpec.from_module(network(sizes, cfg.net.conv))
    s, b, d, e = cfg.sgld, cfg.baselines, cfg.distill, cfg.evaluate
    n_train = len(data.y_train)
    iteration = sgld_iteration_flops(cfg, sizes, data.x_train[:2 * s.batch_size], data.y_train[:2 * s.batch_size])
    per_example = iteration / s.batch_size  # a minibatch's products grow with its rows, one example's each
    code_dim = d.subspace_rank if d.generator == "subspace" else spec.numel
    inputs = stacked_inputs(results)
    one_network = prediction_flops(spec, data.x_test, inputs)
    rows = yardstick_rows(results["yardstick"], chain_lengths(samples, results))
    epochs = baseline_epochs(cfg)
    judged, monitored = d.seeds * (d.steps // d.eval_every) * d.eval_networks, min(MONITOR_SIZE, len(data.y_val))
    parts = [
        Part("sample", f"SGLD iterations' products ({s.chains} chains × {s.iterations:,})", s.chains * s.iterations,
             flops=iteration),
        Part("sample", f"SGLD's Gaussian noise ({spec.numel:,} per iteration)", s.chains * s.iterations,
             draws=spec.numel),
        Part("sample", f"the baselines' and peers' SGD steps ({epochs} epochs)",
             epochs * MinibatchOrder(n_train, b.batch_size, 0).batches_per_epoch,
             flops=round(per_example * b.batch_size)),
        Part("sample", f"the baselines' and peers' validation predictions ({len(data.y_val):,} inputs each)",
             validation_passes(cfg), flops=prediction_flops(spec, data.x_val, len(data.y_val))),
        Part("sample", f"MC dropout's validation passes ({b.epochs} epochs × {b.mc_passes}, after its first layer)",
             b.epochs * b.mc_passes, flops=tail_flops(spec, len(data.y_val))),
        Part("distill", f"GAN steps ({d.seeds} seeds × {d.steps:,})", d.seeds * d.steps,
             flops=gan_step_flops(cfg, code_dim, samples["chains"])),
        Part("distill", f"generated networks the selection judges ({monitored:,} validation inputs each)", judged,
             flops=prediction_flops(spec, data.x_val, monitored)),
        *[Part("evaluate", f"stored samples the yardstick predicts at {precision} ({inputs:,} inputs each)", count,
               flops=one_network) for precision, count in rows.items()],
        Part("evaluate", f"drawn networks of the methods with weights ({inputs:,} inputs each)",
             whole_networks(results), flops=one_network),
    ]
    if MethodName.LAPLACE_LL in results["ensemble"]:
        parts.append(Part("evaluate", "the last-layer Laplace's members, their last layer", results["runs"]
                          * results["ensemble"][MethodName.LAPLACE_LL], flops=last_layer_flops(spec, inputs)))
    if MethodName.STEIN in e.methods:
        parts.append(Part("evaluate", f"Stein thinning's full-training-set gradients ({n_train:,} examples each)",
                          e.stein_candidates, flops=round(per_example * n_train)))
    return parts


def machine_rates(rounds: int = 3) -> dict[str, float]:
    """This machine's best rates, all cores, each the highest of ``rounds`` rounds (a shared machine has slow
    spells, and a faster rate only lowers the floor): float32 FLOP/s of the large conv2d and the 4096² matmul
    that ``bench_predict_cnn.py`` takes as the roofline, and Gaussian draws per second (``torch.randn`` on one
    thread pinned to each core in turn, summed over the cores: a thread moved between cores draws slower)."""
    cores = os.cpu_count() or 1
    allowed = os.sched_getaffinity(0)
    noise, generator = torch.empty(1_000_000), torch.Generator().manual_seed(0)
    best = {"conv_flops": 0.0, "matmul_flops": 0.0, "draws_per_second": 0.0}
    for _ in range(rounds):
        torch.set_num_threads(cores)
        conv, matmul = (rate * 1e9 for rate in roofline_rates())
        torch.set_num_threads(1)
        draws = 0.0
        for core in sorted(allowed):
            os.sched_setaffinity(0, {core})
            draws += noise.numel() / best_time(lambda: noise.normal_(generator=generator), 30)
        os.sched_setaffinity(0, allowed)
        for name, value in (("conv_flops", conv), ("matmul_flops", matmul), ("draws_per_second", draws)):
            best[name] = max(best[name], value)
    torch.set_num_threads(cores)
    return {**best, "peak_flops": max(best["conv_flops"], best["matmul_flops"]), "cores": cores}


def floor_record(pipeline: str, parts: list[Part], rates: dict[str, float], header: dict) -> dict:
    """The record ``make docs`` renders: each part's count and floor seconds, each stage's and the total."""
    peak, draws = rates["peak_flops"], rates["draws_per_second"]
    rows = [{"stage": p.stage, "what": p.what, "count": p.count, "flops": p.flops, "draws": p.draws,
             "seconds": round(p.seconds(peak, draws), 2)} for p in parts]
    stages: dict[str, float] = {}
    for row in rows:
        stages[row["stage"]] = round(stages.get(row["stage"], 0.0) + row["seconds"], 2)
    return {"pipeline": pipeline, **header, "rates": rates, "parts": rows, "stages": stages,
            "total": round(sum(stages.values()), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="+", help="published pipelines (folders of docs/results)")
    parser.add_argument("--out-dir", type=Path, help="write each record to OUT_DIR/PIPELINE/floor.json")
    args = parser.parse_args()
    header = run_header()
    rates = machine_rates()
    print(f"peak {rates['peak_flops'] / 1e9:.0f} GFLOP/s (matmul {rates['matmul_flops'] / 1e9:.0f}, conv2d "
          f"{rates['conv_flops'] / 1e9:.0f}); {rates['draws_per_second'] / 1e6:.0f} M Gaussian draws/s")
    for pipeline in args.pipelines:
        record = floor_record(pipeline, count_parts(pipeline, RESULTS), rates, header)
        recorded = RESULTS / pipeline / "end_to_end.json"
        wall = json.loads(recorded.read_text())["stages"] if recorded.is_file() else {}
        print(f"\n{pipeline}: floor {record['total'] / 60:.1f} min")
        for row in record["parts"]:
            units = f"{row['flops'] / 1e6:,.1f} MFLOP" if row["flops"] else f"{row['draws']:,} draws"
            print(f"  {row['stage']:<9} {row['what']}: {row['count']:,} × {units} = {row['seconds']:.0f} s")
        for stage, seconds in record["stages"].items():
            ratio = f", recorded {wall[stage]:.0f} s ({wall[stage] / seconds:.1f}× the floor)" if stage in wall else ""
            print(f"  {stage}: floor {seconds:.0f} s{ratio}")
        if args.out_dir:
            out = args.out_dir / pipeline / "floor.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
