"""Nothing lost: a scenario matrix of failures, races, interrupts and stale or hostile inputs,
each run through the CLI against a complete artifact set of a tiny digits pipeline.

Run: ``.venv/bin/python benchmarks/nothing_lost.py`` (about 10-20 minutes on a shared 2-core CPU; needs
root for the full-disk and read-only cases, which are skipped otherwise). Options: ``--only REGEX``
(case ids), ``--exec`` (every command as a fresh ``python -m apd`` process instead of a fork of this
one, which has torch imported already), ``--list``, ``--keep`` (leave the work directory), ``--out FILE``
(the run's record as JSON: per group the cases run, passed, failed and skipped, each failure and skip with
its reason, the commit and the machine; ``docs/results/reliability/nothing_lost.json`` is the committed one
that ``make docs`` renders into docs/reliability.md).

A complete artifact set (sample, distill, evaluate) is built once; every case copies it, takes the
SHA-256 of every complete artifact file, runs its commands and checks

* the exit code (2 for user errors, 130 for Ctrl-C, 0 for runs that legitimately succeed);
* that stderr is exactly one line for a failure (no traceback, ever, and never a crash by a signal);
* that every complete artifact is byte-identical afterwards, or correctly replaced where the run
  legitimately succeeds (every manifest's recorded file digests still hold, and resumed runs store
  exactly what an uninterrupted run stores).

It prints one row per case (id, group, what is done, what is expected, pass/FAIL and why) and exits 1
when any case fails. Cases marked ``issue`` are the ones that failed when the matrix was first run.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch
from process_tree import children as _children
from process_tree import running as _running
from record import run_header

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
torch.set_num_threads(1)

NAME = "t"
CONFIG = f"""
name = "{NAME}"
seed = 0
threads = 1
[data]
dataset = "digits"
train_size = 1000
val_size = 300
ood = ["gaussian", "fashion"]
[net]
hidden = [16]
[sgld]
lr = 0.1
prior_var = 0.1
iterations = 300
burn_in = 100
thin = 10
chains = 2
eval_every = 100
checkpoint_every = 100
[baselines]
epochs = 3
lr = 0.1
mc_passes = 5
[distill]
generator = "subspace"
subspace_rank = 4
steps = 40
eval_every = 20
checkpoint_every = 20
gen_hidden = [16]
critic_hidden = [16]
eval_networks = 10
lr = 1e-3
fit_samples = 40
[distill.residual]
model = "none"
[evaluate]
runs = 1
networks = 10
sgld_samples = 10
mc_passes = 5
ood_size = 50
mog_components = [1, 2]
mog_fit_samples = 20
scores = ["bald", "entropy"]
"""
# Longer runs of another configuration, for interrupts: (command, overrides).
VARIANTS = {
    "sample": ("sample", ["--set", "seed=1", "--set", "sgld.iterations=800"]),
    "distill": ("distill", ["--set", "distill.steps=160"]),
    "evaluate": ("evaluate", ["--set", "evaluate.runs=3"]),
}
# Files that are never complete artifacts: the lock and work in progress, in folders of work in progress too (a
# stage's folder built under a partial name, eval.partial, and the parts a resumable run keeps for the next one:
# eval.kept.partial, experiments/STUDY.partial).
WORK_FILE = re.compile(r"(^\.lock$|\.partial(\.|$)|\.ckpt\.pt$|\.tmp(\.|$)|\.rebuild$|\.probe\.h5$)")
WORK_DIR = re.compile(r"^(.+\.partial|eval\.old|eval\.report.*)$")
# A warning the run printed before it failed or was stopped (e.g. on the convergence of a published store):
# a notice of work done, not a second line of the failure.
WARNING_LINE = re.compile(r"^(worker \d+/\d+: )?warning: ")
# Times, digests and input records, which differ between two runs that store the same content (and every
# key ending in "_seconds", e.g. a peer's fit time).
VOLATILE_KEYS = {"finished", "seconds", "iterations_per_second", "files", "inputs", "timing", "created"}


# ------------------------------------------------------------------------------------------- running


@dataclass
class Proc:
    """One CLI run: a forked child calling ``apd.cli.main`` or a ``python -m apd`` process."""

    pid: int
    err: Path
    popen: subprocess.Popen | None = None
    rc: int | None = None

    def poll(self) -> int | None:
        if self.rc is None:
            if self.popen is not None:
                code = self.popen.poll()
                self.rc = None if code is None else (128 - code if code < 0 else code)
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.rc = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return self.rc

    def wait(self, timeout: float = 900) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.signal(signal.SIGKILL)
                deadline = time.monotonic() + 60
            time.sleep(0.01)
        return self.rc

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    @property
    def stdout(self) -> str:
        out = self.err.with_suffix(".out")
        return out.read_text(errors="replace") if out.exists() else ""


class Runner:
    """Starts CLI runs: forks of this process (``apd`` already imported) or fresh interpreters."""

    def __init__(self, exec_mode: bool, logs: Path) -> None:
        self.exec_mode, self.logs, self.count = exec_mode, logs, 0
        logs.mkdir(parents=True, exist_ok=True)
        if not exec_mode:  # import everything a stage imports, once, before any fork
            import apd.cli  # noqa: F401
            import apd.experiments.distillers  # noqa: F401
            import apd.pipeline.distill  # noqa: F401
            import apd.pipeline.evaluate  # noqa: F401
            import apd.pipeline.report  # noqa: F401
            import apd.pipeline.sample  # noqa: F401

    def start(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> Proc:
        self.count += 1
        err = self.logs / f"{self.count:04d}.err"
        out = self.logs / f"{self.count:04d}.out"
        environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        environment = {k: v for k, v in environment.items() if v is not None}
        if self.exec_mode:
            with open(out, "wb") as fo, open(err, "wb") as fe:
                popen = subprocess.Popen([sys.executable, "-m", "apd", *argv], cwd=cwd, env=environment,
                                         stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
            return Proc(popen.pid, err, popen)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: run the CLI with its own stdout/stderr files and environment
            code = 1
            try:
                try:
                    for fd, path in ((1, out), (2, err)):
                        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                        os.dup2(handle, fd)
                        os.close(handle)
                    os.environ.clear()
                    os.environ.update(environment)
                    os.chdir(cwd)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    from apd.cli import main

                    code = main(argv)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
            finally:  # a Ctrl-C during the flush too: the fork never returns into this script
                os._exit(code)
        return Proc(pid, err)


# ------------------------------------------------------------------------------------------- artifacts


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def is_work(relative: Path) -> bool:
    return bool(WORK_FILE.search(relative.name)) or any(WORK_DIR.match(part) for part in relative.parts[:-1])


def snapshot(root: Path) -> dict[str, str]:
    """Digest of every complete artifact file under ``root`` (work in progress and the lock left out)."""
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*"))
            if p.is_file() and not is_work(p.relative_to(root))}


def manifest_problems(root: Path) -> set[str]:
    """Manifests under ``root`` whose recorded file digests no longer hold."""
    problems = set()
    for manifest in root.rglob("*.json") if root.is_dir() else ():
        if is_work(manifest.relative_to(root)):
            continue
        try:
            record = json.loads(manifest.read_text())
        except ValueError:
            continue
        if not isinstance(record, dict) or "stage" not in record:
            continue
        for name, digest in record.get("files", {}).items():
            path = manifest.parent / name
            if not path.is_file():
                problems.add(f"{manifest.relative_to(root)} names missing {name}")
            elif sha(path) != digest:
                problems.add(f"{manifest.relative_to(root)}: {name} changed")
    return problems


def forge(manifest: Path, name: str | None = None) -> None:
    """Make ``manifest`` record the current digest of its file(s): a tampered file under a 'valid' manifest."""
    record = json.loads(manifest.read_text())
    for key in record.get("files", {}):
        if name is None or key == name:
            record["files"][key] = sha(manifest.parent / key)
    manifest.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def edit_json(path: Path, **changes) -> None:
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE_KEYS and not k.endswith("_seconds")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def content_differences(a: Path, b: Path, names: list[str]) -> list[str]:
    """Where the artifacts ``names`` differ in content between the directories ``a`` and ``b`` (stores and
    tensors exactly, manifests and results without times and digests)."""
    out = []
    for name in names:
        pa, pb = a / name, b / name
        if not pa.is_file() or not pb.is_file():
            out.append(f"{name}: missing in {'first' if not pa.is_file() else 'second'}")
            continue
        try:
            if name.endswith(".json"):
                if _strip(json.loads(pa.read_text())) != _strip(json.loads(pb.read_text())):
                    out.append(f"{name}: differs")
            elif name.endswith(".pt"):
                ta, tb = (torch.load(p, weights_only=True) for p in (pa, pb))
                if ta.keys() != tb.keys() or any(not torch.equal(ta[k], tb[k]) for k in ta):
                    out.append(f"{name}: tensors differ")
            elif name.endswith(".h5"):
                with h5py.File(pa, "r") as fa, h5py.File(pb, "r") as fb:
                    keys: list[str] = []
                    fa.visit(lambda k, keys=keys, fa=fa: keys.append(k) if isinstance(fa[k], h5py.Dataset) else None)
                    for key in keys:
                        if key not in fb or not np.array_equal(fa[key][()], fb[key][()], equal_nan=True):
                            out.append(f"{name}/{key}: differs")
                    attrs = {k: v for k, v in fa.attrs.items() if k != "created"}
                    other = {k: v for k, v in fb.attrs.items() if k != "created"}
                    if attrs.keys() != other.keys() or any(np.any(attrs[k] != other[k]) for k in attrs):
                        out.append(f"{name}: attributes differ")
        except Exception as exc:  # noqa: BLE001 (report, do not stop the matrix)
            out.append(f"{name}: cannot compare ({type(exc).__name__}: {exc})")
    return out


class Evil:
    """A pickle that creates ``marker`` when unpickled (by torch.load without weights_only)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant_pickle(path: Path, marker: Path, legacy: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if legacy:
        path.write_bytes(pickle.dumps(Evil(marker)))
    else:
        torch.save({"weight": Evil(marker)}, path)


def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)


