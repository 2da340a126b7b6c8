"""The outputs of ``apd experiment active-learning`` (:mod:`apd.experiments.active_learning`) from its
results JSON: the Markdown report (:func:`render_markdown`; :func:`render_table` its table of labels
needed to reach the target accuracy, which ``apd docs`` renders), the per-round CSV and the figure."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from apd.acquisition import ACQUISITIONS
from apd.methods import label
from apd.pipeline.figures import new_figure, save_figure
from apd.pipeline.tables import format_duration, markdown_table

ACQUISITION_LABELS = {"bald": "BALD", "entropy": "entropy", "variation_ratio": "variation ratio",
                      "random": "random"}


def reach_cell(stat: dict, seeds: int) -> str:
    """"mean ± sd" when every seed reached the target, "not reached" when none did, else both parts."""
    if stat["reached"] == seeds:
        return f"{stat['mean']:.0f} ± {stat['std']:.0f}"
    if not stat["reached"]:
        return "not reached"
    return f"not reached in {seeds - stat['reached']}/{seeds} seeds (others {stat['mean']:.0f} ± {stat['std']:.0f})"


def render_table(results: dict) -> str:
    """Labels needed to reach the target test accuracy, one row per model, one column per acquisition
    (mean ± std over seeds; "—" where the pair was not run)."""
    plan = results["plan"]
    acquisitions = plan["acquisitions"]
    by_key = {(c["model"], c["acquisition"]): c for c in results["curves"]}
    body = [[label(m)] + [reach_cell(by_key[(m, a)]["labels_to_target"], plan["seeds"])
                                 if (m, a) in by_key else "—" for a in acquisitions] for m in plan["models"]]
    return markdown_table(["model", *(ACQUISITION_LABELS[a] for a in acquisitions)], body) + "\n"


def render_markdown(results: dict) -> str:
    """The whole report: labels to the target, final test accuracy, time per round, APD's storage."""
    plan, target = results["plan"], results["target_accuracy"]
    acquisitions = plan["acquisitions"]
    by_key = {(c["model"], c["acquisition"]): c for c in results["curves"]}
    first = results["curves"][0]["labelled"]
    lines = [f"# Active learning on {results['pipeline']}", "",
             f"{plan['seeds']} seeds; {plan['initial_per_class']} labelled examples per class to start "
             f"({first[0]}), {plan['acquire']} acquired per round, {plan['rounds']} rounds (up to {first[-1]} "
             f"labels); pool {results['pool_size']:,}, test {results['test_size']:,} images; every model "
             "retrained from scratch each round. Mean ± std over seeds (ddof 0).", "",
             f"## Labels needed to reach {100 * target:g} % test accuracy", "", render_table(results)]
    lines += [f"## Test accuracy at {first[-1]} labels", ""]
    body = [[label(m)] + [
        f"{by_key[(m, a)]['test_accuracy']['mean'][-1]:.4f} ± {by_key[(m, a)]['test_accuracy']['std'][-1]:.4f}"
        if (m, a) in by_key else "—" for a in acquisitions] for m in plan["models"]]
    lines += [markdown_table(["model", *(ACQUISITION_LABELS[a] for a in acquisitions)], body), ""]
    timing = results["seconds_per_round"]
    lines += ["## Time per round and trajectory (seconds, amortised over a seed's batched trajectories)", ""]
    body = [[label(m), f"{t['seconds']:.2f}", f"{t['sgld_seconds']:.2f}", f"{t['gan_seconds']:.2f}",
             f"{t['train_seconds']:.2f}", f"{t['score_seconds']:.2f}"] for m, t in timing.items()]
    lines += [markdown_table(["model", "total", "SGLD", "GAN", "SGD/Adam", "scoring"], body), ""]
    storage = results["apd_storage"]
    if storage:
        lines += [f"APD stores {storage['parameters']:,} numbers = {storage['in_sgld_samples']:.2f} SGLD samples' "
                  f"worth (codec {storage['codec_parameters']:,}: mean, rank-{plan['apd_rank']} basis and scales; "
                  f"generator {storage['generator_parameters']:,}), against the {storage['sgld_ensemble_samples']} "
                  "samples of a round's SGLD ensemble.", ""]
    lines += [f"Run time: {format_duration(results['seconds'])} wall clock, {format_duration(results['cpu_seconds'])} "
              f"of CPU time in the batches ({plan['workers']} worker{'s' if plan['workers'] > 1 else ''}).", ""]
    return "\n".join(lines)


def render_summary(results: dict) -> str:
    """The report below its title, each section's heading in bold: what ``apd docs`` renders for
    ``active-learning`` inside a document's own section."""
    body = render_markdown(results).split("\n", 2)[2]
    return "\n".join(f"**{line[3:]}**" if line.startswith("## ") else line for line in body.splitlines())


def write_csv(path: Path, results: dict) -> None:
    seeds = results["plan"]["seeds"]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["model", "acquisition", "round", "labelled", "test_accuracy_mean", "test_accuracy_std",
                         *(f"test_accuracy_seed{s}" for s in range(seeds)), "val_accuracy_mean", "val_accuracy_std"])
        for c in results["curves"]:
            test, val = c["test_accuracy"], c["val_accuracy"]
            for r, count in enumerate(c["labelled"]):
                writer.writerow([c["model"], c["acquisition"], r, count, f"{test['mean'][r]:.6f}",
                                 f"{test['std'][r]:.6f}", *(f"{row[r]:.6f}" for row in test["per_seed"]),
                                 f"{val['mean'][r]:.6f}", f"{val['std'][r]:.6f}"])


def draw_figure(results: dict, path: Path) -> None:
    """Test accuracy against labelled examples, one panel per model, a line and ± 1 sd band per acquisition."""
    models = results["plan"]["models"]
    figure, axes = new_figure(1, len(models), panel=(4.0, 3.2))
    for ax, model in zip(axes[0], models, strict=True):
        for c in (c for c in results["curves"] if c["model"] == model):
            color = f"C{ACQUISITIONS.index(c['acquisition'])}"
            x = np.array(c["labelled"])
            mean, std = np.array(c["test_accuracy"]["mean"]), np.array(c["test_accuracy"]["std"])
            ax.plot(x, mean, color=color, label=ACQUISITION_LABELS[c["acquisition"]])
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
        ax.axhline(results["target_accuracy"], color="grey", linestyle=":", linewidth=0.8)
        ax.set(xlabel="labelled examples", ylabel="test accuracy", title=f"{label(model)}")
        ax.legend(fontsize=7, loc="lower right")
    figure.suptitle(f"Active learning on {results['pipeline']} (mean ± 1 sd over {results['plan']['seeds']} seeds)",
                    fontsize=9)
    save_figure(figure, path)


