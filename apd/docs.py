"""``apd report --docs``: every results table in README.md and docs/*.md rendered from committed results.

Prose stays hand-written; numbers never are. A document marks each generated region as

    <!-- results:PIPELINE:TABLE -->
    …generated Markdown…
    <!-- end -->

and the region's body is replaced by TABLE rendered from ``docs/results/PIPELINE/`` (``results.json``
from ``apd evaluate``, the stage manifests, the experiments' JSON) or, for PIPELINE ``paper``, from
``docs/paper-numbers.json``. TABLE names one of :data:`RESULT_TABLES` (a table of ``tables.md``),
``ood-SCORE`` (one score's OOD block), ``machine`` (what the numbers were measured on), ``diagnostics``
(SGLD's convergence, from the sample manifest), ``choice`` (a distiller chosen by the rule of docs/design.md, the
record of ``benchmarks/choose_distiller.py --json``), ``standing`` (where APD stands on several pipelines,
PIPELINE a comma-separated list), ``end-to-end`` (the stages timed by
``benchmarks/time_pipeline.py``), ``durations`` (several such records side by side with the project's
targets and the floors of ``benchmarks/pipeline_floor.py``, PIPELINE a comma-separated list), ``floors`` (those
floors part by part, PIPELINE a comma-separated list), ``nothing-lost`` (the scenario matrix of
``benchmarks/nothing_lost.py``: its last run's counts per group), ``pipelines`` (the settings of shipped
pipelines, PIPELINE a comma-separated list, from their files), ``performance`` (every benchmark record in
``docs/results/PIPELINE/``, written by the ``benchmarks/bench_*.py`` scripts' ``--out``), ``samplers`` (several
pipelines' SGLD runs side by side:
PIPELINE is then a comma-separated list) or a study's region (:func:`render_study`, from the study registry
:data:`apd.experiments.studies.STUDIES`). For PIPELINE ``code``, TABLE ``studies`` is the list of studies
itself. A number the prose quotes from a results file is marked inline,

    <!-- value:PIPELINE:FILE.KEY.KEY…:FORMAT -->…<!-- /value -->

(a key may hold single spaces between its words, as the kept-samples sets' names do: ``29 int4``), and
written afresh from ``docs/results/PIPELINE/FILE.json`` (:func:`render_value`). ``--check`` renders without
writing and fails on any difference.

``apd report --publish`` fills ``docs/results/NAME/`` from a finished pipeline's artifacts (:func:`publish`):
the small JSON files only (results, the stage manifests with diagnostics and timings, every generator
seed's, the experiments' summaries), never samples or weights, and its figures into ``docs/figures/NAME/``.
"""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apd.config import PipelineConfig
from apd.errors import ArtifactError
from apd.evaluation.choice import choice_markdown
from apd.evaluation.yardstick import per_draw
from apd.experiments.studies import STUDIES, resolve
from apd.io import read_json, write_text_atomic, written_together
from apd.pipeline.figures import EVALUATION_FIGURES
from apd.pipeline.layout import PIPELINE_STAGES, Layout, manifest_of
from apd.pipeline.results import kept_keys
from apd.pipeline.table_format import format_duration, format_sample_count, markdown_table, method_label
from apd.pipeline.tables import TABLE_BUILDERS, ood_table
from apd.schedules import thinned_count

REGION = re.compile(r"(<!-- results:(?P<pipeline>[\w.,-]+):(?P<table>[\w.:-]+) -->\n)(?P<body>.*?)(<!-- end -->)",
                    re.S)
VALUE = re.compile(r"(<!-- value:(?P<pipeline>[\w.-]+):(?P<file>[\w-]+)(?P<path>(?:\.[\w-]+(?: [\w-]+)*)+)"
                   r"(?::(?P<format>[^ >]+))? -->)(?P<body>[^<\n]*)(<!-- /value -->)")
RESULT_TABLES = {build.__name__.removesuffix("_table"): build for build in TABLE_BUILDERS}
RESULTS_DIR = Path("docs/results")
# what each pipeline should take end to end on a 2-core CPU with nothing else running, venv built (seconds)
END_TO_END_TARGETS = {"fashion-fc1": 15 * 60, "fashion-fc2": 20 * 60, "fashion-lenet5": 30 * 60}
PAPER_FILE = Path("docs/paper-numbers.json")
FIGURES_DIR = Path("docs/figures")