def fake_mnist(directory: Path, broken: str | None = None) -> Path:
    """Four small gzipped IDX files (1,400 train, 200 test images of 28×28); ``broken``: the train images'
    file with an invalid deflate block (``zlib``), a wrong CRC (``crc``), cut in half (``truncated``) or
    not gzip at all (``notgz``)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 1400), ("t10k", 200)):
        write_idx(directory / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(directory / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    target = directory / "train-images-idx3-ubyte.gz"
    raw = bytearray(target.read_bytes())
    if broken == "zlib":
        raw[10] = 0x07  # first deflate block: final, reserved block type 3
    elif broken == "crc":
        raw[-8] ^= 0xFF
    elif broken == "truncated":
        raw = raw[: len(raw) // 2]
    elif broken == "notgz":
        raw = bytearray(b"PK\x03\x04" + bytes(raw[4:]))
    target.write_bytes(bytes(raw))
    return directory


def nan_rows(store: Path, rows: list[int]) -> None:
    with h5py.File(store, "r+") as fh:
        for row in rows:
            fh["samples"][row, :] = np.nan


def random_bytes(path: Path, offset: int, length: int, seed: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + length] = np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(raw))


def store_problems(path: Path) -> list[str]:
    """A sample store that does not open, or holds a non-finite row."""
    try:
        with h5py.File(path, "r") as fh:
            n = int(fh.attrs["n_complete"])
            rows = fh["samples"][:n]
    except Exception as exc:  # noqa: BLE001
        return [f"{path.name} unreadable: {exc}"]
    return [] if np.isfinite(rows).all() else [f"{path.name} has non-finite rows"]


def checkpoint_problems(root: Path) -> list[str]:
    """Checkpoints holding non-finite weights."""
    out = []
    for path in root.rglob("*.ckpt.pt"):
        try:
            state = torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001
            continue
        stack = [state]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list | tuple):
                stack.extend(item)
            elif isinstance(item, torch.Tensor) and item.is_floating_point() and not torch.isfinite(item).all():
                out.append(f"{path.name} holds non-finite tensors")
                break
    return out


# ------------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    id: str
    group: str
    what: str
    expected: str
    run: Callable[[Env], None]
    issue: bool = False


CASES: list[Case] = []


def case(id: str, group: str, what: str, expected: str, issue: bool = False):  # noqa: A002
    def register(fn: Callable[[Env], None]) -> Callable[[Env], None]:
        CASES.append(Case(id, group, what, expected, fn, issue))
        return fn
    return register


class Skip(Exception):  # noqa: N818
    pass


class Env:
    """One case's copy of the complete artifacts and what it found wrong."""

    def __init__(self, harness: Harness, case_id: str) -> None:
        self.h = harness
        self.base = harness.work / "cases" / case_id
        self.root = self.base / "art"
        shutil.copytree(harness.golden, self.root)
        self.problems: list[str] = []
        self.mounts: list[Path] = []

    # paths
    @property
    def dir(self) -> Path:
        return self.root / NAME

    def path(self, name: str) -> Path:
        return self.dir / name

    # running
    def argv(self, command: str, *extra: str, root: Path | None = None, config: Path | None = None) -> list[str]:
        return [command, "--config", str(config or self.h.config), "--artifacts", str(root or self.root),
                "--quiet", *extra]

    def start(self, command: str, *extra: str, env: dict | None = None, cwd: Path = REPO, **kw) -> Proc:
        return self.h.runner.start(self.argv(command, *extra, **kw), env, cwd)

    def run(self, command: str, *extra: str, env: dict | None = None, cwd: Path = REPO, **kw) -> Proc:
        proc = self.start(command, *extra, env=env, cwd=cwd, **kw)
        proc.wait()
        return proc

    # checks
    def fail(self, text: str) -> None:
        self.problems.append(text)

    def check(self, proc: Proc, rc: int | set[int], has: str | None = None, label: str = "") -> None:
        """Exit code, no traceback or crash, exactly one line on stderr for a failure (exit 2, 130 or 143), and
        ``has`` in it."""
        err, label = proc.stderr, label and f"{label}: "
        wanted = rc if isinstance(rc, set) else {rc}
        if proc.rc not in wanted:
            self.fail(f"{label}exit {proc.rc} (want {'/'.join(map(str, sorted(wanted)))}): {_last(err)}")
        if "Traceback" in err:
            self.fail(f"{label}traceback: {_last(err)}")
        said = [line for line in err.strip().splitlines() if not WARNING_LINE.match(line)]
        if proc.rc in (2, 130, 143) and len(said) != 1:
            self.fail(f"{label}{len(said)} lines on stderr (want 1): {err.strip()[:300]!r}")
        if has and not re.search(has, err):
            self.fail(f"{label}stderr lacks /{has}/: {_last(err)}")

    def cli(self, command: str, *extra: str, rc: int | set[int] = 2, has: str | None = None,
            same: bool = True, env: dict | None = None, cwd: Path = REPO, **kw) -> Proc:
        """Run one command (in ``cwd``); check it (``check``) and, with ``same``, that no complete artifact
        changed."""
        before = snapshot(self.dir)
        broken = manifest_problems(self.dir)
        proc = self.run(command, *extra, env=env, cwd=cwd, **kw)
        self.check(proc, rc, has)
        if same:
            self.same(before)
        self.valid(broken)
        return proc

    def same(self, before: dict[str, str], where: Path | None = None) -> None:
        after = snapshot(where or self.dir)
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                state = "deleted" if name not in after else "created" if name not in before else "changed"
                self.fail(f"{name} {state}")

    def valid(self, broken_before: set[str] = frozenset()) -> None:
        """Every manifest's files still have their recorded digests (those broken on purpose aside)."""
        for problem in sorted(manifest_problems(self.dir) - set(broken_before)):
            self.fail(problem)

    def like_reference(self, variant: str, names: list[str]) -> None:
        for difference in content_differences(self.dir, self.h.reference(variant), names):
            self.fail(f"not as an uninterrupted run: {difference}")

    # file systems
    def tmpfs(self, free: int) -> Path:
        """A fresh small tmpfs holding a copy of the artifacts with about ``free`` bytes left; returns the
        new artifacts root."""
        mount = self.base / "disk"
        mount.mkdir()
        size = sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file()) + max(free, 0) + 2**20
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True).returncode:
            raise Skip("cannot mount a tmpfs (needs root)")
        self.mounts.append(mount)
        shutil.copytree(self.root, mount / "art")
        stat = os.statvfs(mount)
        fill = stat.f_bavail * stat.f_frsize - free
        with open(mount / "filler", "wb") as fh:
            block = b"\1" * 2**16
            with contextlib.suppress(OSError):
                while fill > 0:
                    fh.write(block[: min(fill, len(block))])
                    fill -= len(block)
        return mount / "art"

    def read_only(self) -> None:
        """Make the artifacts directory a read-only bind mount of itself."""
        if subprocess.run(["mount", "--bind", str(self.root), str(self.root)], capture_output=True).returncode:
            raise Skip("cannot bind-mount (needs root)")
        self.mounts.append(self.root)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(self.root)], check=True, capture_output=True)

    def close(self) -> None:
        for mount in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _last(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:240] if lines else "(no stderr)"


def wait_until(proc: Proc, predicate: Callable[[], bool], timeout: float = 300) -> bool:
    """Poll ``predicate`` until it holds (True) or ``proc`` ends or the time is up (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if predicate():
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def holds_lock(env: Env, proc: Proc) -> Callable[[], bool]:
    lock = env.dir / ".lock"
    return lambda: lock.is_file() and lock.read_text().strip() == str(proc.pid)


# --- A: two processes at once ---------------------------------------------------------------------------


def race(env: Env, first: tuple, second: tuple, second_rc: int = 2, first_rc: int = 0) -> tuple[Proc, Proc]:
    """Start ``first``; once it holds the lock, run ``second``, which must stop at once naming its PID."""
    a = env.start(*first)
    if not wait_until(a, holds_lock(env, a)):
        env.fail(f"first run never held the lock (exit {a.poll()}: {_last(a.stderr)})")
    b = env.run(*second)
    env.check(b, second_rc, has=rf"PID {a.pid}\b" if second_rc == 2 else None, label="second")
    a.wait()
    env.check(a, first_rc, label="first")
    return a, b


def simultaneous(env: Env, command: str, *extra: str) -> tuple[Proc, Proc]:
    """Two identical runs started together: one works, the other exits 2 naming the first's PID."""
    a, b = env.start(command, *extra), env.start(command, *extra)
    a.wait(), b.wait()
    if sorted([a.rc, b.rc]) != [0, 2]:
        env.fail(f"exit codes {a.rc}, {b.rc} (want 0 and 2): {_last(a.stderr)} | {_last(b.stderr)}")
    else:
        winner, loser = (a, b) if a.rc == 0 else (b, a)
        env.check(loser, 2, has=rf"PID {winner.pid}\b", label="loser")
        env.check(winner, 0, label="winner")
    env.valid()
    return a, b


for _i in range(3):
    @case(f"race-sample-{_i + 1}", "race", "two `sample --force` at once",
          "one exits 0, one 2 naming its PID; the store reads", issue=True)
    def _race_sample(env: Env) -> None:
        simultaneous(env, "sample", "--force")
        env.problems += store_problems(env.path("samples.h5"))

