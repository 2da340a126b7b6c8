"""Nothing lost: a stage that fails, races or gets stale inputs never destroys a complete artifact.

Each test runs the CLI on a tiny digits pipeline against a complete artifact set and asserts the exit
code, one line on stderr (never a traceback) and byte-identical complete artifacts afterwards (or their
correct replacement where the run legitimately succeeds). ``benchmarks/nothing_lost.py`` runs the
whole scenario matrix; the slow test at the end drives it.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

from apd.cli import main
from apd.nets import mlp
from benchmarks.process_tree import children as _children
from benchmarks.process_tree import running as _running
from tests.tiny_pipeline import toml, without_timings

REPO = Path(__file__).resolve().parents[2]
HANG_SECONDS = 600  # an apd run of the tiny pipeline taking longer than this has hung
CONFIG = {
    "name": "nl", "threads": 1,
    "data": {"dataset": "digits", "train_size": 1000, "val_size": 300, "ood": ["gaussian"]},
    "net": {"hidden": [16]},
    "sgld": {"lr": 0.1, "prior_var": 0.1, "iterations": 300, "burn_in": 100, "thin": 10, "eval_every": 100,
             "checkpoint_every": 100},
    "baselines": {"epochs": 2, "lr": 0.1, "mc_passes": 5},
    "distill": {"generator": "subspace", "subspace_rank": 4, "steps": 20, "eval_every": 10, "checkpoint_every": 10,
                "gen_hidden": [16], "critic_hidden": [16], "eval_networks": 10, "lr": 1e-3, "fit_samples": 20,
                "residual": {"model": "none"}},
    "evaluate": {"runs": 1, "networks": 10, "sgld_samples": 10, "mc_passes": 5, "ood_size": 50, "mog_components": [1],
                 "mog_fit_samples": 20, "scores": ["bald", "entropy"], "yardstick_sizes": [2]},
}
WORK = re.compile(r"(^\.lock$|\.partial(\.|$)|\.ckpt\.pt$|\.tmp(\.|$)|\.probe\.h5$)")  # the probe: an unpublished join


def snapshot(root: Path) -> dict[str, str]:
    """SHA-256 of every complete artifact file under ``root`` (the lock and work in progress left out)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(WORK.search(part) for part in p.relative_to(root).parts)}


def forge(manifest: Path) -> None:
    """Make ``manifest`` record its files' current digests: a damaged file under a 'valid' manifest."""
    from apd.pipeline.manifests import file_digest

    record = json.loads(manifest.read_text())
    record["files"] = {name: file_digest(manifest.parent / name) for name in record["files"]}
    manifest.write_text(json.dumps(record))


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    """A complete artifact set (sample, distill, evaluate) of the tiny pipeline: (root, config path)."""
    root = tmp_path_factory.mktemp("complete")
    config = root / "nl.toml"
    config.write_text(toml(CONFIG))
    for stage in ("sample", "distill", "evaluate"):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([stage, "--config", str(config), "--artifacts", str(root / "art"), "--quiet"]) == 0
    return root / "art", config


Run = namedtuple("Run", "rc err")


class Artifacts:
    """A copy of the complete set for one test, and the CLI run on it."""

    def __init__(self, source: Path, config: Path, root: Path) -> None:
        shutil.copytree(source, root)
        self.root, self.config, self.dir = root, config, root / "nl"

    def argv(self, command: str, *extra: str, root: Path | None = None) -> list[str]:
        return [command, "--config", str(self.config), "--artifacts", str(root or self.root), "--quiet", *extra]

    def run(self, command: str, *extra: str, root: Path | None = None) -> Run:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(self.argv(command, *extra, root=root))
        return Run(rc, err.getvalue())

    def fails(self, command: str, *extra: str, match: str | None = None, root: Path | None = None) -> str:
        """Run a command that must stop with exit 2 and one line, leaving every complete artifact as it was."""
        where = (root or self.root) / "nl"
        before = snapshot(where)
        rc, err = self.run(command, *extra, root=root)
        assert rc == 2, err
        assert len(err.strip().splitlines()) == 1, err
        if match:
            assert re.search(match, err), err
        assert snapshot(where) == before
        return err

    def path(self, name: str) -> Path:
        return self.dir / name


@pytest.fixture
def art(complete, tmp_path):
    return Artifacts(complete[0], complete[1], tmp_path / "art")


def nonfinite_checkpoints(root: Path) -> list[str]:
    from apd.io import nonfinite_tensor

    return [p.name for p in root.rglob("*.ckpt.pt") if nonfinite_tensor(torch.load(p, weights_only=True))]


# ----------------------------------------------------------------------------------------- other processes


