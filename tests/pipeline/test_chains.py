"""Several SGLD chains on several workers: the joined store equals one worker's, a killed worker resumes,
torchrun across two "nodes" on the loopback address, and the joined store in distill and evaluate."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from apd.cli import main
from apd.config import config_hash
from apd.config_load import from_dict
from apd.errors import ArtifactError, ConfigError
from apd.io import read_json
from apd.pipeline.distributed import remove_orphaned_task_folders, task_folder
from apd.pipeline.layout import checkpoint_of, manifest_of, partial_of
from apd.pipeline.runtime import RunContext
from apd.pipeline.sample import sample_sgld
from apd.pipeline.sample_chains import Finished
from apd.pipeline.sample_workers import _check_shards
from apd.samplers.store import SampleStore
from apd.samplers.store_digest import content_digest
from tests.tiny_pipeline import TINY, toml
from tests.worker_helpers import free_port, signal_then_wait

REPO = Path(__file__).resolve().parents[2]
CHAINS = {
    "name": "chains",
    "data": {"dataset": "digits", "train_size": 1000, "val_size": 300},
    "net": {"hidden": [16]},
    "sgld": {"lr": 0.3, "prior_var": 0.1, "iterations": 400, "burn_in": 100, "thin": 10, "chains": 3,
             "init": "prior", "eval_every": 100, "checkpoint_every": 100},
    "baselines": {"epochs": 1, "mc_passes": 2},
}


def config(**sgld) -> dict:
    raw = json.loads(json.dumps(CHAINS))
    raw["sgld"].update(sgld)
    return raw


def context(root: Path, **sgld) -> RunContext:
    return RunContext(cfg=from_dict(config(**sgld)), artifacts_root=root, quiet=True)


def contents(path: Path) -> tuple[np.ndarray, ...]:
    with SampleStore.open(path) as store:
        return store.read_all().numpy(), store.steps, store.chains, store.lrs, store.log_liks


def assert_same_store(got: Path, want: Path) -> None:
    for a, b in zip(contents(got), contents(want), strict=True):
        np.testing.assert_array_equal(a, b)


def environment() -> dict[str, str]:
    """Subprocesses import this checkout's ``apd`` and use one compute thread."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory) -> RunContext:
    """The reference: three chains, one after another, in this process."""
    ctx = context(tmp_path_factory.mktemp("one"))
    sample_sgld(ctx)
    return ctx


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> RunContext:
    ctx = context(tmp_path_factory.mktemp("two"), workers=2)
    sample_sgld(ctx)
    return ctx


def test_two_workers_store_what_one_worker_stores(one_worker, two_workers):
    """Three chains on two workers: chains 0 and 2 in shard 0, chain 1 in shard 1, joined in chain order
    into a store equal, row for row and bit for bit, to one worker's; the manifest covers every file."""
    layout = two_workers.layout
    assert_same_store(layout.samples, one_worker.layout.samples)
    per_chain = (400 - 100) // 10
    with SampleStore.open(layout.samples) as store:
        assert len(store) == 3 * per_chain
        assert store.chains.tolist() == [c for c in range(3) for _ in range(per_chain)]
        assert store.shards == [layout.shard(0), layout.shard(1)]
        assert np.isfinite(store.read([0, len(store) - 1]).numpy()).all()
        seeds = store.meta["chain_seeds"]
        assert sorted(seeds) == ["0", "1", "2"]
        assert len({s for streams in seeds.values() for s in streams}) == 9  # every stream its own seed
        assert store.meta["workers"] == 2
        first = store.read([0, per_chain, 2 * per_chain]).numpy()
        assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    with SampleStore.open(layout.shard(0)) as shard:
        assert sorted(set(shard.chains.tolist())) == [0, 2]
    record = read_json(manifest_of(layout.samples))
    assert set(record["files"]) == {"samples.h5", "samples-0.h5", "samples-1.h5"}
    assert [s["chains"] for s in record["shards"]] == [[0, 2], [1]]
    assert record["samples"] == 3 * per_chain and record["workers"] == 2 and record["chains"] == 3
    # the same samples in other files: the samples' digest is one worker's, and the one the published store gives
    assert record["samples_digest"] == read_json(manifest_of(one_worker.layout.samples))["samples_digest"]
    with SampleStore.open(layout.samples) as store:
        assert content_digest(store) == record["samples_digest"]
    diagnostics = record["diagnostics"]
    assert diagnostics["chains_used"] == 3 and not diagnostics["pseudo_chains"]
    assert set(diagnostics["families"]) == {"function", "log_lik", "weight_pcs"}
    assert layout.diagnostics_figure.is_file()
    left = sorted(p.name for p in layout.root.iterdir())  # no partial store, checkpoint or probe is left
    assert left == ["diagnostics.png", "samples-0.h5", "samples-1.h5", "samples.h5", "samples.json"]