for _i in range(2):
    @case(f"race-evaluate-{_i + 1}", "race", "two `evaluate --force` at once",
          "one exits 0, one 2 naming its PID; scores.h5 has the test labels", issue=True)
    def _race_evaluate(env: Env) -> None:
        expected = h5py.File(env.path("eval/scores.h5"), "r")["test_labels"][()]
        simultaneous(env, "evaluate", "--force")
        with h5py.File(env.path("eval/scores.h5"), "r") as fh:
            if not np.array_equal(fh["test_labels"][()], expected):
                env.fail("eval/scores.h5 test_labels wrong")


@case("race-sample-changed-while-distill", "race", "`sample --set sgld.lr=0.2` while `distill --force` reads",
      "sample exits 2 naming distill's PID; the store is unchanged; distill finishes", issue=True)
def _race_sample_distill(env: Env) -> None:
    before = {k: v for k, v in snapshot(env.dir).items() if k.startswith("samples")}
    race(env, ("distill", "--force"), ("sample", "--set", "sgld.lr=0.2"))
    after = {k: v for k, v in snapshot(env.dir).items() if k.startswith("samples")}
    if after != before:
        env.fail("samples.* changed")
    env.valid()


@case("race-sample-force-while-distill", "race", "`sample --force` while `distill --force` reads",
      "sample exits 2 naming distill's PID; the store is unchanged", issue=True)
def _race_sample_force_distill(env: Env) -> None:
    before = {k: v for k, v in snapshot(env.dir).items() if k.startswith("samples")}
    race(env, ("distill", "--force"), ("sample", "--force"))
    if {k: v for k, v in snapshot(env.dir).items() if k.startswith("samples")} != before:
        env.fail("samples.* changed")
    env.valid()


@case("race-evaluate-while-distill", "race", "`evaluate --force` while `distill --force` writes",
      "evaluate exits 2 naming distill's PID")
def _race_evaluate_distill(env: Env) -> None:
    race(env, ("distill", "--force"), ("evaluate", "--force"))
    env.valid()


@case("race-distill-while-sample", "race", "`distill --force` while `sample --force` writes",
      "distill exits 2 naming sample's PID")
def _race_distill_sample(env: Env) -> None:
    race(env, ("sample", "--force"), ("distill", "--force"))
    env.valid()


@case("race-report-while-evaluate", "race", "`report` while `evaluate --force` writes eval/",
      "report exits 2 naming evaluate's PID")
def _race_report_evaluate(env: Env) -> None:
    race(env, ("evaluate", "--force"), ("report",))
    env.valid()


@case("race-info-while-sample", "race", "`info` while `sample --force` writes",
      "info exits 2 naming sample's PID")
def _race_info_sample(env: Env) -> None:
    race(env, ("sample", "--force"), ("info",))


@case("race-two-reports", "race", "two `report` at once", "one exits 0; the other 0 or 2 naming its PID; "
      "eval/ unchanged")
def _race_reports(env: Env) -> None:
    before = snapshot(env.dir)
    a, b = env.start("report"), env.start("report")
    a.wait(), b.wait()
    for proc in (a, b):
        env.check(proc, {0, 2}, label="report")
    if 0 not in (a.rc, b.rc):
        env.fail("neither report succeeded")
    env.same(before)


# --- B: a stage that fails half-way -----------------------------------------------------------------------

FAILS = [
    ("diverge-resample", "sample --set sgld.lr=1e6", ["sample", "--set", "sgld.lr=1e6"], "diverged", True),
    ("diverge-resample-force", "sample --force --set sgld.lr=1e6", ["sample", "--force", "--set", "sgld.lr=1e6"],
     "diverged", True),
    ("diverge-nan-checkpoint", "sample --set sgld.lr=1e6 --set sgld.checkpoint_every=20 (checkpoint before the "
     "first kept sample)", ["sample", "--set", "sgld.lr=1e6", "--set", "sgld.checkpoint_every=20"], "diverged", True),
    ("sgld-batch-too-large", "sample --set sgld.batch_size=5000", ["sample", "--set", "sgld.batch_size=5000"],
     "batch_size", True),
    ("baseline-batch-too-large", "sample --set baselines.batch_size=5000",
     ["sample", "--set", "baselines.batch_size=5000"], "batch_size", False),
    ("baseline-diverges", "sample --set baselines.lr=1e8", ["sample", "--set", "baselines.lr=1e8"], "diverged", False),
    ("distill-rank-too-large", "distill --set distill.subspace_rank=100000",
     ["distill", "--set", "distill.subspace_rank=100000"], "rank", True),
    ("distill-fit-samples-2", "distill --set distill.fit_samples=2", ["distill", "--set", "distill.fit_samples=2"],
     "fit_samples", True),
    ("distill-diverges", "distill --set distill.lr=1e12 --set distill.checkpoint_every=5",
     ["distill", "--set", "distill.lr=1e12", "--set", "distill.checkpoint_every=5"], None, False),
    ("evaluate-mog-too-large", "evaluate --set evaluate.mog_components=[1,500] --set evaluate.mog_fit_samples=500",
     ["evaluate", "--set", "evaluate.mog_components=[1,500]", "--set", "evaluate.mog_fit_samples=500"], "500", False),
    ("evaluate-too-few-samples", "evaluate --set evaluate.sgld_samples=1000 (the store has 40)",
     ["evaluate", "--set", "evaluate.sgld_samples=1000"], "1000", True),
    ("evaluate-ood-dir-missing", "evaluate with the notmnist OOD set from a directory that does not exist",
     ["evaluate", "--set", 'data.ood=["gaussian","notmnist"]', "--set", 'data.ood_dirs={notmnist="/nonexistent"}'],
     None, False),
]
for _id, _what, _argv, _has, _issue in FAILS:
    @case(_id, "fails", _what, "exit 2, one line, every complete artifact unchanged, no non-finite checkpoint",
          issue=_issue)
    def _fails(env: Env, argv=_argv, has=_has) -> None:
        env.cli(*argv, rc=2, has=has)
        env.problems += checkpoint_problems(env.dir)


# --- C: provenance --------------------------------------------------------------------------------------


@case("stale-distill-other-sgld", "provenance", "distill --set sgld.lr=0.05 (store made with lr 0.1)",
      "exit 2 naming `apd sample`, unchanged", issue=True)
def _stale_distill(env: Env) -> None:
    env.cli("distill", "--set", "sgld.lr=0.05", has="apd sample")


@case("stale-evaluate-other-rank", "provenance", "evaluate --set distill.subspace_rank=3 (rank-4 generator)",
      "exit 2 naming `apd distill`, unchanged", issue=True)
def _stale_rank(env: Env) -> None:
    env.cli("evaluate", "--set", "distill.subspace_rank=3", has="apd distill")


for _manifest, _command, _issue in (("samples.json", "distill", True), ("samples.json", "evaluate", False),
                                    ("generator.json", "evaluate", True),
                                    ("baselines/sgd.json", "evaluate", True)):
    @case(f"edited-hash-{_manifest.replace('/', '-').removesuffix('.json')}-{_command}", "provenance",
          f"{_command} after editing config_hash in {_manifest}", "exit 2, unchanged", issue=_issue)
    def _edited_hash(env: Env, manifest=_manifest, command=_command) -> None:
        edit_json(env.path(manifest), config_hash="0123456789abcdef")
        env.cli(command)


@case("edited-hash-sample-redoes", "provenance", "sample after editing config_hash in samples.json",
      "exit 0: the store is made again (its manifest no longer matches); manifests hold")
def _edited_hash_sample(env: Env) -> None:
    edit_json(env.path("samples.json"), config_hash="0123456789abcdef")
    env.cli("sample", rc=0, same=False)
    env.like_reference("base", ["samples.h5"])


@case("edited-digest-distill", "provenance", "distill after editing the file digest in samples.json",
      "exit 2, unchanged")
def _edited_digest(env: Env) -> None:
    edit_json(env.path("samples.json"), files={"samples.h5": "0" * 16})
    env.cli("distill", "--force", has="changed")


@case("stale-generator-after-resample", "provenance", "sample --force, then evaluate (generator from the old store)",
      "sample exit 0; evaluate exit 2 naming `apd distill`; eval/ unchanged")
def _stale_generator(env: Env) -> None:
    env.cli("sample", "--force", rc=0, same=False)
    env.cli("evaluate", has="apd distill")


@case("tampered-store-distill", "provenance", "distill --force after changing bytes of samples.h5",
      "exit 2 (changed since made), unchanged")
def _tampered_distill(env: Env) -> None:
    random_bytes(env.path("samples.h5"), 50_000, 64)
    env.cli("distill", "--force", has="changed")


@case("tampered-store-sample-redoes", "provenance", "sample after changing bytes of samples.h5",
      "exit 0: the store is made again, as before the change")
def _tampered_sample(env: Env) -> None:
    random_bytes(env.path("samples.h5"), 50_000, 64)
    env.cli("sample", rc=0, same=False)
    env.like_reference("base", ["samples.h5"])
    env.valid()


@case("missing-samples-manifest", "provenance", "distill --force without samples.json",
      "exit 2 naming `apd sample`, unchanged")
def _missing_manifest(env: Env) -> None:
    env.path("samples.json").unlink()
    env.cli("distill", "--force", has="apd sample")


@case("garbage-samples-manifest", "provenance", "distill --force with samples.json not JSON", "exit 2, unchanged")
def _garbage_manifest(env: Env) -> None:
    env.path("samples.json").write_text("{not json")
    env.cli("distill", "--force")


@case("list-samples-manifest", "provenance", "distill --force with samples.json a JSON list", "exit 2, unchanged")
def _list_manifest(env: Env) -> None:
    env.path("samples.json").write_text("[1, 2]")
    env.cli("distill", "--force")


@case("missing-generator-manifest", "provenance", "evaluate without generator.json", "exit 2 naming `apd distill`")
def _missing_generator_manifest(env: Env) -> None:
    env.path("generator.json").unlink()
    env.cli("evaluate", has="apd distill")