def render_table(pipeline: str, table: str, root: Path) -> str:
    """The Markdown of one region."""
    if pipeline == "paper":
        return render_paper(table, _read(root / PAPER_FILE))
    if pipeline == "code" and table == "studies":
        return render_studies()
    results_dir = root / RESULTS_DIR / pipeline
    study_table = render_study(pipeline, table, root)
    if study_table is not None:
        return study_table
    if table == "toy2d":
        return render_toy2d(_read(results_dir / "toy2d.json"))
    if table == "diagnostics":  # the sample stage's own record, published before any evaluation
        return render_diagnostics(_read(results_dir / "samples.json")["diagnostics"])
    if table == "end-to-end":  # benchmarks/time_pipeline.py's record
        return render_end_to_end(_read(results_dir / "end_to_end.json"))
    if table == "durations":  # PIPELINE is a comma-separated list of results folders: one row per record
        return render_durations(*(_published(root, pipeline.split(","), name) for name in ("end_to_end", "floor")))
    if table == "floors":  # benchmarks/pipeline_floor.py's records, PIPELINE a comma-separated list
        return render_floors({name: _read(root / RESULTS_DIR / name / "floor.json") for name in pipeline.split(",")},
                             _published(root, pipeline.split(","), "end_to_end"))
    if table == "nothing-lost":  # benchmarks/nothing_lost.py's record
        return render_nothing_lost(_read(results_dir / "nothing_lost.json"))
    if table == "choice":  # benchmarks/choose_distiller.py's record: the rule applied to the candidates
        return choice_markdown(_read(results_dir / "choice.json"))
    if table == "performance":  # the benchmark scripts' records
        return render_performance([_read(path) for path in sorted(results_dir.glob("*.json"))])
    if table == "pipelines":  # PIPELINE is a comma-separated list of shipped pipelines: their settings
        from apd.config_load import load_config

        return render_pipelines({name: load_config(name) for name in pipeline.split(",")},
                                {name: root / RESULTS_DIR / name / "samples.json" for name in pipeline.split(",")})
    if table == "standing":  # PIPELINE is a comma-separated list: where APD stands on each
        names = pipeline.split(",")
        return render_standing({name: _read(root / RESULTS_DIR / name / "results.json") for name in names},
                               {name: _read(root / RESULTS_DIR / name / "samples.json") for name in names})
    if table == "samplers":  # PIPELINE is a comma-separated list: one row per pipeline's sample manifest
        return render_samplers({name: _read(root / RESULTS_DIR / name / "samples.json")
                                for name in pipeline.split(",")})
    results = _read(results_dir / "results.json")
    if table == "machine":
        return render_machine(results)
    if table.startswith("ood-"):
        built = ood_table({**results, "ood": {s: {table[4:]: by[table[4:]]} for s, by in results["ood"].items()
                                             if table[4:] in by}})
    elif table in RESULT_TABLES:
        built = RESULT_TABLES[table](results)
    else:
        raise ArtifactError(f"unknown results table {table!r} (known: {', '.join(RESULT_TABLES)}, ood-SCORE, "
                            "machine, diagnostics, choice, standing, samplers, end-to-end, durations, floors, "
                            f"nothing-lost, performance, pipelines, toy2d, {', '.join(study_regions())})")
    if built is None:
        raise ArtifactError(f"{results_dir}: has no data for table {table!r}")
    return built.markdown.strip()


def study_regions() -> list[str]:
    """The regions the studies render (:class:`~apd.experiments.studies.Study`): TABLE, TABLE-VARIANT where a
    study has variants, and its summary region (SUMMARY-VARIANT too where it has variants)."""
    names = []
    for study in STUDIES:
        names += [study.region, *([f"{study.region}-VARIANT"] if study.variants else []),
                  *([study.summary[0]] if study.summary else []),
                  *([f"{study.summary[0]}-VARIANT"] if study.summary and study.variants else [])]
    return names