def test_one_worker_diagnostics_and_one_warning(one_worker, tmp_path, caplog):
    """The manifest holds the diagnostics of the three chains; a run that fails the thresholds logs one
    warning, which says which threshold failed."""
    record = read_json(manifest_of(one_worker.layout.samples))
    function = record["diagnostics"]["families"]["function"]
    assert function["chains"] == 3 and function["quantities"] == 300
    ctx = context(tmp_path, chains=2, iterations=300)
    with caplog.at_level(logging.INFO):
        sample_sgld(ctx)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "may not have converged" in warnings[0].getMessage()
    assert "R-hat > 1.01 on" in warnings[0].getMessage() or "bulk ESS" in warnings[0].getMessage()
    assert any("function-space inputs (300)" in r.getMessage() for r in caplog.records)


def test_workers_are_not_part_of_the_config_hash_and_never_outnumber_chains():
    assert config_hash(from_dict(config(workers=1)), "sample") == config_hash(from_dict(config(workers=3)), "sample")
    with pytest.raises(ConfigError, match="'sgld.workers' \\(4\\) must be at most 'sgld.chains' \\(3\\)"):
        from_dict(config(workers=4))


def test_a_missing_or_short_shard_is_named_before_joining(tmp_path):
    shards = [tmp_path / "samples-0.h5", tmp_path / "samples-1.h5"]
    reports = [Finished(rank, "node-a", [rank], 5, 0, 1.0, 1.0, None, "torch-generator") for rank in (0, 1)]
    with SampleStore.create(partial_of(shards[0]), _spec(), {}) as store:
        for i in range(5):
            store.append(np.zeros(_spec().numel), step=i, chain=0)
    with pytest.raises(ArtifactError, match=r"worker 1's shard .*samples-1.partial.h5 \(chains 1, written on "
                                            r"node-a\) is missing here .*shared artifacts directory"):
        _check_shards(reports, shards)
    with SampleStore.create(partial_of(shards[1]), _spec(), {}) as store:
        store.append(np.zeros(_spec().numel), step=0, chain=1)
    with pytest.raises(ArtifactError, match=r"holds 1 samples, its worker stored 5: delete it and "
                                            r".*samples-1.ckpt.pt"):
        _check_shards(reports, shards)


def _spec():
    from apd.nets import ParamSpec, mlp

    return ParamSpec.from_module(mlp([4, 3, 2]))


def _worker_holding(parent: int, name: str) -> int | None:
    """The child process of ``parent`` that has a file called ``name`` open (Linux /proc)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for child in children:
        try:
            for fd in Path(f"/proc/{child}/fd").iterdir():
                if os.readlink(fd).endswith(name):
                    return int(child)
        except OSError:
            continue
    return None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to find the worker")
def test_a_killed_worker_leaves_a_readable_shard_and_the_rerun_equals_an_uninterrupted_run(tmp_path):
    raw = config(chains=2, iterations=1600, checkpoint_every=300, workers=2)
    cfg_path = tmp_path / "chains.toml"
    cfg_path.write_text(toml(raw))
    reference = RunContext(cfg=from_dict(config(chains=2, iterations=1600, checkpoint_every=300)),
                           artifacts_root=tmp_path / "reference", quiet=True)
    sample_sgld(reference)

    root = tmp_path / "artifacts"
    command = [sys.executable, "-m", "apd", "sample", "--config", str(cfg_path), "--artifacts", str(root), "--quiet"]
    shard = root / "chains" / "samples-1.h5"
    process = subprocess.Popen(command, cwd=REPO, env=environment(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not checkpoint_of(shard).is_file():  # worker 1 is past iteration 300 of its 1,600
            assert process.poll() is None and time.monotonic() < deadline, "worker 1 wrote no checkpoint"
            time.sleep(0.02)
        victim = _worker_holding(process.pid, partial_of(shard).name)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "worker 1 killed by SIGKILL" in lines[0] and "run the same command again" in lines[0]
    with SampleStore.open(partial_of(shard)) as store:  # the dead worker's shard reads, up to its last append
        assert len(store) >= (300 - 100) // 10 and np.isfinite(store.read_all().numpy()).all()
    assert not (root / "chains" / "samples.h5").exists()

    assert main(["sample", "--config", str(cfg_path), "--artifacts", str(root), "--quiet"]) == 0
    assert_same_store(root / "chains" / "samples.h5", reference.layout.samples)


def test_a_task_folder_left_by_a_killed_parent_is_removed_by_the_next_spawn(tmp_path):
    """A process killed (SIGKILL) inside :func:`task_folder` leaves its folder; the next one removes it, and
    leaves a running one's folder and a folder without a lock alone."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom apd.pipeline.distributed import "
         "task_folder\nwith task_folder(Path(sys.argv[1])) as folder:\n    (folder / 'task.pickle').touch()\n"
         "    print(folder, flush=True)\n    time.sleep(600)", str(tmp_path)],
        cwd=REPO, env=environment(), stdout=subprocess.PIPE, text=True)
    try:
        killed = Path(holder.stdout.readline().strip())
    finally:
        holder.kill()
        holder.wait()
    unlocked = tmp_path / "apd-workers-unlocked"
    unlocked.mkdir()
    assert killed.is_dir() and (killed / "task.pickle").is_file()
    with task_folder(tmp_path) as running:
        assert not killed.exists() and unlocked.is_dir()
        assert remove_orphaned_task_folders(tmp_path) == [] and running.is_dir()
    assert not running.exists() and sorted(tmp_path.iterdir()) == [unlocked]