class Child:
    """``apd.cli.main(argv)`` in a forked process (torch is imported already), stderr to a file."""

    def __init__(self, argv: list[str], err: Path) -> None:
        self.err = err
        sys.stdout.flush(), sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                try:
                    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(fd, 2)
                    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                    sys.stderr, sys.stdout = os.fdopen(2, "w"), os.fdopen(1, "w")  # past pytest's capture
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs: Child.wait's report
                    code = main(argv)
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stderr.flush()
            finally:  # a Ctrl-C during the flush too: the fork never returns into pytest's code
                os._exit(code)
        self.rc: int | None = None

    def poll(self, block: bool = False) -> int | None:
        """Its exit code (minus the signal that ended it), or None while it runs (``block``: wait for it)."""
        if self.rc is None:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            if pid:
                self.rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.rc

    def wait(self, timeout: float = HANG_SECONDS) -> int:
        """Its exit code; one still running after ``timeout`` seconds is killed and fails the test with the
        stacks of its threads, so that a hang fails in minutes instead of holding the suite."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.rc is None:
            for pid in (self.pid, *_children(self.pid)):  # sampling workers print their stacks on SIGUSR1 too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
            time.sleep(2)
            self.stop()
            pytest.fail(f"apd still running after {timeout:.0f} s; its stderr and stacks:\n"
                        + self.err.read_text()[-20000:])
        return self.rc

    def stop(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.poll(block=True)


def holding_lock(art: Artifacts, child: Child, timeout: float = 120) -> bool:
    """Wait until ``child`` holds the artifact lock (its PID is in the lock file)."""
    lock, deadline = art.dir / ".lock", time.monotonic() + timeout
    while time.monotonic() < deadline and child.poll() is None:
        if lock.is_file() and lock.read_text().strip() == str(child.pid):
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize(("holder", "second"), [
    (("sample", "--force", "--set", "sgld.iterations=100000"), ("sample", "--force")),
    (("distill", "--force", "--set", "distill.steps=100000"), ("sample", "--set", "sgld.lr=0.2")),
    (("distill", "--force", "--set", "distill.steps=100000"), ("sample", "--force")),
    (("evaluate", "--force", "--set", "evaluate.runs=1000"), ("evaluate", "--force")),
    (("evaluate", "--force", "--set", "evaluate.runs=1000"), ("report",)),
    (("sample", "--force", "--set", "sgld.iterations=100000"), ("info",)),
], ids=["sample-sample", "distill-sample", "distill-sample-force", "evaluate-evaluate", "evaluate-report",
        "sample-info"])
def test_a_second_process_exits_naming_the_holder(art, tmp_path, holder, second):
    """While one process works on the artifacts, another stage stops at once (exit 2, one line naming the
    holder's PID) and every complete artifact stays byte-identical, even after the holder is killed."""
    before = snapshot(art.dir)
    child = Child(art.argv(*holder), tmp_path / "holder.err")
    try:
        assert holding_lock(art, child), (tmp_path / "holder.err").read_text()
        art.fails(*second, match=rf"PID {child.pid}\b")
    finally:
        child.stop()
    assert snapshot(art.dir) == before


# ----------------------------------------------------------------------------------------- failing stages


@pytest.mark.parametrize("extra", [("--set", "sgld.lr=1e6"), ("--force", "--set", "sgld.lr=1e6"),
                                   ("--set", "sgld.lr=1e6", "--set", "sgld.checkpoint_every=20")],
                         ids=["changed", "force", "checkpoint-before-first-sample"])
def test_diverging_resample_keeps_the_complete_store_and_checkpoints_no_nan(art, extra):
    art.fails("sample", *extra, match="diverged")
    assert not nonfinite_checkpoints(art.dir)


def test_diverging_baseline_is_not_saved(art):
    art.fails("sample", "--set", "baselines.lr=1e8", match="sgd baseline diverged")


@pytest.mark.parametrize("setting", ["sgld.batch_size=5000", "baselines.batch_size=5000"])
def test_batch_larger_than_the_training_split(art, setting):
    art.fails("sample", "--set", setting, match="batch_size")


def test_a_baselines_batch_larger_than_the_training_split_fails_before_the_chains(tmp_path, capsys):
    config = tmp_path / "p.toml"
    config.write_text(toml(CONFIG))
    argv = ["sample", "--config", str(config), "--artifacts", str(tmp_path), "--quiet"]
    assert main([*argv, "--set", "baselines.batch_size=5000"]) == 2
    assert "'baselines.batch_size' (5000) is larger than the training split" in capsys.readouterr().err
    assert not list(tmp_path.rglob("samples*"))  # no chain stepped


@pytest.mark.parametrize(("settings", "match"), [
    (["distill.subspace_rank=100000"], "subspace_rank"), (["distill.fit_samples=2"], "fit_samples"),
    (["distill.subspace_rank=25", "distill.fit_samples=40"], "rank")],  # the store holds 20 samples
    ids=["rank-100000", "fit-samples-2", "rank-above-store"])
def test_failing_distill_keeps_the_generator(art, settings, match):
    art.fails("distill", *(f"--set={setting}" for setting in settings), match=match)


def test_diverging_gan_is_not_checkpointed(art):
    art.fails("distill", "--set", "distill.lr=1e12", "--set", "distill.checkpoint_every=5", match="diverged")
    assert not nonfinite_checkpoints(art.dir)


def test_ctrl_c_turned_into_another_error_is_still_an_interrupt(art, monkeypatch):
    """h5py can turn a KeyboardInterrupt raised inside it into another error (a TypeError was seen when
    Ctrl-C came while the store was being created): still one line and exit 130, nothing complete lost."""
    from apd.samplers.store import SampleStore

    def mangled(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            raise TypeError("Operation not defined for data type class") from None

    monkeypatch.setattr(SampleStore, "append_many", mangled)
    before = snapshot(art.dir)
    rc, err = art.run("sample", "--force")
    assert rc == 130 and len(err.strip().splitlines()) == 1 and "interrupted" in err, err
    assert snapshot(art.dir) == before


def test_an_interrupted_evaluation_takes_the_kept_sets_it_judged_and_ends_as_an_uninterrupted_one(
        art, tmp_path, monkeypatch):
    """A Ctrl-C while the yardstick judges its third kept set leaves the two it judged in eval.kept.partial;
    the next run judges only the others (the third from the stream the first two share, where they left it)
    and writes what an uninterrupted run writes, timings aside, leaving nothing behind. A run under another
    configuration, or with --force, judges every set again."""
    import apd.pipeline.evaluate as evaluate_module

    real, judged = evaluate_module.kept_samples, []

    def judging(*args, stop_at: int | None = None, **kwargs):
        if len(judged) == stop_at:
            raise KeyboardInterrupt
        judged.append(args[1])  # k
        return real(*args, **kwargs)

    sizes = ("--set", "evaluate.yardstick_sizes=[1,2,3]")  # three sets drawn from one stream, then the others
    monkeypatch.setattr(evaluate_module, "kept_samples", lambda *a, **kw: judging(*a, stop_at=2, **kw))
    assert art.run("evaluate", *sizes).rc == 130
    assert judged == [1, 2] and len(list((art.dir / "eval.kept.partial").glob("*.json"))) == 3  # and its key
    monkeypatch.setattr(evaluate_module, "kept_samples", judging)
    assert art.run("evaluate", *sizes).rc == 0
    every = len(json.loads(art.path("eval/results.json").read_text())["yardstick"]["kept"])
    assert judged[:3] == [1, 2, 3] and len(judged) == every > 3 and not (art.dir / "eval.kept.partial").exists()

    other = Artifacts(art.root, art.config, tmp_path / "other")
    shutil.rmtree(other.dir / "eval")
    judged.clear()
    assert other.run("evaluate", *sizes).rc == 0 and len(judged) == every
    resumed, uninterrupted = (json.loads(a.path("eval/results.json").read_text()) for a in (art, other))
    assert without_timings(resumed) == without_timings(uninterrupted)

    judged.clear()
    monkeypatch.setattr(evaluate_module, "kept_samples", lambda *a, **kw: judging(*a, stop_at=2, **kw))
    assert art.run("evaluate", "--force", *sizes).rc == 130
    monkeypatch.setattr(evaluate_module, "kept_samples", judging)
    assert art.run("evaluate", "--force", *sizes).rc == 0 and judged[2:4] == [1, 2]  # started over


# ----------------------------------------------------------------------------------------- provenance


def test_distill_refuses_samples_of_another_sgld_config(art):
    art.fails("distill", "--set", "sgld.lr=0.05", match="run `apd sample")


def test_evaluate_refuses_a_generator_of_another_rank(art):
    art.fails("evaluate", "--set", "distill.subspace_rank=3", match="run `apd distill")


@pytest.mark.parametrize(("manifest", "command"), [("samples.json", "distill"), ("generator.json", "evaluate"),
                                                   ("baselines/sgd.json", "evaluate")])
def test_an_edited_config_hash_is_noticed(art, manifest, command):
    path = art.path(manifest)
    path.write_text(json.dumps({**json.loads(path.read_text()), "config_hash": "0123456789abcdef"}))
    art.fails(command, match="another configuration")


def test_evaluate_refuses_a_generator_made_from_other_samples(art):
    assert art.run("sample", "--force").rc == 0
    art.fails("evaluate", match="made from other samples.*apd distill")


def test_edited_results_are_not_reused_or_reported(art):
    results = art.path("eval/results.json")
    results.write_text(results.read_text().replace('"runs": 1', '"runs": 7'))
    art.fails("report", match="changed since")
    assert art.run("evaluate").rc == 0
    assert json.loads(results.read_text())["runs"] == 1


def test_the_mixture_growth_is_left_out_unless_asked_for(art):
    """By default the mixture is compared as a method, at its most components, and no growth table is made."""
    results = json.loads(art.path("eval/results.json").read_text())
    assert "mog" in results["accuracy"] and "mog" in results["yardstick"]["equal_storage"]
    assert "mog" not in results and "apd_share" not in results and "mog_growth" not in results["timing"]


def test_fashion_ood_never_comes_from_apd_data_dir(tmp_path, monkeypatch, digits):
    from apd.config import DataConfig
    from apd.data import FASHION_MNIST_DIR, available_ood, ood_set

    if not Path(FASHION_MNIST_DIR).is_dir():
        pytest.skip("Fashion-MNIST is not installed")
    expected = ood_set("fashion", digits, 20, 0)
    monkeypatch.setenv("APD_DATA_DIR", str(_fake_mnist(tmp_path)))
    assert "fashion" in available_ood(DataConfig(), digits)
    torch.testing.assert_close(ood_set("fashion", digits, 20, 0), expected)


# ----------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("command", "device"), [("sample", "tpu"), ("distill", "cuda:abc"), ("evaluate", "meta"),
                                                 ("sample", "CPU")])