def render_study(pipeline: str, table: str, root: Path) -> str | None:
    """A study's region (:data:`~apd.experiments.studies.STUDIES`), rendered from its published results;
    None when ``table`` names no study's region. A summary region's PIPELINE is a comma-separated list."""
    for study in STUDIES:
        variant = None if study.summary is None else _variant(table, study.summary[0], study.variants)
        if variant is not None:
            return resolve(study.summary[1])({name: _read(root / RESULTS_DIR / name / f"{study.stem}{variant}.json")
                                              for name in pipeline.split(",")}).strip()
        variant = _variant(table, study.region, study.variants)
        if variant is not None:
            return resolve(study.render)(_read(root / RESULTS_DIR / pipeline / f"{study.stem}{variant}.json")).strip()
    return None


def _variant(table: str, region: str, variants: bool) -> str | None:
    """``""`` where ``table`` is ``region``, ``-VARIANT`` where it is ``region-VARIANT`` of a study with
    ``variants``, None otherwise."""
    if table == region:
        return ""
    rest = table.removeprefix(f"{region}-")
    return f"-{rest}" if variants and rest != table else None


def render_studies() -> str:
    """The studies, one row each: the command, what it does and the networks it runs on."""
    body = [[f"`apd experiment {study.name}`", study.help, "MLP and CNN" if study.cnn_ok else "MLP"]
            for study in STUDIES]
    return markdown_table(["command", "what it does", "networks"], body)


def render_machine(results: dict) -> str:
    """One line: where and how fast the numbers were measured."""
    machine = results.get("machine", {})
    # results made before the kernels were recorded have none
    kernels = f", {machine['kernels']} kernels" if "kernels" in machine else ""
    measured = (f"Measured by `apd evaluate` on {machine.get('cpu', '?')} ({machine.get('cores', '?')} cores, "
                f"{machine.get('threads', '?')} torch thread(s), torch {machine.get('torch', '?')}, device "
                f"{machine.get('device', '?')}{kernels})")
    return f"{measured}; evaluation took {format_duration(results.get('timing', {}).get('total', 0.0))}."


def render_diagnostics(diagnostics: dict) -> str:
    """SGLD's convergence: rank-normalised split R-hat and bulk/tail ESS per family of quantities."""
    labels = {"function": r"p(y \| x) on validation inputs",  # the pipe escaped inside a Markdown table
              "log_lik": "log-likelihood", "weight_pcs": "top weight principal components"}
    body = []
    for family, s in diagnostics["families"].items():
        body.append([labels.get(family, family), f"{s['quantities']:,}", f"{s['rhat_median']:.3f}",
                     f"{s['rhat_max']:.3f}", f"{100 * s['frac_rhat_above_1.01']:.1f}",
                     f"{100 * s['frac_rhat_above_1.05']:.1f}", f"{s['ess_bulk_median']:,.0f}",
                     f"{s['ess_bulk_min']:,.0f}", f"{s['ess_tail_median']:,.0f}"])
    header = ["quantities", "count", "R-hat median", "R-hat max", "% > 1.01", "% > 1.05", "bulk ESS median",
              "bulk ESS min", "tail ESS median"]
    chains = (f"{diagnostics['chains_used']} chains" if not diagnostics.get("pseudo_chains") else
              f"one chain split into {diagnostics['chains_used']} pieces")
    note = f"{chains} × {diagnostics['draws_per_chain']:,} draws each"
    warning = diagnostics.get("warning")
    return (note + "; " + ("warning: " + warning if warning else "no convergence warning") + "\n\n"
            + markdown_table(header, body))


def short_commit(commit: str) -> str:
    """A recorded commit (a hash, ``+changes`` when the tree differed from it) cut to 12 hex digits."""
    return commit.split("+")[0][:12] + ("+changes" if commit.endswith("+changes") else "")


def load_average(machine: dict) -> str:
    """A timing record's 1, 5 and 15 minute load averages before it ran, as "0.24, 0.53, 1.07"."""
    return ", ".join(f"{x:.2f}" for x in machine["load_average_before"])


def machine_name(machine: dict) -> str:
    """A timing record's machine: its CPU and core count, and its GPU where it had one."""
    gpu = f"{machine['gpu']} with " if machine.get("gpu") else ""
    return f"{gpu}{machine['cpu']} ({machine['cores']} cores)"


