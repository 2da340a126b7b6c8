"""The benchmark scripts' own set-up (their timings are runs, not tests)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_seed_workers_timing_distills_in_a_scratch_copy_of_the_store(tmp_path, monkeypatch):
    """``time_seed_workers.py`` distills beside the pipeline, never in it: the scratch directory links to the
    store's files, holds a copy of its manifest and nothing of the pipeline's generators."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from time_seed_workers import scratch_pipeline

    from apd.pipeline.layout import Layout

    pipeline = tmp_path / "artifacts" / "demo"
    pipeline.mkdir(parents=True)
    for name in ("samples.h5", "samples-0.h5", "samples-1.h5", "samples.json", "generator.pt", "generator.json"):
        (pipeline / name).write_text(name)
    scratch = tmp_path / "scratch"
    scratch_pipeline(Layout(pipeline), scratch)

    copied = scratch / "demo"
    assert sorted(p.name for p in copied.iterdir()) == ["samples-0.h5", "samples-1.h5", "samples.h5", "samples.json"]
    for name in ("samples.h5", "samples-0.h5", "samples-1.h5"):
        assert (copied / name).is_symlink() and (copied / name).resolve() == (pipeline / name).resolve()
    assert not (copied / "samples.json").is_symlink() and (copied / "samples.json").read_text() == "samples.json"


def test_pipeline_timing_names_each_seed_and_a_batch_of_seeds_once(tmp_path, monkeypatch):
    """``time_pipeline.py`` reads the stages' own seconds: a seed trained alone is its own part; seeds trained
    as one batch (each manifest holding the group's seconds) are one part, named once."""
    import json

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from time_pipeline import recorded_parts

    for name, seconds in (("generator.json", 3.0), ("generator-seed1.json", 4.5)):
        (tmp_path / name).write_text(json.dumps({"seconds": seconds, "alignment": {"seconds": 1.25}}))
    assert recorded_parts(tmp_path) == {"alignment": 1.25, "distillation": 3.0, "distillation, seed1": 4.5}
    for name in ("generator.json", "generator-seed1.json", "generator-seed2.json"):
        (tmp_path / name).write_text(json.dumps({"seconds": 7.0, "trained_with_seeds": [0, 1, 2]}))
    assert recorded_parts(tmp_path) == {"distillation, seeds 0, 1, 2 as one batch": 7.0}