def test_bad_device_is_one_line_even_on_reuse(art, command, device):
    art.fails(command, "--device", device, match="device")


def test_cuda_where_there_is_none_is_one_line(art, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    art.fails("evaluate", "--device", "cuda", match="'cuda' requested but no CUDA device is available")


def test_a_cuda_device_past_the_last_is_one_line(art, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    art.fails("sample", "--device", "cuda:2", match="'cuda:2': only 2 CUDA device")


# Per command: the function a CUDA run of it runs out of memory in, and a setting the message names
OUT_OF_MEMORY = [("sample", "apd.pipeline.sample.run_sample", "sgld.batch_size"),
                 ("distill", "apd.pipeline.distill.run_distill", "distill.batch_size"),
                 ("evaluate", "apd.pipeline.evaluate.run_evaluate", "evaluate.networks"),
                 ("experiment", "apd.experiments.modes.run_modes", "batch and sample sizes")]


@pytest.mark.parametrize(("command", "stage", "setting"), OUT_OF_MEMORY)
def test_cuda_out_of_memory_is_one_line_naming_the_device_and_what_to_lower(art, monkeypatch, command, stage, setting):
    def out_of_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                          "capacity of 79.19 GiB of which 1.06 GiB is free.\nSee documentation")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)  # the command makes cuda:0 current
    monkeypatch.setattr(stage, out_of_memory)
    extra = ("modes",) if command == "experiment" else ()
    err = art.fails(command, *extra, "--device", "cuda:0", match="CUDA out of memory on cuda:0: lower ")
    assert setting in err