def render_end_to_end(record: dict) -> str:
    """A pipeline's stages timed end to end (``benchmarks/time_pipeline.py``): each stage's wall clock, the
    parts its manifests record, the total (or which stages a run stopped before finishing), and where it
    was measured, at which commit (and the commit of any resumption made at another)."""
    parts = record.get("parts", {})
    body = [[f"`apd {stage}`", format_duration(seconds)] for stage, seconds in record["stages"].items()]
    if "total" in record:
        body.append(["total", f"**{format_duration(record['total'])}**"])
    else:
        body.append(["total", f"not reached: the run stopped before `apd {record['unfinished']}` finished"])
    machine = record["machine"]
    detail = "; ".join(f"{name} {format_duration(seconds)}" for name, seconds in parts.items())
    elsewhere = "".join(f", `apd {resumed['stage']}` resumed at `{short_commit(resumed['commit'])}`"
                        for resumed in record.get("resumed", []) if "commit" in resumed)
    return (f"`{record['config']}` at commit `{short_commit(record['commit'])}`{elsewhere} on {machine_name(machine)}; "
            f"load average before the run {load_average(machine)}; each stage its own process, imports "
            f"included. Recorded by the stages: {detail}.\n\n" + markdown_table(["stage", "wall clock"], body))


def _published(root: Path, pipelines: list[str], record: str) -> dict[str, dict | None]:
    """Each pipeline's record ``docs/results/PIPELINE/RECORD.json``, None where it has none."""
    return {name: _read(path) if (path := root / RESULTS_DIR / name / f"{record}.json").is_file() else None
            for name in pipelines}


def render_durations(records: dict[str, dict | None], floors: dict[str, dict | None]) -> str:
    """Pipelines timed end to end (``benchmarks/time_pipeline.py``), one row per results folder: where, each
    stage's wall clock, the total (or the stage a run stopped in), and the target of
    :data:`END_TO_END_TARGETS` on a CPU-only machine beside the protocol's arithmetic floor there
    (``benchmarks/pipeline_floor.py``, where measured), with whether the total met the target and, where the
    target lies below the floor, that no implementation could. A folder without a record is a row that says so."""
    stages = ("sample", "distill", "evaluate")
    body = []
    for name, record in records.items():
        target, floor = END_TO_END_TARGETS.get(name), floors[name]
        goal = f"≤ {target // 60} min" if target else "—"
        least = format_duration(floor["total"]) if floor else "—"
        if record is None:
            body.append([f"`{name}`", "not timed yet", *["—"] * len(stages), "—", goal, least, "—"])
            continue
        machine = record["machine"]
        where = machine["gpu"] if machine.get("gpu") else f"{machine['cpu']}, {machine['cores']} cores"
        times = [format_duration(record["stages"][stage]) if stage in record["stages"] else "—" for stage in stages]
        finished = "total" in record
        total = f"**{format_duration(record['total'])}**" if finished else f"stopped in `apd {record['unfinished']}`"
        verdict = ("—" if not target or machine.get("gpu")
                   else "met" if finished and record["total"] <= target
                   else "not met: the target is below the floor" if floor and target < floor["total"] else "not met")
        body.append([f"`{name}`", where, *times, total, goal, least, verdict])
    return markdown_table(["pipeline", "machine", *(f"`apd {stage}`" for stage in stages), "total", "target",
                           "floor", "verdict"], body)


def render_floors(floors: dict[str, dict], records: dict[str, dict | None]) -> str:
    """The protocol's arithmetic floor of each pipeline (``benchmarks/pipeline_floor.py``): every counted part,
    its count, its arithmetic per unit and its seconds at the machine's best rates, then each stage's floor
    beside the stage's recorded wall clock (``benchmarks/time_pipeline.py``) and where and at what rates it
    was measured."""
    body, runs = [], []
    for name, floor in floors.items():
        wall = (records[name] or {}).get("stages", {})
        for stage, seconds in floor["stages"].items():
            for part in (part for part in floor["parts"] if part["stage"] == stage):
                unit = f"{part['flops'] / 1e6:,.1f} MFLOP" if part["flops"] else f"{part['draws']:,} Gaussians"
                body.append([f"`{name}`", f"`apd {stage}`", part["what"], f"{part['count']:,}", unit,
                             format_duration(part["seconds"]), ""])
            recorded = f"{format_duration(wall[stage])} ({wall[stage] / seconds:.1f}×)" if stage in wall else "—"
            body.append([f"`{name}`", f"`apd {stage}`", "**the stage's floor**", "", "", format_duration(seconds),
                         recorded])
        body.append([f"`{name}`", "", "**total**", "", "", f"**{format_duration(floor['total'])}**",
                     f"{format_duration(records[name]['total'])}" if records[name] and "total" in records[name]
                     else "—"])
        rates = floor["rates"]
        runs.append([f"`{name}`", f"`{short_commit(floor['commit'])}`", machine_name(floor["machine"]),
                     load_average(floor["machine"]), f"{rates['peak_flops'] / 1e9:.0f} GFLOP/s (matmul "
                     f"{rates['matmul_flops'] / 1e9:.0f}, conv2d {rates['conv_flops'] / 1e9:.0f}); "
                     f"{rates['draws_per_second'] / 1e6:.0f} M Gaussians/s", floor["started"][:10]])
    return (markdown_table(["pipeline", "stage", "counted", "count", "each", "floor", "recorded (× the floor)"], body)
            + "\n\n" + markdown_table(["pipeline", "commit", "machine", "load average before", "best rates", "date"],
                                       runs))