@case("evaluate-other-net", "provenance", "evaluate --set net.hidden=[8]", "exit 2, unchanged")
def _other_net(env: Env) -> None:
    env.cli("evaluate", "--set", "net.hidden=[8]")


@case("truncated-store-distill", "provenance", "distill --force with samples.h5 cut in half", "exit 2, unchanged")
def _truncated_store(env: Env) -> None:
    path = env.path("samples.h5")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    env.cli("distill", "--force")


@case("truncated-store-forged-distill", "provenance", "distill --force with samples.h5 cut in half, digest forged",
      "exit 2, unchanged")
def _truncated_forged(env: Env) -> None:
    path = env.path("samples.h5")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    forge(env.path("samples.json"))
    env.cli("distill", "--force")


@case("tampered-results-report", "provenance", "report after editing eval/results.json",
      "exit 2 (changed since evaluate), unchanged")
def _tampered_results(env: Env) -> None:
    edit_json(env.path("eval/results.json"), runs=7)
    env.cli("report", has="changed")


@case("tampered-results-evaluate-redoes", "provenance", "evaluate after editing eval/results.json",
      "exit 0: evaluated again, results as before")
def _tampered_results_evaluate(env: Env) -> None:
    edit_json(env.path("eval/results.json"), runs=7)
    env.cli("evaluate", rc=0, same=False)
    env.like_reference("base", ["eval/results.json"])


# --- D: validation up front, hostile files, full disks, read-only directories ---------------------------


@case("env-data-dir-fashion-ood", "validate", "evaluate --force with $APD_DATA_DIR holding other images "
      "(the 'fashion' OOD set must not come from it)", "exit 0, results exactly as without it", issue=True)
def _env_fashion(env: Env) -> None:
    fake = fake_mnist(env.base / "fake")
    env.cli("evaluate", "--force", rc=0, same=False, env={"APD_DATA_DIR": str(fake)})
    env.like_reference("base", ["eval/results.json"])


for _device, _command, _issue in (("tpu", "sample", True), ("cuda:abc", "distill", True), ("meta", "evaluate", True),
                                  ("tpu", "info", False), ("cuda:0", "sample", False), ("CPU", "sample", False),
                                  ("cuda", "evaluate", False)):
    @case(f"device-{_device.replace(':', '-')}-{_command}", "validate", f"{_command} --device {_device} "
          "(complete artifacts: reuse would follow)", "exit 2, one line, unchanged", issue=_issue)
    def _device_case(env: Env, device=_device, command=_command) -> None:
        if device.startswith("cuda") and torch.cuda.is_available():
            raise Skip("a CUDA device is present")
        env.cli(command, "--device", device, has="device")


@case("device-in-config", "validate", "sample --set device=\"meta\"", "exit 2, one line, unchanged")
def _device_config(env: Env) -> None:
    env.cli("sample", "--set", 'device="meta"', has="device")


for _seed, _issue in (("99999999999999999", True), ("4294967296", False), ("-1", False)):
    @case(f"seed-{_seed}", "validate", f"sample --set seed={_seed}", "exit 2, one line, unchanged", issue=_issue)
    def _seed_case(env: Env, seed=_seed) -> None:
        env.cli("sample", "--set", f"seed={seed}", has="seed")


for _broken, _issue in (("zlib", True), ("crc", False), ("truncated", False), ("notgz", False)):
    @case(f"idx-gz-{_broken}", "validate", f"sample on MNIST IDX files whose .gz has a {_broken} error",
          "exit 2, one line, unchanged", issue=_issue)
    def _idx_case(env: Env, broken=_broken) -> None:
        data = fake_mnist(env.base / "mnist", broken)
        env.cli("sample", "--set", 'data.dataset="mnist"', "--data-dir", str(data), has="IDX")


@case("idx-gz-zlib-env", "validate", "sample on a broken .gz found through $APD_DATA_DIR",
      "exit 2, one line, unchanged")
def _idx_env(env: Env) -> None:
    data = fake_mnist(env.base / "mnist", "zlib")
    env.cli("sample", "--set", 'data.dataset="mnist"', env={"APD_DATA_DIR": str(data)}, has="IDX")


for _command, _forged, _issue in (("distill", False, True), ("distill", True, True), ("evaluate", True, True),
                                  ("evaluate", False, False)):
    @case(f"nan-rows-{_command}{'-forged' if _forged else ''}", "validate",
          f"{_command} --force with NaN rows in samples.h5" + (", digest forged" if _forged else ""),
          "exit 2, one line, unchanged", issue=_issue)
    def _nan_case(env: Env, command=_command, forged=_forged) -> None:
        nan_rows(env.path("samples.h5"), [0, 5, 39])
        if forged:
            forge(env.path("samples.json"))
        env.cli(command, "--force")


@case("nan-rows-sample-forged", "validate", "sample with NaN rows in samples.h5 under a forged digest (reuse)",
      "exit 0: not reused, sampled again; the store is finite", issue=True)
def _nan_sample(env: Env) -> None:
    nan_rows(env.path("samples.h5"), [3])
    forge(env.path("samples.json"))
    env.cli("sample", rc=0, same=False)
    env.problems += store_problems(env.path("samples.h5"))
    env.like_reference("base", ["samples.h5"])


def same_samples(env: Env) -> None:
    """The case's store reads the rows and columns of the complete set's (its bytes may differ)."""
    with h5py.File(env.path("samples.h5"), "r") as fa, h5py.File(env.h.golden / NAME / "samples.h5", "r") as fb:
        for key in ("samples", "step", "chain", "lr", "log_lik"):
            if not np.array_equal(fa[key][()], fb[key][()]):
                env.fail(f"samples.h5/{key} reads differently, yet was used")


for _offset in (0, 96, 200, 520, 1024, 2048, 4096):
    @case(f"header-bytes-{_offset}", "validate", f"distill --force, then evaluate --force, with 64 random bytes at "
          f"{_offset} of samples.h5 (digest forged)", "each: exit 2, one line, unchanged; or exit 0 where the bytes "
          "miss what is read (the store then reads exactly as before)", issue=_offset in (96, 1024))
    def _header_case(env: Env, offset=_offset) -> None:
        random_bytes(env.path("samples.h5"), offset, 64, seed=offset)
        forge(env.path("samples.json"))
        for command in ("distill", "evaluate"):
            before = snapshot(env.dir)
            proc = env.run(command, "--force")
            env.check(proc, {0, 2}, label=command)
            if proc.rc == 2:
                env.same(before)
            else:
                same_samples(env)
            env.valid()


@case("header-bytes-sample", "validate", "sample with random bytes near the store's header (stale digest)",
      "exit 0: sampled again, as before")
def _header_sample(env: Env) -> None:
    random_bytes(env.path("samples.h5"), 96, 64)
    env.cli("sample", rc=0, same=False)
    env.like_reference("base", ["samples.h5"])


DISK = [("sample", ["--force"], 0, True), ("sample", ["--force"], 230_000, True),
        ("sample", ["--force"], 260_000, True), ("sample", ["--force"], 300_000, True),
        ("sample", ["--force", "--set", "sgld.iterations=900"], 900_000, True),
        ("distill", ["--force"], 0, True), ("distill", ["--force"], 40_000, True),
        ("evaluate", ["--force"], 0, True), ("evaluate", ["--force"], 150_000, True)]
for _command, _extra, _free, _issue in DISK:
    @case(f"disk-full-{_command}-{_free // 1000}k" + ("-long" if len(_extra) > 1 else ""), "disk",
          f"{_command} {' '.join(_extra)} with {_free // 1000} kB free (tmpfs)",
          "exit 2, one line, unchanged, no crash", issue=_issue)
    def _disk_case(env: Env, command=_command, extra=_extra, free=_free) -> None:
        root = env.tmpfs(free)
        before = snapshot(root / NAME)
        proc = env.run(command, *extra, root=root)
        env.check(proc, 2)
        env.same(before, root / NAME)


FILLS = [("sample-store", "sample", ["--force", "--set", "sgld.iterations=2000", "--set", "sgld.checkpoint_every=50"],
          "samples.partial.h5"),
         ("sample-checkpoint", "sample", ["--force", "--set", "sgld.iterations=2000", "--set",
                                          "sgld.checkpoint_every=50"], "samples.ckpt.pt"),
         ("distill-checkpoint", "distill", ["--force", "--set", "distill.steps=400", "--set",
                                            "distill.checkpoint_every=5"], "generator.ckpt.pt"),
         ("evaluate-building", "evaluate", ["--force", "--set", "evaluate.runs=3"], "eval.partial")]
for _id, _command, _extra, _trigger in FILLS:
    @case(f"disk-fills-during-{_id}", "disk",
          f"{_command} {' '.join(_extra)}; another process fills the disk once {_trigger} exists",
          "exit 2, one line, unchanged, no crash", issue=True)
    def _fills_case(env: Env, command=_command, extra=_extra, trigger=_trigger) -> None:
        root = env.tmpfs(8 * 2**20)
        before = snapshot(root / NAME)
        proc = env.start(command, *extra, root=root)
        if not wait_until(proc, (root / NAME / trigger).exists):
            env.fail(f"{trigger} never appeared (exit {proc.poll()}: {_last(proc.stderr)})")
        with contextlib.suppress(OSError), open(root.parent / "filler2", "wb", buffering=0) as fh:
            while True:
                fh.write(b"\1" * 2**16)
        proc.wait()
        env.check(proc, 2, has="No space left")
        env.same(before, root / NAME)


@case("disk-full-reuse", "disk", "sample on a full disk with everything complete", "exit 0: reused")
def _disk_reuse(env: Env) -> None:
    root = env.tmpfs(0)
    before = snapshot(root / NAME)
    env.check(env.run("sample", root=root), 0)
    env.same(before, root / NAME)