def test_a_network_too_wide_for_the_machine_is_one_line(art):
    """Its first layer alone would take 2.56e17 bytes, past the address space of any machine (2**57 bytes with
    5-level paging), so the allocation fails on every machine, overcommitting or not: one line naming what to
    lower, exit code 2, nothing touched."""
    err = art.fails("sample", "--set", "net.hidden=[1000000000000000]",
                    match="out of CPU memory: lower sgld.batch_size")
    assert "net.hidden" in err


def test_python_out_of_memory_is_one_line_and_other_runtime_errors_are_the_codes(art, monkeypatch):
    def out_of_memory(*args):
        raise MemoryError

    def wrong_shapes(*args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (100x64 and 65x100)")

    monkeypatch.setattr("apd.pipeline.distill.run_distill", out_of_memory)
    art.fails("distill", match="out of CPU memory: lower distill.in_memory_gb")
    monkeypatch.setattr("apd.pipeline.distill.run_distill", wrong_shapes)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        main(art.argv("distill"))


def _cuda_error(code: int, message: str) -> torch.AcceleratorError:
    """A CUDA error as torch raises it: its message and CUDA's code."""
    error = torch.AcceleratorError(f"CUDA error: {message}\nCUDA kernel errors might be asynchronously reported")
    error.error_code = code
    return error


def test_a_busy_card_is_one_line_naming_it(art, monkeypatch):
    """A card in exclusive-process mode held by another process fails when the command chooses it (CUDA 12
    creates the card's context there): one line naming the card, exit code 2."""
    def busy(device):
        raise _cuda_error(46, "CUDA-capable device(s) is/are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", busy)
    art.fails("sample", "--device", "cuda:1",
              match="cuda:1 cannot be used: CUDA-capable device\\(s\\) is/are busy or unavailable; run on another")


def test_a_cuda_error_of_the_code_is_not_made_a_users_error(art, monkeypatch):
    """A device-side assert (CUDA error 710) is a bug, not the machine's doing: it propagates as it is."""
    def asserting(*args):
        raise _cuda_error(710, "device-side assert triggered")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr("apd.pipeline.sample.run_sample", asserting)
    with pytest.raises(torch.AcceleratorError, match="device-side assert"):
        main(art.argv("sample", "--device", "cuda:0"))


@pytest.mark.parametrize("seed", ["99999999999999999", "4294967296", "-1"])
def test_seed_out_of_range(art, seed):
    art.fails("sample", "--set", f"seed={seed}", match="'seed'")


@pytest.mark.parametrize(("command", "setting", "match"), [
    ("sample", "sgld.thin=5000", "keep no sample"),
    ("sample", "sgld.iterations=1000000000000000000", "No space left for the sample store"),
    ("info", "data.val_size=1", "'data.val_size' \\(1\\) must be at least the number of classes"),
    ("evaluate", "evaluate.networks=1", "'evaluate.networks' must be at least 2"),
    ("sample", "sgld.prior_var=inf", "'sgld.prior_var' must be a finite number"),
    ("sample", "baselines.weight_decay=inf", "'baselines.weight_decay' must be a finite number"),
])
def test_a_config_that_cannot_work_is_one_line_before_any_work(art, command, setting, match):
    started = time.perf_counter()
    art.fails(command, "--set", setting, match=match)
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "", "ABSOLUTE"])
def test_name_must_be_a_plain_file_name(art, tmp_path, name):
    name = str(tmp_path / "absolute") if name == "ABSOLUTE" else name
    outside = snapshot(tmp_path)
    art.fails("sample", "--set", f'name="{name}"', match="'name'")
    assert snapshot(tmp_path) == outside and not (tmp_path / "absolute").exists()