def render_nothing_lost(record: dict) -> str:
    """The scenario matrix's last run (``benchmarks/nothing_lost.py --out``): where and when it ran, the
    cases run, passed, failed and skipped per group and in all, and each failed or skipped case with its
    reason."""
    groups = record["groups"]
    totals = {key: sum(counts[key] for counts in groups.values()) for key in ("cases", "passed", "failed",
                                                                               "skipped")}
    body = [[group, *(f"{counts[key]:,}" for key in totals)] for group, counts in groups.items()]
    body.append(["all", *(f"**{value:,}**" for value in totals.values())])
    machine = record["machine"]
    text = (f"`{record['command']}` at commit `{short_commit(record['commit'])}` on {machine_name(machine)}, "
            f"{record['started'][:10]}; load average before the run {load_average(machine)}; "
            f"{format_duration(record['seconds'])}.\n\n"
            + markdown_table(["group", "cases", "passed", "failed", "skipped"], body))
    for label, cases in (("Failed", record["failed"]), ("Skipped", record["skipped"])):
        if cases:
            text += f"\n\n{label}: " + "; ".join(f"`{case}` ({'; '.join(reasons)})"
                                                  for case, reasons in cases.items())
    return text


def render_performance(records: list[dict]) -> str:
    """The benchmark scripts' rows (the stage whose cost they measure, what was timed, what this run
    measured, the target) in the pipeline's stage order, then where and when each script ran."""
    if not records:
        raise ArtifactError("no benchmark records to render (run `make bench`, then publish its records)")
    records = sorted(records, key=lambda record: PIPELINE_STAGES.index(record["stage"]))  # stable sort
    body = [[f"`apd {record['stage']}`", row["what"], row["measured"], row["target"]]
            for record in records for row in record["rows"]]
    runs = []
    for record in records:
        machine = record["machine"]
        runs.append([f"`{record['command']}`", f"`{short_commit(record['commit'])}`", machine_name(machine),
                     load_average(machine), record["started"][:10]])
    return (markdown_table(["stage", "what", "measured", "target"], body) + "\n\n"
            + markdown_table(["run", "commit", "machine", "load average before", "date"], runs))


def render_pipelines(configs: dict[str, PipelineConfig], manifests: dict[str, Path]) -> str:
    """The shipped pipelines' settings, from their files: data, network (weights from the published sample
    manifest where there is one), SGLD (chains and their start, step, prior variance, iterations, burn-in,
    thinning and the samples it keeps) and OOD sets."""
    body = []
    for name, cfg in configs.items():
        s, net = cfg.sgld, cfg.net
        layers = "".join(f"conv {c}, " for c in net.conv) + "hidden " + "-".join(map(str, net.hidden))
        published = read_json(manifests[name]) if manifests[name].is_file() else {}
        weights = f" ({published['dimension']:,} weights)" if "dimension" in published else ""
        kept = thinned_count(s)
        start = "prior draws" if s.init == "prior" else "PyTorch's initialisation"
        schedule = "" if s.schedule == "constant" else f"{s.schedule} schedule, "
        sgld = (f"{s.chains} chain{'s' if s.chains > 1 else ''} from {start}; {schedule}lr {s.lr:g}, prior var "
                f"{s.prior_var:g}, batch {s.batch_size}, {s.iterations:,} it, burn-in {s.burn_in:,}, thin {s.thin} "
                f"→ {s.chains} × {kept:,} = {s.chains * kept:,} samples")
        body.append([f"`{name}`", cfg.data.dataset, f"{layers}{weights}", sgld, ", ".join(cfg.data.ood)])
    return markdown_table(["pipeline", "data", "network", "SGLD", "OOD sets"], body)