FRONTIER = ["--option", "budgets=[2]", "--option", "steps=10", "--option", "subsets=200"]  # the fewest it takes


@case("disk-full-frontier", "disk", "experiment frontier again with 2 kB free (tmpfs): not all of its outputs fit",
      "exit 2, one line; frontier.json, .md and .png all as they were", issue=True)
def _disk_frontier(env: Env) -> None:
    env.cli("experiment", "frontier", *FRONTIER, rc=0, same=False)
    root = env.tmpfs(2000)
    out = root / NAME / "experiments"
    before = snapshot(out)
    env.check(env.run("experiment", "frontier", *FRONTIER, "--option", "subsets=201", root=root), 2, has="No space")
    env.same(before, out)
    outputs = sorted(p.name for p in out.iterdir() if not is_work(Path(p.name)))  # the parts it keeps to resume aside
    if outputs != ["frontier.json", "frontier.md", "frontier.png"]:
        env.fail(f"left in experiments/: {outputs}")


def docs_project(env: Env, changes: dict[str, Callable[[dict], object] | str]) -> Path:
    """A copy of README.md and docs/ under the case's folder, with each ``docs/results/`` file of ``changes``
    changed by its function (on the parsed JSON) or replaced by its text."""
    project = env.base / "project"
    project.mkdir()
    shutil.copy(REPO / "README.md", project)
    shutil.copytree(REPO / "docs", project / "docs")
    for name, change in changes.items():
        path = project / "docs" / "results" / name
        if isinstance(change, str):
            path.write_text(change)
        else:
            data = json.loads(path.read_text())
            change(data)
            path.write_text(json.dumps(data))
    return project


DOCS = [("corrupt-file-and-a-change", {"fashion-lenet5/precision.json": "{",
                                       "digits/results.json": lambda d: d["machine"].update(cpu="Another CPU")},
         "precision.json"),
        ("machine-not-a-table", {"digits/results.json": lambda d: d.update(machine=5)}, "field 'machine'"),
        ("mean-not-a-number", {"digits/results.json": lambda d: d["accuracy"]["apd"]["acc"].update(mean="high")},
         r"field 'accuracy\.apd\.acc\.mean'"),
        ("samples-without-diagnostics", {"digits/samples.json": lambda d: d.pop("diagnostics")},
         "samples.json: field 'diagnostics'")]
for _id, _changes, _has in DOCS:
    @case(f"docs-{_id}", "validate", f"report --docs with {', '.join(_changes)} changed",
          "exit 2, one line naming the file (and field); no document written", issue=True)
    def _docs_case(env: Env, changes=_changes, has=_has) -> None:
        project = docs_project(env, changes)
        before = snapshot(project)
        env.cli("report", "--docs", has=has, cwd=project)
        env.same(before, project)
        leftovers = [str(p.relative_to(project)) for p in project.rglob("*.tmp")]
        if leftovers:
            env.fail(f"temporaries left: {leftovers}")


for _command, _extra, _rc, _issue in (("sample", [], 2, True), ("sample", ["--force"], 2, False),
                                      ("distill", ["--force"], 2, False), ("evaluate", ["--force"], 2, True),
                                      ("report", [], 2, False), ("info", [], 0, False)):
    @case(f"read-only-{_command}{'-force' if _extra else ''}", "disk",
          f"{_command} {' '.join(_extra)} on a read-only artifacts directory",
          "exit 0 (info reads only)" if _rc == 0 else "exit 2, one line, unchanged", issue=_issue)
    def _ro_case(env: Env, command=_command, extra=_extra, rc=_rc) -> None:
        env.read_only()
        env.cli(command, *extra, rc=rc)


for _rank, _port in (("1", "1"), ("0", "29561")):
    @case(f"torchrun-rank{_rank}-without-peers", "validate",
          f"sample with RANK={_rank} WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={_port} and no other worker",
          "exit 2 after APD_JOIN_TIMEOUT (5 s), one line, unchanged; the lock is free again", issue=True)
    def _torchrun_alone(env: Env, rank=_rank, port=_port) -> None:
        variables = {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                     "APD_JOIN_TIMEOUT": "5"}
        env.cli("sample", "--force", has="did not join", env=variables)
        env.cli("info", rc=0)


for _command, _rc in (("evaluate", 2), ("distill", 2), ("info", 0)):
    @case(f"artifacts-missing-{_command}", "validate", f"{_command} --artifacts DIR/THAT/DOES/NOT/EXIST",
          f"exit {_rc}; no folder created", issue=_command == "evaluate")
    def _artifacts_missing(env: Env, command=_command, rc=_rc) -> None:
        env.check(env.run(command, root=env.base / "nowhere" / "deeper"), rc)
        if (env.base / "nowhere").exists():
            env.fail(f"created {sorted(str(p.relative_to(env.base)) for p in (env.base / 'nowhere').rglob('*'))}")


for _command in ("sample", "evaluate", "info"):
    @case(f"artifacts-is-file-{_command}", "validate", f"{_command} --artifacts FILE", "exit 2, one line",
          issue=_command == "sample")
    def _artifacts_file(env: Env, command=_command) -> None:
        target = env.base / "plain-file"
        target.write_text("x")
        proc = env.run(command, root=target)
        env.check(proc, 2, has="not a directory")
        if target.read_text() != "x":
            env.fail("the file changed")


@case("artifacts-under-file", "validate", "sample --artifacts FILE/sub", "exit 2, one line")
def _artifacts_under_file(env: Env) -> None:
    target = env.base / "plain-file"
    target.write_text("x")
    env.check(env.run("sample", root=target / "sub"), 2)


for _name, _issue in (("../../x", True), ("../x", False), ("a/b", False), ("..", False), (".", False), ("", False),
                      ("/tmp/abs", False)):
    @case(f"name-{_name.replace('/', '_').replace('.', 'dot') or 'empty'}", "validate",
          f"sample --set name=\"{_name}\"", "exit 2, one line, nothing written anywhere", issue=_issue)
    def _name_case(env: Env, name=_name) -> None:
        if name == "/tmp/abs":  # an absolute path of this case's own
            name = str(env.base / "abs")
        before = snapshot(env.base)
        proc = env.run("sample", "--set", f'name="{name}"')
        env.check(proc, 2, has="name")
        env.same(before, env.base)


for _target, _forged, _command, _rc, _issue in (
        ("generator.pt", True, "evaluate", 2, True), ("generator.pt", False, "evaluate", 2, True),
        ("generator.pt", True, "distill", 0, True), ("generator.pt", False, "distill", 0, False),
        ("baselines/sgd.pt", True, "evaluate", 2, False), ("baselines/mcdropout.pt", False, "evaluate", 2, False)):
    @case(f"corrupt-{Path(_target).stem}-{_command}{'-forged' if _forged else ''}", "validate",
          f"{_command} with {_target} corrupted" + (" under a forged (valid) manifest" if _forged else ""),
          "exit 2, unchanged" if _rc == 2 else "exit 0: made again (not reused), as before", issue=_issue)
    def _corrupt_case(env: Env, target=_target, forged=_forged, command=_command, rc=_rc) -> None:
        random_bytes(env.path(target), 300, 200)
        if forged:
            forge(env.path(str(Path(target).with_suffix(".json"))))
        env.cli(command, rc=rc, same=rc == 2)
        if rc == 0:
            env.like_reference("base", ["generator.pt", "generator-last.pt"])


for _target, _command, _rc in (("baselines/sgd.pt", "evaluate", 2), ("generator.pt", "evaluate", 2),
                               ("generator.pt", "distill", 0)):
    @case(f"nan-weights-{Path(_target).stem}-{_command}", "validate",
          f"{_command} with NaN weights saved in {_target} under a forged (valid) manifest",
          "exit 2, one line, unchanged" if _rc == 2 else "exit 0: made again (not reused), as before")
    def _nan_weights(env: Env, target=_target, command=_command, rc=_rc) -> None:
        state = torch.load(env.path(target), weights_only=True)
        next(iter(state.values())).fill_(float("nan"))
        torch.save(state, env.path(target))
        forge(env.path(str(Path(target).with_suffix(".json"))))
        env.cli(command, rc=rc, same=rc == 2)
        if rc == 0:
            env.like_reference("base", ["generator.pt", "generator-last.pt"])


# --- E: interrupted stages resume --------------------------------------------------------------------------


def _mtime_count(path: Path) -> Callable[[], int]:
    seen: dict[str, object] = {"last": None, "count": 0}

    def count() -> int:
        stamp = path.stat().st_mtime_ns if path.exists() else None
        if stamp is not None and stamp != seen["last"]:
            seen["last"], seen["count"] = stamp, seen["count"] + 1
        return seen["count"]
    return count


def _changed(path: Path) -> Callable[[], bool]:
    before = path.stat().st_mtime_ns
    return lambda: path.stat().st_mtime_ns != before


def _after(seconds: float) -> Callable[[Env, Proc], Callable[[], bool]]:
    def make(env: Env, proc: Proc) -> Callable[[], bool]:
        started: list[float] = []
        locked = holds_lock(env, proc)

        def due() -> bool:
            if not started and locked():
                started.append(time.monotonic())
            return bool(started) and time.monotonic() - started[0] >= seconds
        return due
    return make


def _nth_checkpoint(name: str, n: int) -> Callable[[Env, Proc], Callable[[], bool]]:
    def make(env: Env, proc: Proc) -> Callable[[], bool]:
        count = _mtime_count(env.path(name))
        return lambda: count() >= n
    return make