def test_a_stopped_pipeline_timing_resumes_at_the_stage_it_stopped_in_timed_whole(tmp_path, monkeypatch):
    """``time_pipeline.py --resume`` goes on with the record of a run stopped in ``apd evaluate``: the stages it
    finished are kept, the one it stopped in runs again from its start (``--force``), the total is the stages'
    sum and the resumption is noted; a finished record, or one of another commit, is refused (exit 2), the
    latter taken with ``--across-commits``, its commit named in the resumption."""
    import json
    import subprocess
    import sys

    import pytest

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import time_pipeline

    calls, stop = [], {"in": "evaluate"}

    def run(command, check):
        stage, root = command[3], Path(command[command.index("--artifacts") + 1])
        calls.append((stage, "--force" in command))
        (root / "demo").mkdir(parents=True, exist_ok=True)
        (root / "demo" / "samples.json").write_text(json.dumps({"seconds": 1.5}))
        if stage == stop["in"]:
            raise subprocess.CalledProcessError(137, command)

    header = {"commit": "abc", "started": "2026-12-01T00:00:00+00:00", "machine": {"load_average_before": [0.1]}}
    monkeypatch.setattr(time_pipeline.subprocess, "run", run)
    monkeypatch.setattr(time_pipeline, "run_header", lambda: dict(header))
    out, artifacts = tmp_path / "end_to_end.json", tmp_path / "artifacts"
    argv = ["time_pipeline.py", "--config", "demo.toml", "--out", str(out), "--artifacts", str(artifacts)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(subprocess.CalledProcessError):
        time_pipeline.main()
    stopped = json.loads(out.read_text())
    assert stopped["unfinished"] == "evaluate" and list(stopped["stages"]) == ["sample", "distill"]
    stop["in"], calls[:] = None, []
    header["started"], header["machine"] = "2026-12-01T01:00:00+00:00", {"load_average_before": [0.2]}
    monkeypatch.setattr(sys, "argv", [*argv, "--resume"])
    assert time_pipeline.main() == 0
    assert calls == [("evaluate", True)]
    record = json.loads(out.read_text())
    assert "unfinished" not in record and list(record["stages"]) == ["sample", "distill", "evaluate"]
    assert record["total"] == pytest.approx(sum(record["stages"].values()), abs=0.01)
    assert record["resumed"] == [{"stage": "evaluate", "started": "2026-12-01T01:00:00+00:00",
                                  "load_average_before": [0.2]}]
    assert record["stages"]["sample"] == stopped["stages"]["sample"] and record["parts"] == {"sampling": 1.5}
    with pytest.raises(SystemExit) as finished:
        time_pipeline.main()
    out.write_text(json.dumps(stopped))
    header["commit"] = "def"
    with pytest.raises(SystemExit) as elsewhere:
        time_pipeline.main()
    assert finished.value.code == elsewhere.value.code == 2 and calls == [("evaluate", True)]
    monkeypatch.setattr(sys, "argv", [*argv, "--across-commits"])
    with pytest.raises(SystemExit) as alone:
        time_pipeline.main()
    assert alone.value.code == 2
    monkeypatch.setattr(sys, "argv", [*argv, "--resume", "--across-commits"])
    assert time_pipeline.main() == 0
    record = json.loads(out.read_text())
    assert record["commit"] == "abc" and record["resumed"][-1]["commit"] == "def"
    assert calls == [("evaluate", True)] * 2 and list(record["stages"]) == ["sample", "distill", "evaluate"]


def test_the_card_checks_refuse_an_unknown_check_in_one_line():
    """``on_a_card.sh`` names the checks it knows, in one line and exit code 2, before it installs or runs anything."""
    import subprocess

    for args in ([], ["gpu"]):
        run = subprocess.run(["bash", str(ROOT / "benchmarks" / "on_a_card.sh"), *args], capture_output=True,
                             text=True, check=False)
        assert run.returncode == 2 and run.stdout == "" and len(run.stderr.splitlines()) == 1
        assert run.stderr.startswith("on_a_card.sh: ") and "tests, digits, fashion-fc1, chains or gans" in run.stderr
    assert "unknown check 'gpu'" in run.stderr


def _floor_module(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import pipeline_floor

    return pipeline_floor


def test_floor_counts_an_sgld_iteration_and_a_prediction_by_hand(monkeypatch):
    """An MLP [in, h, out] on a minibatch of B: forward 2B(in·h + h·out), backward the same for the weights and
    2B·h·out more for the hidden layer's input gradient (the images need none): 4B·in·h + 6B·h·out. One
    network's prediction on N inputs is the forward alone, 2N(in·h + h·out)."""
    import torch

    from apd.config import PipelineConfig
    from apd.nets import ParamSpec, network

    floor = _floor_module(monkeypatch)
    cfg = PipelineConfig()
    cfg.sgld.batch_size = 5
    x, y = torch.randn(10, 8), torch.randint(3, (10,))
    assert floor.sgld_iteration_flops(cfg, [8, 4, 3], x, y) == 4 * 5 * 8 * 4 + 6 * 5 * 4 * 3
    spec = ParamSpec.from_module(network([8, 4, 3]))
    assert floor.prediction_flops(spec, torch.randn(200, 8), 1000) == 2 * 1000 * (8 * 4 + 4 * 3)


def test_floor_counts_one_gan_per_chain_as_that_many_gans(monkeypatch):
    """C chains' GANs stacked do C times the arithmetic of one GAN of the same sizes."""
    from apd.config import PipelineConfig

    floor = _floor_module(monkeypatch)
    cfg = PipelineConfig()
    cfg.distill.gen_hidden, cfg.distill.critic_hidden, cfg.distill.batch_size = [16], [16], 10
    one = floor.gan_step_flops(cfg, 6, chains=3)
    cfg.distill.per_chain = True
    assert one > 0 and floor.gan_step_flops(cfg, 6, chains=3) == 3 * one


def test_floor_counts_each_stored_sample_the_yardstick_predicts_once_per_storage(monkeypatch):
    """Two chains of 10 rows: 4 reference rows at float32; at int8, 2 kept with no random subset are each
    chain's centre and last row (4 rows); a size drawing the whole store takes every row; the same rows stored
    about their chains' means are other networks, counted apart."""
    floor = _floor_module(monkeypatch)
    yardstick = {"reference": {"kl_samples": 4}, "kept": {"2 int8": {"k": 2, "precision": "int8", "subsets": 0}}}
    assert floor.yardstick_rows(yardstick, [10, 10]) == {"float32": 4, "int8": 4}
    yardstick["kept"]["20"] = {"k": 20, "precision": "float32", "subsets": 1}
    assert floor.yardstick_rows(yardstick, [10, 10]) == {"float32": 20, "int8": 4}
    around = "int8 around chain means at int8"
    yardstick["kept"]["2 " + around] = {"k": 2, "precision": around, "subsets": 0}
    assert floor.yardstick_rows(yardstick, [10, 10]) == {"float32": 20, "int8": 4, around: 4}


def test_floor_record_sums_its_parts_at_the_machine_rates(monkeypatch):
    """T = count · (FLOPs / peak + draws / draw rate), summed by stage and in all."""
    floor = _floor_module(monkeypatch)
    parts = [floor.Part("sample", "products", 1000, flops=2_000_000), floor.Part("sample", "noise", 1000, draws=500),
             floor.Part("distill", "steps", 10, flops=10**9)]
    record = floor.floor_record("demo", parts, {"peak_flops": 1e9, "draws_per_second": 1e6}, {"commit": "x"})
    assert [row["seconds"] for row in record["parts"]] == [2.0, 0.5, 10.0]
    assert record["stages"] == {"sample": 2.5, "distill": 10.0} and record["total"] == 12.5


def test_floor_counts_the_baselines_training_and_validation_by_their_settings(monkeypatch):
    """SGD and MC dropout train [baselines] epochs each, every ensemble member as many, SWAG swag_epochs at each
    learning rate; the SGD networks predict the validation split once an epoch and SWAG draws swag_val_samples
    at each rate; a peer the evaluation does not compare is not trained."""
    from apd.config import PipelineConfig

    floor = _floor_module(monkeypatch)
    cfg = PipelineConfig()
    cfg.baselines.epochs, cfg.peers.ensemble_members, cfg.peers.swag_epochs = 20, 5, 10
    cfg.peers.swag_lrs, cfg.peers.swag_val_samples = [0.1, 0.3, 1.0], 30
    assert floor.baseline_epochs(cfg) == 2 * 20 + 5 * 20 + 3 * 10
    assert floor.validation_passes(cfg) == (1 + 5) * 20 + 3 * 30
    cfg.evaluate.methods = ["sgd", "mcdropout", "sgld", "apd"]
    assert floor.baseline_epochs(cfg) == 2 * 20 and floor.validation_passes(cfg) == 20


def test_floor_predicts_only_the_networks_a_method_needs_whole(monkeypatch):
    """Every member of every run of a method whose members differ in every layer; the SGD network once; the
    last-layer Laplace's earlier layers once a run and each member's last layer ([8, 4, 3]: 2N·4·3 on N inputs)."""
    from apd.nets import ParamSpec, network

    floor = _floor_module(monkeypatch)
    results = {"runs": 3, "ensemble": {"apd": 100, "swag": 100, "sgd": 1, "laplace-ll": 100, "mcdropout": 200,
                                       "sgld": 100, "kept": 4}}
    assert floor.whole_networks(results) == 3 * 200 + 1 + 3
    assert floor.last_layer_flops(ParamSpec.from_module(network([8, 4, 3])), 1000) == 2 * 1000 * 4 * 3


def test_choose_distiller_records_the_choice_and_the_store_it_judged_on(tiny_pipeline, tmp_path, monkeypatch):
    """``choose_distiller.py`` on the tiny pipeline's generator under two names: the same criterion for both
    (judged on the same draws), the first kept of a tie, and the record names the machine and the digests of
    the store it ran on, as the store's manifest gives them."""
    import json

    from apd.io import read_json

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from choose_distiller import main

    root, config = tiny_pipeline
    record_file = tmp_path / "choice.json"
    monkeypatch.setattr("sys.argv", ["choose_distiller.py", "--config", str(config), "--json", str(record_file),
                                     "--ceiling", f"shipped={root / 'tiny'}", f"again={root / 'tiny'}"])
    assert main() == 0
    record = json.loads(record_file.read_text())
    shipped, again = record["rows"]
    assert (shipped["name"], again["name"]) == ("shipped", "again")
    assert shipped["criterion"] == again["criterion"] and record["chosen"] == "shipped"
    assert record["ceiling"]["storage_precision"] == "float32"
    manifest = read_json(root / "tiny" / "samples.json")
    assert record["provenance"]["store_files"] == manifest["files"]
    assert record["provenance"]["store_samples"] == manifest["samples_digest"] is not None
    assert record["provenance"]["machine"]["threads"] == 1  # the script judges on one thread
    assert shipped["trained_on"] == again["trained_on"] == read_json(root / "tiny" / "generator.json")["machine"]