def _fake_mnist(directory: Path, broken: bool = False) -> Path:
    """Four small gzipped MNIST-like IDX files; ``broken``: the train images' deflate stream is invalid."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 1400), ("t10k", 200)):
        for kind, array in (("images-idx3", np.zeros((n, 28, 28), np.uint8)), ("labels-idx1", np.arange(n) % 10)):
            header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
            raw = bytearray(gzip.compress(header + array.astype(np.uint8).tobytes(), mtime=0))
            if broken and split == "train" and kind.startswith("images"):
                raw[10] = 0x07  # the first deflate block has the reserved block type: a zlib error
            (directory / f"{split}-{kind}-ubyte.gz").write_bytes(bytes(raw))
    return directory


def test_zlib_error_inside_an_idx_gz(art, tmp_path):
    data = _fake_mnist(tmp_path / "mnist", broken=True)
    art.fails("sample", "--set", 'data.dataset="mnist"', "--data-dir", str(data), match="cannot read IDX")


def _nan_rows(store: Path) -> None:
    with h5py.File(store, "r+") as fh:
        fh["samples"][3] = np.nan


@pytest.mark.parametrize("command", ["distill", "evaluate"])
@pytest.mark.parametrize("forged", [False, True], ids=["stale-digest", "forged-digest"])
def test_nan_rows_in_the_store(art, command, forged):
    _nan_rows(art.path("samples.h5"))
    if forged:
        forge(art.path("samples.json"))
    art.fails(command, "--force")


def test_nan_rows_are_not_reused_by_sample(art):
    _nan_rows(art.path("samples.h5"))
    forge(art.path("samples.json"))
    rc, err = art.run("sample")
    assert rc == 0 and "NaN" in err
    with h5py.File(art.path("samples.h5"), "r") as fh:
        assert np.isfinite(fh["samples"][()]).all()


def _random_bytes(path: Path, offset: int, length: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + length] = np.random.default_rng(offset).integers(0, 256, length, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("offset", [0, 96, 200, 1024, 2048])
def test_random_bytes_near_the_store_header(art, complete, offset):
    """Caught by the digest; under a forged digest, either one line and exit 2, or (where the bytes miss
    everything read) a run on exactly the samples that were there."""
    _random_bytes(art.path("samples.h5"), offset, 64)
    art.fails("distill", "--force", match="changed since")
    forge(art.path("samples.json"))
    before = snapshot(art.dir)
    rc, err = art.run("distill", "--force")
    assert rc in (0, 2) and len(err.strip().splitlines()) == (1 if rc else 0), err
    if rc == 2:
        assert snapshot(art.dir) == before
    else:
        with h5py.File(art.path("samples.h5"), "r") as got, h5py.File(complete[0] / "nl" / "samples.h5", "r") as want:
            np.testing.assert_array_equal(got["samples"][()], want["samples"][()])


def test_a_store_with_fewer_samples_than_evaluate_draws(art):
    art.fails("evaluate", "--set", "evaluate.sgld_samples=1000", match="1000")


@pytest.mark.parametrize("forged", [False, True], ids=["stale-digest", "forged-digest"])
def test_corrupt_generator(art, forged):
    _random_bytes(art.path("generator.pt"), 300, 200)
    if forged:
        forge(art.path("generator.json"))
    art.fails("evaluate", match="generator")
    rc, err = art.run("distill")  # not reused: made again
    assert rc == 0, err
    torch.load(art.path("generator.pt"), weights_only=True)


@pytest.mark.parametrize("target", ["baselines/sgd.pt", "generator.pt"])
def test_nan_weights_under_a_forged_manifest(art, target):
    state = torch.load(art.path(target), weights_only=True)
    next(iter(state.values())).fill_(float("nan"))
    torch.save(state, art.path(target))
    forge(art.path(str(Path(target).with_suffix(".json"))))
    art.fails("evaluate", match="NaN")


def test_a_baseline_of_another_network(art):
    torch.save(mlp([64, 8, 10]).state_dict(), art.path("baselines/sgd.pt"))
    forge(art.path("baselines/sgd.json"))
    art.fails("evaluate", match="sgd.pt: does not fit the 64-16-10 network")


def test_pickles_are_never_unpickled(art, tmp_path):
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"weight": Evil()}, art.path("baselines/sgd.pt"))
    forge(art.path("baselines/sgd.json"))
    art.fails("evaluate", match="weights-only")
    torch.save({"trainer": Evil()}, art.path("generator.ckpt.pt"))
    assert art.run("distill", "--set", "distill.steps=30").rc == 0
    assert not marker.exists()


# ----------------------------------------------------------------------------------------- file systems


def test_artifacts_pointing_at_a_file(art, tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")
    for command in ("sample", "info"):
        rc, err = art.run(command, root=plain)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "not a directory" in err
    assert plain.read_text() == "x"


@pytest.mark.parametrize("variables", [{"RANK": "1", "MASTER_PORT": "1"}, {"RANK": "0", "MASTER_PORT": "FREE"}],
                         ids=["rank1-nobody-listening", "rank0-alone"])
def test_a_torchrun_worker_without_its_peers_gives_up_after_the_join_timeout(art, monkeypatch, variables):
    from tests.worker_helpers import free_port

    port = str(free_port()) if variables["MASTER_PORT"] == "FREE" else variables["MASTER_PORT"]
    for name, value in {**variables, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                        "APD_JOIN_TIMEOUT": "2"}.items():
        monkeypatch.setenv(name, value)
    started = time.perf_counter()
    art.fails("sample", "--set", "sgld.chains=2", match=r"the other workers did not join at 127\.0\.0\.1:\d+ "
              r"within 2 s \(APD_JOIN_TIMEOUT\)")
    assert time.perf_counter() - started < 60
    monkeypatch.setenv("APD_JOIN_TIMEOUT", "soon")
    art.fails("sample", "--set", "sgld.chains=2", match="APD_JOIN_TIMEOUT='soon': expected a positive number")
    monkeypatch.delenv("RANK")
    assert art.run("info").rc == 0  # the lock is free again


def test_quiet_prints_nothing_and_evaluate_ends_with_a_short_summary(art, capsys):
    for command in ("evaluate", "report", "sample", "distill"):
        assert main(art.argv(command)) == 0  # --quiet, every stage reused
        assert capsys.readouterr() == ("", "")
    assert main([arg for arg in art.argv("evaluate") if arg != "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 6 and out[0].startswith("accuracy: SGLD 0.") and ", APD 0." in out[0]
    assert out[-1] == f"every table: {art.path('eval') / 'tables.md'}"


def test_info_describes_a_hand_edited_sample_manifest_in_one_line(art, capsys):
    manifest = art.path("samples.json")
    original = manifest.read_bytes()
    try:
        manifest.write_text(json.dumps({**json.loads(original), "diagnostics": "x"}))
        assert main(art.argv("info")) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sgld ")]
        assert len(lines) == 1 and "not diagnostics this apd wrote" in lines[0]
        manifest.write_text(json.dumps({**json.loads(original), "diagnostics": {"warning": 1}}))
        assert main(art.argv("info")) == 0
        assert "warning: 1" in capsys.readouterr().out
        manifest.write_text("{")  # not JSON at all
        assert main(art.argv("info")) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sgld ")]
        assert len(lines) == 1 and f"{manifest}: not valid JSON" in lines[0]
    finally:
        manifest.write_bytes(original)


def test_info_names_what_an_interrupted_run_left_and_the_command_that_resumes_it(art, capsys):
    for name in ("samples-0.partial.h5", "samples-0.ckpt.pt", "generator.ckpt.pt", "eval.partial/scores.h5",
                 "experiments/frontier-int4.partial/key.json"):
        art.path(name).parent.mkdir(exist_ok=True, parents=True)
        art.path(name).write_bytes(b"")
    assert main(art.argv("info")) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("interrupted ")]
    where = f"--config {art.config} --artifacts {art.root}"
    forced = " (where the stage is complete, a run with --force was stopped: that keeps the complete one, --force "
    forced += "starts over)"
    assert lines == [f"interrupted eval.partial: run `apd evaluate {where}` to finish it" + forced,
                     "interrupted experiments/frontier-int4.partial: run the `apd experiment` command that was cut "
                     "short again to finish it (--force starts over)",
                     f"interrupted generator.ckpt.pt: run `apd distill {where}` to finish it" + forced,
                     f"interrupted samples-0.ckpt.pt, samples-0.partial.h5: run `apd sample {where}` to finish it"
                     + forced]


@pytest.mark.parametrize(("command", "rc"), [("evaluate", 2), ("distill", 2), ("info", 0)])
def test_a_command_on_artifacts_that_do_not_exist_leaves_no_folder(art, tmp_path, command, rc):
    assert art.run(command, root=tmp_path / "nowhere" / "deeper").rc == rc
    assert not (tmp_path / "nowhere").exists()


@contextlib.contextmanager
def mounted(*commands: list[str], target: Path):
    if os.geteuid() != 0 or subprocess.run(commands[0], capture_output=True).returncode:
        pytest.skip("cannot mount here (needs root)")
    try:
        for command in commands[1:]:
            subprocess.run(command, check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_read_only_artifacts_directory(art):
    with mounted(["mount", "--bind", str(art.root), str(art.root)],
                 ["mount", "-o", "remount,bind,ro", str(art.root)], target=art.root):
        art.fails("sample", match="cannot write")
        art.fails("evaluate", "--force")
        assert art.run("info").rc == 0


@pytest.mark.parametrize(("command", "free"), [("sample", 0), ("sample", 300_000), ("distill", 0),
                                               ("distill", 40_000), ("evaluate", 0), ("evaluate", 150_000)])
def test_full_disk(art, tmp_path, command, free):
    """On a small tmpfs left with ``free`` bytes: exit 2, one line, no crash, every complete artifact kept."""
    disk = tmp_path / "disk"
    disk.mkdir()
    size = sum(p.stat().st_size for p in art.root.rglob("*") if p.is_file()) + 2**20
    with mounted(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], target=disk):
        shutil.copytree(art.root, disk / "art")
        stat = os.statvfs(disk)
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
            fh.write(b"\1" * max(0, stat.f_bavail * stat.f_frsize - free))
        child = Child(art.argv(command, "--force", root=disk / "art"), tmp_path / "err")
        assert child.wait() == 2, (tmp_path / "err").read_text()  # a crash would be a negative signal number
        err = (tmp_path / "err").read_text()
        assert len(err.strip().splitlines()) == 1 and "No space left" in err, err
        assert snapshot(disk / "art" / "nl") == snapshot(art.dir)


UNCHECKED = """
import sys
import apd.pipeline.sample as sample
import apd.samplers.store as store
store.require_space = lambda *args: None  # as if another process filled the disk just after every check
sample.check_sampling_fits = lambda *args: None
from apd.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_disk_filling_under_hdf5_is_one_line_and_no_crash(art, tmp_path):
    """HDF5 writing into a full disk breaks its handles, and freeing them crashed the process (exit 139):
    in a fresh interpreter, with the store's own free-space check out of the way, the failure is one line
    and exit 2."""
    disk = tmp_path / "disk"
    disk.mkdir()
    with mounted(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], target=disk):
        shutil.copytree(art.root, disk / "art")
        stat = os.statvfs(disk)
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
            fh.write(b"\1" * max(0, stat.f_bavail * stat.f_frsize - 60_000))
        before = snapshot(disk / "art" / "nl")
        result = subprocess.run([sys.executable, "-c", UNCHECKED, *art.argv("sample", "--force", root=disk / "art")],
                                cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "No space left" in result.stderr, result.stderr
        assert snapshot(disk / "art" / "nl") == before


def _disk_with(free: int):
    return SimpleNamespace(disk_usage=lambda path: shutil._ntuple_diskusage(2**30, 2**30 - free, free))


def test_store_stops_before_the_disk_is_full(art, monkeypatch):
    """The store refuses to append into the last MiB of a disk (HDF5 on a full disk crashes at exit)."""
    monkeypatch.setattr("apd.samplers.store_disk.shutil", _disk_with(2**19))
    art.fails("sample", "--force", match="No space left")


def test_a_failed_torch_save_is_one_line(art, monkeypatch):
    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr("apd.io.shutil", _disk_with(0))
    art.fails("distill", "--force", match="No space left")


def test_evaluation_directory_is_always_whole(tmp_path):
    """replace_directory swaps in one step; a swap cut short between two renames is undone."""
    from apd.io import replace_directory, restore_directory

    final, built = tmp_path / "eval", tmp_path / "eval.partial"
    final.mkdir(), built.mkdir()
    (final / "x").write_text("old"), (built / "x").write_text("new")
    replace_directory(built, final)
    assert (final / "x").read_text() == "new" and not built.exists()
    final.rename(tmp_path / "eval.old")  # as if killed after moving the old one aside
    restore_directory(final)
    assert (final / "x").read_text() == "new"


def test_disk_errors_keep_their_errno(monkeypatch):
    """ENOSPC from the store is an OSError, which the CLI prints as one line."""
    from apd.samplers.store_disk import require_space

    monkeypatch.setattr("apd.samplers.store_disk.shutil", _disk_with(0))
    with pytest.raises(OSError) as info:
        require_space(Path("/tmp/x.h5"), 10)
    assert info.value.errno == errno.ENOSPC


# ----------------------------------------------------------------------------------------- slow


def _python_apd(art: Artifacts, *argv: str, err: Path) -> subprocess.Popen:
    with open(err, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "apd", *art.argv(*argv)], cwd=REPO, stderr=fh,
                                stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("command", ["sample", "info"])
def test_a_lock_that_is_a_directory_is_named(art, command):
    art.path(".lock").unlink(missing_ok=True)
    art.path(".lock").mkdir()
    art.fails(command, match=re.escape(f"{art.path('.lock')}: a directory where apd keeps its lock file"))
    assert art.path(".lock").is_dir()


def test_a_symlinked_eval_folder_is_refused_every_time_and_a_symlinked_leftover_is_removed(art, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    art.path("eval").rename(elsewhere / "eval")
    art.path("eval").symlink_to(elsewhere / "eval")
    outside = snapshot(elsewhere)
    for _ in range(2):
        art.fails("evaluate", "--force", match=r"/eval: a symbolic link; `apd evaluate` replaces this folder whole")
    assert snapshot(elsewhere) == outside
    art.path("eval").unlink()
    (elsewhere / "eval").rename(art.path("eval"))
    art.path("eval.partial").symlink_to(elsewhere)  # left by a swap of a symlinked folder
    assert art.run("evaluate", "--force").rc == 0
    assert not art.path("eval.partial").exists() and elsewhere.is_dir()


def test_a_terminal_that_cannot_show_a_character_gets_its_escape(art):
    """``apd info`` prints × (8×8 images); with ASCII output it prints ``\\xd7`` instead of failing."""
    result = subprocess.run([sys.executable, "-m", "apd", *art.argv("info")], cwd=REPO, capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "ascii"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert b"images 8\\xd78" in result.stdout and not result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sample", "evaluate"])
def test_two_python_processes_at_once(art, tmp_path, command):
    """Two `python -m apd COMMAND --force` started together: one finishes (exit 0), the other exits 2 naming
    its PID; the store reads and scores.h5 has the test labels."""
    labels = h5py.File(art.path("eval/scores.h5"), "r")["test_labels"][()]
    procs = [_python_apd(art, command, "--force", err=tmp_path / f"{i}.err") for i in range(2)]
    codes = [p.wait(timeout=900) for p in procs]
    assert sorted(codes) == [0, 2], codes
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    err = (tmp_path / f"{loser}.err").read_text()
    assert len(err.strip().splitlines()) == 1 and f"PID {procs[winner].pid}" in err, err
    with h5py.File(art.path("samples.h5"), "r") as fh:
        assert np.isfinite(fh["samples"][()]).all()
    with h5py.File(art.path("eval/scores.h5"), "r") as fh:
        np.testing.assert_array_equal(fh["test_labels"][()], labels)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_resample_resumes_to_the_same_store(art, complete, tmp_path, sig):
    """A `python -m apd sample` of another config stopped at its second checkpoint keeps every complete
    artifact; run again, it stores exactly what an uninterrupted run stores."""
    extra = ("--set", "seed=1", "--set", "sgld.iterations=900", "--set", "sgld.checkpoint_every=50")
    reference = Artifacts(complete[0], complete[1], tmp_path / "reference")
    assert reference.run("sample", *extra).rc == 0
    before = snapshot(art.dir)
    proc = _python_apd(art, "sample", *extra, err=tmp_path / "err")
    checkpoint, seen, stamp = art.path("samples.ckpt.pt"), 0, None
    while seen < 2 and proc.poll() is None:
        current = checkpoint.stat().st_mtime_ns if checkpoint.exists() else None
        if current is not None and current != stamp:
            seen, stamp = seen + 1, current
        time.sleep(0.002)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and len((tmp_path / "err").read_text().strip().splitlines()) == 1
    assert snapshot(art.dir) == before
    assert art.run("sample", *extra).rc == 0
    with h5py.File(art.path("samples.h5"), "r") as got, h5py.File(reference.path("samples.h5"), "r") as want:
        for key in ("samples", "step", "chain", "log_lik"):
            np.testing.assert_array_equal(got[key][()], want[key][()])


# ------------------------------------------------------------------- stopping a two-worker `apd sample`

WARNING_LINE = re.compile(r"^(worker \d+/\d+: )?warning: ")  # a notice printed before the stop, not part of it


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """A complete `apd sample` of the tiny pipeline's two chains on two workers: (artifacts root, config path,
    seconds it took, in a fork of this process)."""
    root = tmp_path_factory.mktemp("two-workers")
    config = root / "nl.toml"
    raw = json.loads(json.dumps(CONFIG))
    raw["sgld"].update(chains=2, workers=2)
    config.write_text(toml(raw))
    started = time.monotonic()
    child = Child(["sample", "--config", str(config), "--artifacts", str(root / "art"), "--quiet"], root / "err")
    assert child.wait() == 0, (root / "err").read_text()
    return root / "art", config, time.monotonic() - started


def _manifest_problems(root: Path) -> list[str]:
    """The files of every manifest under ``root`` that are missing or no longer have their recorded digest."""
    from apd.pipeline.manifests import file_digest

    problems = []
    for manifest in root.rglob("*.json"):
        record = json.loads(manifest.read_text())
        for name, digest in record.get("files", {}).items() if isinstance(record, dict) else ():
            path = manifest.parent / name
            if not path.is_file() or file_digest(path) != digest:
                problems.append(f"{manifest.name}: {name} {'missing' if not path.is_file() else 'changed'}")
    return problems


def _stop_sample(art: Artifacts, err: Path, sig: int, event: str, seconds: float) -> list[str]:
    """`apd sample --force` (a fork of this process; its two workers are fresh interpreters) sent ``sig``
    ``seconds`` after ``event`` ("start", or "workers": its first worker process appeared). What went wrong:
    not exit 128 + ``sig`` (or 0: it had finished) with exactly one line on stderr (warnings printed before
    aside), a worker still running once it has exited, or a complete artifact lost or not replaced whole."""
    before = snapshot(art.dir)
    child = Child(art.argv("sample", "--force"), err)
    workers: set[int] = set()
    deadline = time.monotonic() + 300
    while event == "workers" and not workers and child.poll() is None and time.monotonic() < deadline:
        workers |= _children(child.pid)
        time.sleep(0.002)
    due = time.monotonic() + seconds
    while time.monotonic() < due and child.poll() is None:
        workers |= _children(child.pid)
        time.sleep(0.002)
    if child.poll() is None:
        os.kill(child.pid, sig)
    deadline = time.monotonic() + HANG_SECONDS
    while child.poll() is None and time.monotonic() < deadline:
        workers |= _children(child.pid)
        time.sleep(0.002)
    child.wait(timeout=0)
    problems, text = [], err.read_text()
    said = [line for line in text.strip().splitlines() if not WARNING_LINE.match(line)]
    if child.rc not in (128 + sig, 0) or len(said) != (1 if child.rc else 0):
        problems.append(f"exit {child.rc}, stderr {text.strip()[-600:]!r}")
    problems += [f"worker {pid} still running" for pid in workers if _running(pid)]
    problems += [f"{name} lost" for name in before if not (art.dir / name).is_file()]
    problems += _manifest_problems(art.dir)
    with h5py.File(art.path("samples.h5"), "r") as fh:
        if not np.isfinite(fh["samples"][()]).all():
            problems.append("samples.h5 has non-finite rows")
    return problems


def _stop_at(two_workers, tmp_path, moments: list[tuple[int, str, float]]) -> None:
    source, config, _ = two_workers
    failures = []
    for i, (sig, event, seconds) in enumerate(moments):
        art = Artifacts(source, config, tmp_path / f"art{i}")
        problems = _stop_sample(art, tmp_path / f"{i}.err", sig, event, seconds)
        failures += [f"{signal.Signals(sig).name} {seconds:.2f} s after {event}: {p}" for p in problems]
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to follow the workers")
def test_ctrl_c_and_sigterm_stop_two_workers_with_one_line(two_workers, tmp_path):
    """Four moments: the parent starting, its workers importing torch, sampling, the end (SIGTERM at one)."""
    duration = two_workers[2]
    _stop_at(two_workers, tmp_path, [(signal.SIGINT, "start", 0.05), (signal.SIGINT, "workers", 0.2),
                                     (signal.SIGTERM, "workers", 2.0), (signal.SIGINT, "start", 0.9 * duration)])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to follow the workers")
def test_ctrl_c_at_twenty_moments_of_two_workers(two_workers, tmp_path):
    """Ctrl-C at 14 moments spread from 0.05 s to the end of an uninterrupted run and 6 from the moment the
    workers start: exit 130, one line, no worker left, nothing complete lost."""
    duration = two_workers[2]
    moments = [(signal.SIGINT, "start", float(t)) for t in np.linspace(0.05, duration, 14)]
    moments += [(signal.SIGINT, "workers", t) for t in (0.0, 0.1, 0.3, 0.6, 1.0, 2.0)]
    _stop_at(two_workers, tmp_path, moments)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to follow the workers")
@pytest.mark.parametrize("after", [0.3, 3.0], ids=["workers-importing", "workers-sampling"])
def test_a_killed_parent_takes_its_workers(two_workers, tmp_path, after):
    """`apd sample --force` killed (SIGKILL) while its workers import torch, or sample: they are gone within
    seconds, and nothing is published. The run is made long (chains far longer than the store's), so that on
    a fast machine too it is still sampling when killed."""
    source, config, _ = two_workers
    art = Artifacts(source, config, tmp_path / "art")
    before = snapshot(art.dir)
    child = Child(art.argv("sample", "--force", "--set", "sgld.iterations=100000"), tmp_path / "err")
    workers: set[int] = set()
    deadline = time.monotonic() + 300
    while not workers and child.poll() is None and time.monotonic() < deadline:
        workers = _children(child.pid)
        time.sleep(0.002)
    time.sleep(after)
    workers |= _children(child.pid)
    child.stop()
    assert workers
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if _running(pid)]
    assert snapshot(art.dir) == before


@pytest.mark.slow
@pytest.mark.timeout(6 * 3600 + 300)
def test_nothing_lost_matrix():
    """The whole scenario matrix (benchmarks/nothing_lost.py): every case passes."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "nothing_lost.py")], cwd=REPO,
                            capture_output=True, text=True, timeout=6 * 3600)
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert result.returncode == 0, "\n".join(failed) or result.stdout[-5000:] + result.stderr[-2000:]