def _between_checkpoints(name: str, n: int) -> Callable[[Env, Proc], Callable[[], bool]]:
    """Due halfway from the ``n``-th write of checkpoint ``name`` to the next, by the interval between the
    (n−1)-th and the n-th: a moment inside the work, on a machine of any speed (a fixed delay after the lock
    outlived the whole distillation once it got fast enough). Evaluation, which writes no checkpoint, keeps
    a fixed delay (:func:`_after`)."""
    def make(env: Env, proc: Proc) -> Callable[[], bool]:
        count, seen = _mtime_count(env.path(name)), {}

        def due() -> bool:
            now, written = time.monotonic(), count()
            seen.setdefault(written, now)
            return written >= n and n - 1 in seen and now - seen[n] >= (seen[n] - seen[n - 1]) / 2
        return due
    return make


KILL_POINTS = {
    "sample": {
        "locked": lambda env, proc: holds_lock(env, proc),
        "store-created": lambda env, proc: env.path("samples.partial.h5").exists,
        "checkpoint-1": _nth_checkpoint("samples.ckpt.pt", 1),
        "checkpoint-4": _nth_checkpoint("samples.ckpt.pt", 4),
        # the chains step together: 7 checkpoints within the 800 iterations, the 8th once they are all done,
        # before the diagnostics and the publication
        "all-iterations-done": _nth_checkpoint("samples.ckpt.pt", 8),
        "store-published": lambda env, proc: _changed(env.path("samples.json")),
        "sgd-published": lambda env, proc: _changed(env.path("baselines/sgd.json")),
        "between-checkpoints-2-3": _between_checkpoints("samples.ckpt.pt", 2),
    },
    "distill": {
        "locked": lambda env, proc: holds_lock(env, proc),
        "checkpoint-1": _nth_checkpoint("generator.ckpt.pt", 1),
        "checkpoint-5": _nth_checkpoint("generator.ckpt.pt", 5),
        "between-checkpoints-3-4": _between_checkpoints("generator.ckpt.pt", 3),
    },
    "evaluate": {
        "locked": lambda env, proc: holds_lock(env, proc),
        "building": lambda env, proc: env.path("eval.partial").exists,
        "scores-open": lambda env, proc: env.path("eval.partial/scores.h5").exists,
        "after-4s": _after(4.0),
    },
}
RESULTS = {"sample": ["samples.h5", "samples.json", "baselines/sgd.pt", "baselines/sgd.json", "baselines/mcdropout.pt",
                      "baselines/mcdropout.json"],
           "distill": ["generator.pt", "generator-last.pt", "generator.json"],
           "evaluate": ["eval/results.json", "eval/scores.h5", "eval/evaluate.json"]}
# Figures a stage replaces together with its results (not compared byte for byte with the reference run).
FIGURES = {"sample": ["diagnostics.png"], "distill": [], "evaluate": []}

for _stage, _points in KILL_POINTS.items():
    for _point, _trigger in _points.items():
        for _sig in (signal.SIGKILL, signal.SIGINT):
            _signame = "kill9" if _sig == signal.SIGKILL else "sigint"

            @case(f"{_signame}-{_stage}-{_point}", "interrupt",
                  f"{_stage} (another config) stopped by {_signame.upper()} at '{_point}', then run again",
                  "complete artifacts intact after the stop"
                  + (" (exit 130, one line)" if _sig == signal.SIGINT else "")
                  + "; the rerun stores exactly what an uninterrupted run does")
            def _interrupt(env: Env, stage=_stage, trigger=_trigger, sig=_sig) -> None:
                command, extra = VARIANTS[stage]
                before = snapshot(env.dir)
                proc = env.start(command, *extra)
                if not wait_until(proc, trigger(env, proc)):
                    env.fail(f"the stop point was never reached (exit {proc.poll()}: {_last(proc.stderr)})")
                proc.signal(sig)
                proc.wait()
                if sig == signal.SIGINT:
                    env.check(proc, {130, 0}, has="interrupted" if proc.rc == 130 else None, label="interrupted run")
                elif proc.rc not in (128 + signal.SIGKILL, 0):
                    env.fail(f"killed run exit {proc.rc}: {_last(proc.stderr)}")
                after = snapshot(env.dir)
                for name in before:  # each complete artifact: untouched, or replaced by a complete new one
                    if after.get(name) != before[name] and name not in RESULTS[stage] + FIGURES[stage] + [
                            n for n in after if n.startswith("eval/")]:
                        env.fail(f"{name} {'deleted' if name not in after else 'changed'} by the stopped run")
                    if name not in after and not name.startswith("eval/figures"):
                        env.fail(f"{name} missing after the stop")
                env.valid()
                rerun = env.run(command, *extra)
                env.check(rerun, 0, label="rerun")
                env.like_reference(stage, RESULTS[stage] if stage != "evaluate" else ["eval/results.json",
                                                                                      "eval/scores.h5"])
                env.valid()


@case("kill9-sample-force-same-config", "interrupt", "sample --force killed at its 2nd checkpoint",
      "every complete artifact unchanged")
def _kill_force(env: Env) -> None:
    before = snapshot(env.dir)
    proc = env.start("sample", "--force", "--set", "sgld.checkpoint_every=20")
    if not wait_until(proc, _nth_checkpoint("samples.ckpt.pt", 2)(env, proc)):
        env.fail("stop point never reached")
    proc.signal(signal.SIGKILL)
    proc.wait()
    env.same(before)


def _stop_workers_run(env: Env, sig: int, event: str, seconds: float, *extra: str) -> Proc:
    """``sample --force`` on two workers (with ``extra`` arguments), sent ``sig`` ``seconds`` after ``event``
    ("start", or "workers": its first worker process appeared); returns the ended run once no worker it started
    is running (5 s at most)."""
    proc = env.start("sample", "--force", "--set", "sgld.workers=2", *extra)
    workers: set[int] = set()
    if event == "workers" and not wait_until(proc, lambda: bool(workers.update(_children(proc.pid)) or workers)):
        env.fail(f"no worker ever started (exit {proc.poll()}: {_last(proc.stderr)})")
    due = time.monotonic() + seconds
    while time.monotonic() < due and proc.poll() is None:
        workers |= _children(proc.pid)
        time.sleep(0.002)
    proc.signal(sig)
    while proc.poll() is None:
        workers |= _children(proc.pid)
        time.sleep(0.002)
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    env.problems += [f"worker {pid} outlived its parent" for pid in workers if _running(pid)]
    return proc


WORKER_STOPS = [(signal.SIGINT, "start", t) for t in (0.05, 1.0, 3.0, 6.0, 10.0)]
WORKER_STOPS += [(signal.SIGINT, "workers", t) for t in (0.0, 0.2, 0.6, 1.5, 3.0)]
WORKER_STOPS += [(signal.SIGTERM, "start", 0.05), (signal.SIGTERM, "workers", 0.3), (signal.SIGTERM, "workers", 3.0)]
for _sig, _event, _seconds in WORKER_STOPS:
    _when = "at" if _event == "start" else "started"

    @case(f"{signal.Signals(_sig).name.lower()}-sample-workers-{_when}-{_seconds:g}s",
          "interrupt", f"sample --force on two workers, {signal.Signals(_sig).name} {_seconds:g} s after "
          + ("it started" if _event == "start" else "its workers started"),
          f"exit {128 + _sig} (or 0 when done), one line; no worker left; complete artifacts intact or replaced whole")
    def _stop_workers(env: Env, sig=_sig, event=_event, seconds=_seconds) -> None:
        before = snapshot(env.dir)
        proc = _stop_workers_run(env, sig, event, seconds)
        env.check(proc, {128 + sig, 0})
        env.problems += [f"{name} lost" for name in before if not env.path(name).is_file()]
        env.valid()
        env.problems += store_problems(env.path("samples.h5"))

KILLED_ITERATIONS = 30000  # SGLD iterations of a run to kill: more than 3 s (a run that ends first fails the case)

for _seconds in (0.3, 3.0):
    @case(f"kill9-sample-workers-{_seconds:g}s", "interrupt",
          f"sample --force of {KILLED_ITERATIONS:,} iterations on two workers killed (SIGKILL) {_seconds:g} s "
          "after its workers started", "no worker outlives it; nothing published")
    def _kill_workers_parent(env: Env, seconds=_seconds) -> None:
        before = snapshot(env.dir)
        proc = _stop_workers_run(env, signal.SIGKILL, "workers", seconds,
                                 "--set", f"sgld.iterations={KILLED_ITERATIONS}")
        if proc.rc == 0:
            env.fail(f"the run ended before the kill {seconds:g} s in: nothing was cut short")
        env.same(before)


# --- F: pickles are never loaded ---------------------------------------------------------------------------

PICKLES = [
    ("baselines/sgd.pt", False, False, "evaluate", 2), ("baselines/sgd.pt", True, False, "evaluate", 2),
    ("baselines/sgd.pt", True, True, "evaluate", 2), ("baselines/mcdropout.pt", True, False, "evaluate", 2),
    ("generator.pt", True, False, "evaluate", 2), ("generator.pt", True, True, "evaluate", 2),
    ("generator.pt", True, False, "distill", 0), ("generator-last.pt", True, False, "distill", 0),
    ("samples.h5", True, False, "distill", 2), ("samples.h5", True, False, "evaluate", 2),
    ("samples.ckpt.pt", False, False, "sample", 0), ("generator.ckpt.pt", False, False, "distill", 0),
    ("baselines/sgd.partial.pt", False, False, "sample", 0),
]
for _target, _forged, _legacy, _command, _rc in PICKLES:
    @case(f"pickle-{_target.replace('/', '-')}-{_command}{'-forged' if _forged else ''}{'-legacy' if _legacy else ''}",
          "pickle", f"{_command} with a malicious {'plain ' if _legacy else 'torch '}pickle as {_target}"
          + (" under a forged manifest" if _forged else ""),
          f"never unpickled; exit {_rc}" + (", one line, unchanged" if _rc == 2 else ""))
    def _pickle_case(env: Env, target=_target, forged=_forged, legacy=_legacy, command=_command, rc=_rc) -> None:
        marker = env.base / "PWNED"
        plant_pickle(env.path(target), marker, legacy)
        if forged:
            manifest = env.path(str(Path(target).with_suffix(".json")))
            if target == "generator-last.pt" or not manifest.exists():
                manifest = env.path("generator.json")
            forge(manifest)
        extra = {"sample": ["--set", "seed=2"], "distill": ["--set", "distill.steps=60"]}.get(command, [])
        if target in ("samples.ckpt.pt",):
            shutil.copy(env.path("samples.h5"), env.path("samples.partial.h5"))
        if command == "distill" and target.startswith("generator") and not target.endswith("ckpt.pt"):
            extra = []
        env.cli(command, *extra, rc=rc, same=rc == 2)
        if marker.exists():
            env.fail("the pickle was executed")