def test_a_worker_prints_its_stacks_on_sigusr1_and_goes_on(tmp_path):
    """``kill -USR1`` on a sampling worker prints where each of its threads is, and the worker carries on to
    exit 0 when its work is done."""
    started, release = tmp_path / "started", tmp_path / "release"
    task = tmp_path / "task.pickle"
    task.write_bytes(pickle.dumps((signal_then_wait, 1, "unused", (str(started), str(release)))))
    worker = subprocess.Popen([sys.executable, "-m", "apd.pipeline.spawned", str(os.getpid()), str(task), "0"],
                              cwd=REPO, env=environment(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert worker.poll() is None, worker.communicate()[1]  # it has exited: its stderr reads whole
            assert time.monotonic() < deadline, "the worker did not start its task within 120 s"
            time.sleep(0.01)
        worker.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        release.touch()
        _, err = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    assert "most recent call first" in err and "in signal_then_wait" in err


def test_torchrun_with_two_nodes_on_the_loopback_address(one_worker, tmp_path):
    """Two torchrun launches, one per "node" (--nnodes 2, gloo on 127.0.0.1), writing into one directory:
    the joined store equals one worker's, and rank 0 alone trains the baselines."""
    cfg_path = tmp_path / "chains.toml"
    cfg_path.write_text(toml(config()))
    root = tmp_path / "shared"
    torchrun = Path(sys.executable).with_name("torchrun")
    endpoint = f"127.0.0.1:{free_port()}"
    launches = [subprocess.Popen(
        [str(torchrun), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node), "--rdzv-endpoint",
         endpoint, "-m", "apd", "sample", "--config", str(cfg_path), "--artifacts", str(root), "--quiet"],
        cwd=REPO, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    outputs = []
    try:
        for launch in launches:
            outputs.append(launch.communicate(timeout=300)[0])
    finally:
        for launch in launches:
            launch.kill()
    assert [launch.returncode for launch in launches] == [0, 0], "\n".join(outputs)
    layout = root / "chains"
    assert_same_store(layout / "samples.h5", one_worker.layout.samples)
    record = read_json(layout / "samples.json")
    assert [s["chains"] for s in record["shards"]] == [[0, 2], [1]] and record["workers"] == 2
    assert (layout / "baselines" / "sgd.pt").is_file()


@pytest.fixture(scope="module")
def joined_pipeline(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny pipeline with two chains on two workers, through sample, distill and evaluate."""
    raw = json.loads(json.dumps(TINY))
    raw["sgld"].update({"chains": 2, "workers": 2, "iterations": 1500})
    raw["distill"].update({"steps": 40, "eval_every": 20, "checkpoint_every": 20})
    raw["evaluate"].update({"runs": 1, "yardstick_sizes": [2], "figures": False})
    root = tmp_path_factory.mktemp("joined")
    cfg_path = root / "tiny.toml"
    cfg_path.write_text(toml(raw))
    for stage in ("sample", "distill", "evaluate"):
        assert main([stage, "--config", str(cfg_path), "--artifacts", str(root), "--quiet"]) == 0
    return root, cfg_path


def test_joined_store_works_unchanged_in_distill_and_evaluate(joined_pipeline, capsys):
    root, cfg_path = joined_pipeline
    layout = root / "tiny"
    assert (layout / "generator.pt").is_file() and (layout / "samples-1.h5").is_file()
    results = read_json(layout / "eval" / "results.json")
    assert results["accuracy"]["sgld"]["acc"]["mean"] > 0.85
    assert results["accuracy"]["apd"]["acc"]["mean"] > 0.7
    diagnostics = results["sgld_diagnostics"]
    assert results["samples_digest"] == read_json(layout / "samples.json")["samples_digest"]  # the store it judged
    assert diagnostics["chains_used"] == 2 and diagnostics["families"]["function"]["quantities"] == 300
    stored = sum((layout / name).stat().st_size for name in ("samples.h5", "samples-0.h5", "samples-1.h5"))
    assert results["storage"]["sgld"]["bytes"] == stored
    assert read_json(layout / "generator.json")["storage"]["store_bytes"] == stored
    assert main(["info", "--config", str(cfg_path), "--artifacts", str(root)]) == 0
    out = capsys.readouterr().out
    assert "sgld       2 chain(s) on 2 worker(s); convergence diagnostics, 2 chains" in out
    assert "function-space inputs (300)" in out
    assert f"samples' digest {read_json(layout / 'samples.json')['samples_digest']} " in out
    stability = results["reference_stability"]  # one chain in each half
    assert stability["chains"] == 2 and sorted(sum(stability["split_half"]["halves"], [])) == [0, 1]
    assert f"reference  2 chains, {stability['samples']:,} samples: halves of the chains" in out