def render_samplers(manifests: dict[str, dict]) -> str:
    """Several pipelines' SGLD runs side by side: samples, time, the function-space diagnostics, the
    log-likelihood's and the top weight PCs' R-hat, and the final ensemble's validation accuracy."""
    body = []
    for name, manifest in manifests.items():
        d = manifest["diagnostics"]
        function, log_lik, pcs = (d["families"][f] for f in ("function", "log_lik", "weight_pcs"))
        body.append([f"`{name}`", f"{d['chains_used']} × {d['draws_per_chain']:,}", f"{manifest['samples']:,}",
                     format_duration(manifest["seconds"]),
                     f"{function['rhat_median']:.3f} / {function['rhat_max']:.3f}",
                     f"{100 * function['frac_rhat_above_1.01']:.1f}", f"{100 * function['frac_rhat_above_1.05']:.1f}",
                     f"{function['ess_bulk_median']:,.0f}", f"{function['ess_tail_median']:,.0f}",
                     f"{log_lik['rhat_median']:.3f}, {log_lik['ess_bulk_median']:,.0f}",
                     f"{pcs['rhat_median']:.2f}, {pcs['ess_bulk_median']:,.0f}",
                     f"{manifest['monitor_ensemble_val_accuracy']:.4f}"])
    header = ["pipeline", "chains × draws", "samples", "sampling", r"p(y \| x) R-hat median / max", "% > 1.01",
              "% > 1.05", "bulk ESS median", "tail ESS median", "log-lik R-hat, ESS", "weight PCs R-hat, ESS",
              "ensemble val. accuracy"]
    return markdown_table(header, body)


STANDING = (("bald_gap", "worst BALD gap"), ("max_prob_gap", "worst max-prob gap"), ("nll_gap", "NLL gap"),
            ("kl", "KL"))  # the summaries a distiller's standing is read on
OF_THE_MEAN = ("bald_gap", "max_prob_gap", "nll_gap")  # ranked otherwise in evaluations written before gaps per draw
STARRED = ("\n\n\\* An evaluation written before gaps per draw: its AUROC gaps are those of APD's mean AUROC over "
           "the runs, which leans in its favour against random subsets judged once each, and its NLL gap is signed; "
           "its KL is the mean of the runs' KL, as every evaluation's is (docs/design.md, the honest protocol).")


def render_standing(results: dict[str, dict], manifests: dict[str, dict]) -> str:
    """Where APD stands on several pipelines, a row for each set of kept samples it is set against that is
    stored as compactly as it is (where it is stored below float32: rounded whole at its precision and, where
    the results have them, about their chains' means; otherwise its float32 kept samples): the reference (its
    chains, the median function-space bulk ESS, the largest gaps between two halves of its chains where
    measured), APD's storage and seeds, the kept samples, and each seed's percentile rank among their random
    subsets on the four summaries of :data:`STANDING`."""
    body = []
    for name, result in results.items():
        function = manifests[name]["diagnostics"]["families"]["function"]
        stability = result.get("reference_stability")
        halves = ("—" if not stability else f"{stability['split_half']['max_auroc_gap']:.2f} points, "
                  f"{stability['split_half']['nll_gap']:.4f} nats")
        replicated = result["replicates"]["apd"]
        mean_gaps = not per_draw(result.get("quality", {}).values())
        sets = kept_keys(result["yardstick"]["equal_storage"]["apd"])
        for kept in sets[1:] or sets:
            ranks = replicated["against"][kept]["percentile"]
            body.append([f"`{name}`", f"{manifests[name]['diagnostics']['chains_used']}",
                         f"{function['ess_bulk_median']:,.0f}", halves,
                         format_sample_count(result["storage"]["apd"]["in_sgld_samples"]), kept,
                         f"{replicated['seeds']}",
                         *(" / ".join(f"{value:.1f}" for value in ranks[key]["values"])
                           + (" *" if mean_gaps and key in OF_THE_MEAN else "") for key, _ in STANDING)])
    header = ["pipeline", "chains", r"p(y \| x) bulk ESS median", "reference halves apart (AUROC, NLL)",
              "APD storage", "against kept", "seeds", *(f"percentile: {label}" for _, label in STANDING)]
    starred = any(not per_draw(result.get("quality", {}).values()) for result in results.values())
    return markdown_table(header, body) + (STARRED if starred else "")