# --- G: bad configs, H: bad data, I: reuse ------------------------------------------------------------------

BAD_CONFIG = [
    ("unknown-key", "sample", ["--set", "sgld.foo=1"], "unknown key"),
    ("wrong-type", "sample", ["--set", 'sgld.lr="fast"'], "number"),
    ("out-of-range", "sample", ["--set", "sgld.lr=-1"], "greater than"),
    ("no-config-file", "sample", ["--config", "/nonexistent.toml"], "no such pipeline"),
    ("bad-set-syntax", "distill", ["--set", "sgld.lr"], "expected section.key=value"),
    ("burn-in-too-long", "sample", ["--set", "sgld.burn_in=400"], "burn_in"),
    ("unknown-method", "evaluate", ["--set", 'evaluate.methods=["sgld","bogus"]'], "bogus"),
    ("methods-without-sgld", "evaluate", ["--set", 'evaluate.methods=["sgd"]'], "sgld"),
    ("unknown-adversarial-source", "evaluate", ["--set", 'evaluate.adversarial.sources=["nope"]'], "nope"),
    ("mog-fit-too-small", "evaluate", ["--set", "evaluate.mog_fit_samples=1"], "mog_fit_samples"),
    ("unknown-dataset", "sample", ["--set", 'data.dataset="cifar"'], "dataset"),
    ("unknown-ood-set", "evaluate", ["--set", 'data.ood=["gaussian","bogus"]'], None),
    ("zero-hidden", "sample", ["--set", "net.hidden=[0]"], "positive"),
    ("section-not-table", "sample", ["--set", "sgld=5"], "table"),
    ("key-below-value", "sample", ["--set", "sgld.lr.x=1"], "not a section"),
    ("unknown-top-level", "sample", ["--set", "bogus=1"], "unknown key"),
    ("bad-mode", "distill", ["--set", 'distill.mode="offline2"'], "mode"),
    ("bad-prefetch", "sample", ["--set", 'prefetch_noise="x"'], "prefetch_noise"),
    ("bad-residual", "distill", ["--set", 'distill.residual.model="x"'], "residual"),
    ("empty-eps-grid", "evaluate", ["--set", "evaluate.adversarial.fgsm_eps_grid=[]"], "fgsm_eps_grid"),
    ("float-seed", "sample", ["--set", "seed=1.5"], "seed"),
    ("bool-seed", "sample", ["--set", "seed=true"], "seed"),
    ("negative-threads", "sample", ["--set", "threads=-1"], "threads"),
    ("val-size-zero", "sample", ["--set", "data.val_size=0"], "val_size"),
    ("thin-zero", "sample", ["--set", "sgld.thin=0"], "thin"),
    ("bad-schedule", "sample", ["--set", 'sgld.schedule="warm"'], "schedule"),
    ("bad-compression", "sample", ["--set", 'sgld.compression="zip"'], "compression"),
    ("ood-dirs-not-table", "evaluate", ["--set", 'data.ood_dirs="x"'], "ood_dirs"),
    ("train-split-too-large", "sample", ["--set", "data.train_size=1700"], "digits has"),
    ("thin-keeps-no-sample", "sample", ["--set", "sgld.thin=5000"], "keep no sample"),
    ("iterations-1e18", "sample", ["--set", "sgld.iterations=1000000000000000000"], "No space left"),
    ("val-size-below-classes", "info", ["--set", "data.val_size=1"], "val_size"),
    ("one-network", "evaluate", ["--set", "evaluate.networks=1"], "networks"),
    ("prior-var-inf", "sample", ["--set", "sgld.prior_var=inf"], "prior_var"),
    ("weight-decay-inf", "sample", ["--set", "baselines.weight_decay=inf"], "weight_decay"),
]
for _id, _command, _extra, _has in BAD_CONFIG:
    @case(f"config-{_id}", "config", f"{_command} {' '.join(_extra)}", "exit 2, one line, unchanged")
    def _config_case(env: Env, command=_command, extra=_extra, has=_has) -> None:
        env.cli(command, *extra, has=has)


@case("config-invalid-toml", "config", "sample --config (invalid TOML)", "exit 2, one line, unchanged")
def _invalid_toml(env: Env) -> None:
    bad = env.base / "bad.toml"
    bad.write_text("name = \n[[[")
    env.cli("sample", config=bad, has="invalid TOML")


@case("config-not-utf8", "config", "sample --config (bytes that are not UTF-8)", "exit 2, one line, unchanged")
def _not_utf8(env: Env) -> None:
    bad = env.base / "bad.toml"
    bad.write_bytes(b"name = \"\xff\xfe\"\n")
    env.cli("sample", config=bad)


@case("config-is-directory", "config", "sample --config DIR", "exit 2, one line, unchanged")
def _config_dir(env: Env) -> None:
    env.cli("sample", config=env.base)


BAD_DATA = [
    ("mnist-no-dir", ["--set", 'data.dataset="mnist"'], {"APD_DATA_DIR": None}, "data-dir"),
    ("mnist-dir-missing", ["--set", 'data.dataset="mnist"', "--data-dir", "/nonexistent"], {}, "does not exist"),
    ("fashion-dir-missing", ["--set", 'data.dataset="fashion-mnist"', "--data-dir", "/nonexistent"], {},
     "does not exist"),
]
for _id, _extra, _env, _has in BAD_DATA:
    @case(f"data-{_id}", "data", f"sample {' '.join(_extra)}", "exit 2, one line, unchanged")
    def _data_case(env: Env, extra=_extra, environment=_env, has=_has) -> None:
        env.cli("sample", *extra, env=environment, has=has)


def _broken_idx(kind: str) -> Callable[[Path], None]:
    def make(directory: Path) -> None:
        fake_mnist(directory)
        images = directory / "train-images-idx3-ubyte.gz"
        raw = gzip.decompress(images.read_bytes())
        if kind == "magic":
            raw = b"\x01\x02" + raw[2:]
        elif kind == "header":
            raw = raw[:6]
        elif kind == "size":
            raw = raw[:-100]
        elif kind == "labels":
            labels = directory / "train-labels-idx1-ubyte.gz"
            write_idx(labels, np.arange(1000) % 10)
        elif kind == "missing":
            images.unlink()
            return
        images.write_bytes(gzip.compress(raw, mtime=0))
    return make


for _kind in ("magic", "header", "size", "labels", "missing"):
    @case(f"data-idx-{_kind}", "data", f"sample on MNIST IDX files with a bad {_kind}", "exit 2, one line, unchanged")
    def _idx_kind(env: Env, kind=_kind) -> None:
        directory = env.base / "mnist"
        _broken_idx(kind)(directory)
        env.cli("sample", "--set", 'data.dataset="mnist"', "--data-dir", str(directory))


@case("data-notmnist-empty", "data", "evaluate with an empty notMNIST OOD directory", "exit 2, one line, unchanged")
def _notmnist_empty(env: Env) -> None:
    (env.base / "nm").mkdir()
    env.cli("evaluate", "--force", "--set", 'data.ood=["gaussian","notmnist"]', "--set",
            f'data.ood_dirs={{notmnist="{env.base / "nm"}"}}')


@case("data-cifar-bad-records", "data", "evaluate with a CIFAR-10 batch of a wrong size", "exit 2, one line, unchanged")
def _cifar_bad(env: Env) -> None:
    (env.base / "cifar").mkdir()
    (env.base / "cifar" / "data_batch_1.bin").write_bytes(b"\0" * 3000)
    env.cli("evaluate", "--force", "--set", 'data.ood=["gaussian","cifar10"]', "--set",
            f'data.ood_dirs={{cifar10="{env.base / "cifar"}"}}')


for _command in ("sample", "distill", "evaluate", "report", "info"):
    @case(f"reuse-{_command}", "reuse", f"{_command} again on the complete set", "exit 0, every artifact unchanged")
    def _reuse(env: Env, command=_command) -> None:
        env.cli(command, rc=0, same=True)


for _command in ("evaluate", "report", "sample"):
    @case(f"quiet-{_command}", "reuse", f"{_command} --quiet on the complete set", "exit 0; prints nothing",
          issue=_command == "evaluate")
    def _quiet(env: Env, command=_command) -> None:
        proc = env.cli(command, rc=0)
        if proc.stdout or proc.stderr:
            env.fail(f"printed {len((proc.stdout + proc.stderr).splitlines())} lines with --quiet")


@case("info-names-leftovers", "reuse", "info with a shard, checkpoints and eval.partial left by interrupted runs",
      "exit 0; one line per stage naming its leftovers and the command that finishes it", issue=True)
def _info_leftovers(env: Env) -> None:
    for name in ("samples-0.partial.h5", "samples-0.ckpt.pt", "generator.ckpt.pt", "eval.partial/scores.h5"):
        env.path(name).parent.mkdir(exist_ok=True)
        env.path(name).write_bytes(b"")
    said = [line for line in env.cli("info", rc=0).stdout.splitlines() if line.startswith("interrupted ")]
    for stage in ("sample", "distill", "evaluate"):
        if sum(f"run `apd {stage} --config" in line for line in said) != 1:
            env.fail(f"no line names `apd {stage}`: {said}")


for _command in ("sample", "info"):
    @case(f"lock-is-a-directory-{_command}", "validate", f"{_command} with NAME/.lock a directory",
          "exit 2, one line naming the lock, unchanged", issue=_command == "sample")
    def _lock_dir(env: Env, command=_command) -> None:
        env.path(".lock").unlink(missing_ok=True)
        env.path(".lock").mkdir()
        env.cli(command, has=re.escape(str(env.path(".lock"))) + ": a directory")


@case("eval-is-a-symlink", "validate", "evaluate --force twice with NAME/eval a symbolic link to a folder elsewhere",
      "exit 2 both times, one line naming the link; the folder it points to unchanged", issue=True)
def _eval_symlink(env: Env) -> None:
    elsewhere = env.base / "elsewhere"
    elsewhere.mkdir()
    env.path("eval").rename(elsewhere / "eval")
    env.path("eval").symlink_to(elsewhere / "eval")
    before = snapshot(elsewhere)
    for _ in range(2):
        env.cli("evaluate", "--force", has="eval: a symbolic link")
    env.same(before, elsewhere)


@case("ascii-terminal-info", "reuse", "PYTHONIOENCODING=ascii python -m apd info (it prints ×)",
      "exit 0; the character escaped, nothing on stderr", issue=True)
def _ascii_info(env: Env) -> None:
    result = subprocess.run([sys.executable, "-m", "apd", *env.argv("info")], cwd=REPO, capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "ascii"}, timeout=600)
    if result.returncode or result.stderr or b"\\xd7" not in result.stdout:
        env.fail(f"exit {result.returncode}: {_last(result.stderr.decode(errors='replace'))}")


def _api_load(env: Env, method: str, device: str = "cpu") -> subprocess.CompletedProcess:
    """``apd.load(NAME's artifacts, method, device)`` in a fresh interpreter (no CUDA visible)."""
    code = f"import apd; apd.load({str(env.dir)!r}, {method!r}, device={device!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})


def _api_refuses(env: Env, result: subprocess.CompletedProcess, error: str, has: str) -> None:
    """The API call ended in ``error`` (its last line names it) saying ``has``."""
    last = _last(result.stderr)
    if result.returncode == 0 or not last.startswith(f"apd.errors.{error}: ") or not re.search(has, last):
        env.fail(f"exit {result.returncode}, want apd.errors.{error} /{has}/: {last}")


@case("api-swapped-generator", "validate", "apd.load(dir, 'apd') with generator.pt swapped for another",
      "ArtifactError: changed since it was made; nothing changed", issue=True)
def _api_swapped_generator(env: Env) -> None:
    generator = env.path("generator.pt")
    generator.write_bytes(generator.read_bytes()[::-1])
    before = snapshot(env.dir)
    _api_refuses(env, _api_load(env, "apd"), "ArtifactError", "generator.pt: changed since it was made")
    env.same(before)


@case("api-edited-store", "validate", "apd.load(dir, 'sgld') with a byte of samples.h5 changed",
      "ArtifactError: changed since it was made", issue=True)
def _api_edited_store(env: Env) -> None:
    store = env.path("samples.h5")
    with store.open("r+b") as file:
        file.seek(store.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0xFF]))
    _api_refuses(env, _api_load(env, "sgld"), "ArtifactError", "samples.h5: changed since it was made")


@case("api-cuda-without-cuda", "validate", "apd.load(dir, 'sgld', device='cuda') on a machine without CUDA",
      "ConfigError at the call, not at the first prediction", issue=True)
def _api_cuda(env: Env) -> None:
    _api_refuses(env, _api_load(env, "sgld", "cuda"), "ConfigError", "no CUDA device")


@case("api-baseline-without-sizes", "validate", "apd.load(dir, 'sgd') with sgd.json lacking its 'sizes'",
      "ArtifactError naming the manifest, not a KeyError", issue=True)
def _api_no_sizes(env: Env) -> None:
    manifest = env.path("baselines/sgd.json")
    record = json.loads(manifest.read_text())
    record.pop("sizes")
    manifest.write_text(json.dumps(record))
    _api_refuses(env, _api_load(env, "sgd"), "ArtifactError", "sgd.json: records the network")


@case("reuse-sample-then-resample-same", "reuse", "sample --force with the same config",
      "exit 0; samples equal the old ones, manifests hold")
def _resample_same(env: Env) -> None:
    env.cli("sample", "--force", rc=0, same=False)
    env.like_reference("base", RESULTS["sample"])


@case("partial-left-by-kill-is-not-complete", "reuse", "distill --force with only samples.partial.h5 (no store)",
      "exit 2 naming `apd sample`")
def _partial_only(env: Env) -> None:
    env.path("samples.h5").rename(env.path("samples.partial.h5"))
    env.path("samples.json").unlink()
    env.cli("distill", "--force", has="apd sample")


# ------------------------------------------------------------------------------------------- driver


class Harness:
    def __init__(self, work: Path, exec_mode: bool) -> None:
        self.work = work
        self.runner = Runner(exec_mode, work / "logs")
        self.config = work / "t.toml"
        self.config.write_text(CONFIG)
        self.golden = work / "golden"
        self._references: dict[str, Path] = {}

    def build(self) -> None:
        for command in ("sample", "distill", "evaluate"):
            proc = self.runner.start([command, "--config", str(self.config), "--artifacts", str(self.golden),
                                      "--quiet"])
            if proc.wait() != 0:
                raise SystemExit(f"building the complete set: {command} exit {proc.rc}: {proc.stderr}")
        self._references["base"] = self.golden / NAME

    def reference(self, variant: str) -> Path:
        """The artifacts after an uninterrupted run of ``VARIANTS[variant]`` on the complete set."""
        if variant not in self._references:
            root = self.work / "refs" / variant
            shutil.copytree(self.golden, root)
            command, extra = VARIANTS[variant]
            proc = self.runner.start([command, "--config", str(self.config), "--artifacts", str(root), "--quiet",
                                      *extra])
            if proc.wait() != 0:
                raise RuntimeError(f"reference {variant}: exit {proc.rc}: {_last(proc.stderr)}")
            self._references[variant] = root / NAME
        return self._references[variant]


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="apd-nothing-lost-"))
    try:
        yield path
    finally:
        if keep:
            print(f"work directory kept: {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)


@dataclass
class Outcome:
    case: Case
    status: str
    seconds: float
    problems: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the cases whose id matches this regular expression")
    parser.add_argument("--exec", action="store_true", help="run each command as a fresh `python -m apd`")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, help="write the run's record (counts per group, failures) as JSON here")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or re.search(args.only, c.id)]
    if args.list:
        for c in cases:
            print(f"{c.id:45s} {c.group:11s} {'issue' if c.issue else '':5s} {c.what}")
        return 0
    outcomes: list[Outcome] = []
    header = run_header()
    started = time.perf_counter()
    with workdir(args.keep) as work:
        harness = Harness(work, args.exec)
        harness.build()
        print(f"complete set built in {time.perf_counter() - started:.0f} s; {len(cases)} cases", flush=True)
        for c in cases:
            t0 = time.perf_counter()
            env = Env(harness, c.id)
            try:
                c.run(env)
                status = "FAIL" if env.problems else "pass"
            except Skip as exc:
                status, env.problems = "skip", [str(exc)]
            except Exception as exc:  # noqa: BLE001 (a broken case is a failure, not the end of the matrix)
                status = "FAIL"
                env.problems.append(f"case raised {type(exc).__name__}: {exc}")
            finally:
                env.close()
            outcome = Outcome(c, status, time.perf_counter() - t0, env.problems)
            outcomes.append(outcome)
            note = "; ".join(outcome.problems)[:400]
            print(f"{status:4s} {c.id:45s} {outcome.seconds:5.1f} s  {note}", flush=True)
    print()
    print("| # | case | group | issue | what | expected | result |")
    print("|---|---|---|---|---|---|---|")
    for i, o in enumerate(outcomes, 1):
        result = o.status if not o.problems else f"{o.status}: {'; '.join(o.problems)[:200]}"
        print(f"| {i} | {o.case.id} | {o.case.group} | {'yes' if o.case.issue else ''} | {o.case.what} | "
              f"{o.case.expected} | {result} |")
    counts = {s: sum(o.status == s for o in outcomes) for s in ("pass", "FAIL", "skip")}
    issue = [o for o in outcomes if o.case.issue]
    print(f"\n{len(outcomes)} cases ({len(issue)} from the issue's failures): {counts['pass']} passed, "
          f"{counts['FAIL']} failed, {counts['skip']} skipped; {time.perf_counter() - started:.0f} s"
          f"{' (each command a fresh python -m apd)' if args.exec else ''}")
    if args.out:
        write_record(args.out, header, outcomes, time.perf_counter() - started)
    return 1 if counts["FAIL"] else 0


def write_record(path: Path, header: dict, outcomes: list[Outcome], seconds: float) -> None:
    """The run as JSON: the command, commit and machine (:func:`record.run_header`), the wall clock, per
    group (in the matrix's order) the cases run, passed, failed and skipped, and each failed or skipped
    case with its reasons."""
    groups: dict[str, dict[str, int]] = {}
    for o in outcomes:
        counts = groups.setdefault(o.case.group, {"cases": 0, "passed": 0, "failed": 0, "skipped": 0})
        counts["cases"] += 1
        counts[{"pass": "passed", "FAIL": "failed", "skip": "skipped"}[o.status]] += 1
    record = {"script": Path(sys.argv[0]).name, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              **header, "seconds": round(seconds, 1), "groups": groups,
              "failed": {o.case.id: o.problems for o in outcomes if o.status == "FAIL"},
              "skipped": {o.case.id: o.problems for o in outcomes if o.status == "skip"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