def render_toy2d(summary: dict) -> str:
    """Mean BALD at the training points and far from both blobs, per method of the toy 2-D picture."""
    body = []
    for name, s in summary["methods"].items():
        if s.get("bald_train") is None:
            body.append([method_label(name), "n/a (one network)", "n/a", "n/a"])
        else:
            ratio = s.get("far_over_train")
            body.append([method_label(name), f"{s['bald_train']:.3f}", f"{s['bald_far']:.3f}",
                         "—" if ratio is None else f"{ratio:.1f}×"])
    return markdown_table(["method", "mean BALD at the training points", f"far (> {summary['far_sd']:g} sd)",
                           "far / near"], body)


def render_paper(table: str, paper: dict) -> str:
    """The paper's accuracy, OOD (``ood-max_prob``, ``ood-bald``) and adversarial tables."""
    if table == "accuracy":
        methods = ["mcdropout", "sgld", "apd"]
        body = [[net, *(f"{row[m]:.3f}" for m in methods)] for net, row in paper["accuracy"].items()]
        return markdown_table(["net", *map(method_label, methods)], body)
    if table.startswith("ood-"):
        by_set = paper["ood"][table[4:]]
        methods = list(next(iter(by_set.values())))
        body = [[name, *(" / ".join(f"{v:.1f}" for v in cells[m]) for m in methods)] for name, cells in by_set.items()]
        return markdown_table(["OOD set", *map(method_label, methods)], body)
    if table == "adversarial":
        targets = ["mcdropout", "sgld", "apd"]
        body = [[method_label(source), attack.upper(), *(f"{row[t]:.2f}" for t in targets)]
                for source, attacks in paper["adversarial"].items() for attack, row in attacks.items()]
        return markdown_table(["source", "attack", *map(method_label, targets)], body)
    raise ArtifactError(f"unknown paper table {table!r} (accuracy, ood-max_prob, ood-bald, adversarial)")


class _Traced(dict):
    """A JSON object read for a region that notes, in :data:`_LAST_READ`, the file and key path of each key
    read from it (by ``[]`` or ``get``), so that a missing key or a value of the wrong type can be named."""

    def __init__(self, data: dict, file: Path, path: str) -> None:
        super().__init__({key: _traced(value, file, f"{path}.{key}" if path else str(key))
                          for key, value in data.items()})
        self.file, self.path = file, path

    def _note(self, key: object) -> None:
        _LAST_READ[:] = [self.file, f"{self.path}.{key}" if self.path else str(key)]

    def __getitem__(self, key: object) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: object, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)


_LAST_READ: list = []  # [file, key path] of the last key a region's renderer read


def _traced(value: Any, file: Path, path: str) -> Any:
    if isinstance(value, dict):
        return _Traced(value, file, path)
    if isinstance(value, list):
        return [_traced(item, file, f"{path}[{i}]") for i, item in enumerate(value)]
    return value


def _read(path: Path) -> dict:
    """A results file (:func:`apd.io.read_json`) whose key reads are traced (:class:`_Traced`)."""
    return _Traced(read_json(path), path, "")


def render_value(pipeline: str, file: str, path: str, spec: str | None, root: Path,
                 read: Callable[[Path], Any] = _read) -> str:
    """One number of the prose: the value at key path ``path`` (".key.key…", a list's item by its index) of
    ``docs/results/PIPELINE/FILE.json``, written with the format ``spec``: ``duration``
    (:func:`~apd.pipeline.table_format.format_duration` of seconds), or a Python format specification, one
    ending in ``%`` writing the value times 100 followed by " %" as the docs write percentages. Without
    ``spec`` a whole number is written with thousands separators and a string as it is; any other value
    needs one, so that the precision quoted is chosen where it is quoted. ``read`` reads the results file
    (:func:`_read`; a document's values share one read of each file)."""
    value: Any = read(root / RESULTS_DIR / pipeline / f"{file}.json")
    for key in path.strip(".").split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    if spec == "duration":
        return format_duration(float(value))
    if spec is not None:
        written = format(value, spec)
        return written[:-1] + " %" if spec.endswith("%") else written
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"a {type(value).__name__} needs a format (:SPEC)")
    return f"{value:,}" if isinstance(value, int) else value


def render_document(text: str, root: Path) -> str:
    """``text`` with every marked region's body and every inline value rendered afresh. A results file a
    region's table or a value cannot be rendered from (a key missing, a value of the wrong type) is an
    :class:`ArtifactError` naming the file and the key last read from it."""
    def rendered(what: str, pipeline: str, render: Callable[[], str]) -> str:
        _LAST_READ.clear()
        try:
            return render()
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            where = f"{_LAST_READ[0]}: field '{_LAST_READ[1]}'" if _LAST_READ else f"results:{pipeline}"
            raise ArtifactError(f"{where}: missing or of the wrong type for {what} "
                                f"({type(exc).__name__}: {exc})") from None

    def fill(match: re.Match) -> str:
        body = rendered(f"table {match['table']!r}", match["pipeline"],
                        lambda: render_table(match["pipeline"], match["table"], root))
        return f"{match.group(1)}{body}\n{match.group(5)}"

    read_once = functools.cache(_read)  # each results file the document's values quote, read once

    def fill_value(match: re.Match) -> str:
        value = rendered(f"value '{match['file']}{match['path']}'", match["pipeline"],
                         lambda: render_value(match["pipeline"], match["file"], match["path"], match["format"], root,
                                              read_once))
        return f"{match.group(1)}{value}{match.group(7)}"
    return VALUE.sub(fill_value, REGION.sub(fill, text))


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render_docs(root: Path, check: bool = False) -> list[Path]:
    """Render every document under ``root``; returns those that changed. Unless ``check``, they are written
    together once every one has rendered (:func:`apd.io.written_together`): a results file that does not
    render leaves every document as it was."""
    changed = {}
    for path in documents(root):
        text = path.read_text()
        rendered = render_document(text, root)
        if rendered != text:
            changed[path] = rendered
    if not check:
        with written_together(list(changed)) as built:
            for path, rendered in changed.items():
                write_text_atomic(built[path], rendered)
    return list(changed)


def publish(layout: Layout, name: str, root: Path) -> list[Path]:
    """Copy the pipeline's committed-results files into ``docs/results/NAME/`` and its figures into
    ``docs/figures/NAME/``, as far as its stages have finished; returns the files written. An evaluation figure
    (:data:`~apd.pipeline.figures.EVALUATION_FIGURES`) published before and not drawn by this evaluation is
    removed, so that no figure shows numbers the published results no longer hold. Raises when ``apd sample``
    has not finished, or when the evaluation drew no figures (``[evaluate] figures = false``: `apd report`
    draws them)."""
    sources = [layout.results, layout.evaluate_manifest, manifest_of(layout.samples), manifest_of(layout.generator),
               *sorted(layout.root.glob("generator-seed*.json")), layout.eval_dir / "toy2d.json",
               *sorted(layout.experiments.glob("*.json"))]
    if not manifest_of(layout.samples).is_file():
        raise ArtifactError(f"{manifest_of(layout.samples)}: missing; run `apd sample` first")
    drawn = layout.eval_dir / "figures"
    if layout.results.is_file():
        if not drawn.is_dir():
            raise ArtifactError(f"{drawn}: the evaluation drew no figures; run `apd report` first")
        for stem in (s for s in EVALUATION_FIGURES if not (drawn / f"{s}.png").is_file()):
            (root / FIGURES_DIR / name / f"{stem}.png").unlink(missing_ok=True)
    figures = [*sorted(drawn.glob("*.png")), *sorted(layout.experiments.glob("*.png"))]
    if layout.diagnostics_figure.is_file():
        figures.append(layout.diagnostics_figure)
    written = []
    for files, target in ((sources, root / RESULTS_DIR / name), (figures, root / FIGURES_DIR / name)):
        target.mkdir(parents=True, exist_ok=True)
        for source in (f for f in files if f.is_file()):
            written.append(Path(shutil.copyfile(source, target / source.name)))
    return written
