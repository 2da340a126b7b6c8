"""Workers of ``apd sample``: processes of one ``torch.distributed`` group, each running its own chains.

Two ways in, the same group afterwards:

- **One machine** (``sgld.workers`` > 1, no launcher): :func:`spawn` starts the workers as fresh Python
  processes (:mod:`apd.pipeline.spawned`: each dies with its parent and leaves Ctrl-C to it) and joins them
  through a file in its private temporary folder.
- **Several machines**: ``torchrun`` starts the same ``apd sample`` command on every node and sets
  ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`torchrun_env` reads
  them and the group forms through ``env://``.

The group carries little: each worker's report at the end (:meth:`Group.gather`), a sum of the workers'
monitoring tensors (a few kB), rank 0's outcome and a barrier; samples go to each worker's own file. So
the backend is gloo on every device, over TCP: it needs no GPU per rank, where NCCL refuses two ranks on one
card ("Duplicate GPU detected"), and its messages cost nothing beside the sampling. A worker on CUDA samples
on GPU ``LOCAL_RANK mod count``. A worker waits for the others to join for :func:`join_timeout` (the
environment variable ``APD_JOIN_TIMEOUT``, in seconds; 300 by default), saying so, and gives up with one
line after it (torchrun variables set without the other workers started). Its collectives wait up to
:data:`TIMEOUT`, since a worker with fewer chains waits at the gather for the others to finish sampling (a
worker that dies is noticed by the launcher, which stops the rest).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from apd import errors
from apd.errors import ApdError, ArtifactError, ConfigError
from apd.interrupts import interrupts_deferred, raise_if_interrupted

log = logging.getLogger(__name__)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT = datetime.timedelta(days=30)
JOIN_TIMEOUT_VARIABLE, JOIN_TIMEOUT_DEFAULT = "APD_JOIN_TIMEOUT", 300.0
POLL_SECONDS = 0.05  # how often spawn looks at its workers
STOP_GRACE = 10.0  # seconds a worker has to stop after SIGTERM before it is killed
TASK_FOLDER_PREFIX = "apd-workers-"  # spawn's temporary folders, in the system's temporary directory


def join_timeout() -> float:
    """Seconds a worker waits for the others to join: ``APD_JOIN_TIMEOUT``, or 300; a value that is not a
    positive number is a :class:`ConfigError`."""
    text = os.environ.get(JOIN_TIMEOUT_VARIABLE, "")
    if not text:
        return JOIN_TIMEOUT_DEFAULT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"{JOIN_TIMEOUT_VARIABLE}={text!r}: expected a positive number of seconds")
    return seconds


@dataclass(frozen=True)
class WorkerEnv:
    """Where this process stands in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int


def torchrun_env() -> WorkerEnv | None:
    """This process's place in a ``torchrun`` launch, or None when its variables are not all set."""
    if not all(name in os.environ for name in TORCHRUN_VARIABLES):
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return WorkerEnv(rank, world, int(os.environ.get("LOCAL_RANK", rank)))


def worker_device(device: torch.device, local_rank: int) -> torch.device:
    """The device of worker ``local_rank`` on its machine: its own GPU (round robin) on CUDA."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", local_rank % torch.cuda.device_count())


@dataclass(frozen=True)
class Group:
    """The workers' process group as seen from one worker (``size`` 1: no group, every call local); its
    collectives run in ``handle``, a group of the same workers that waits up to :data:`TIMEOUT`."""

    rank: int
    size: int
    handle: Any = None

    def gather(self, obj: Any) -> list[Any]:
        """Every worker's ``obj`` (picklable), in rank order, on every worker."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.handle)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every worker."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.handle)
        return box[0]

    def barrier(self) -> None:
        """Wait until every worker reaches this call."""
        if self.size > 1:
            dist.barrier(group=self.handle)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of every worker's ``tensor`` (same shape everywhere)."""
        if self.size == 1:
            return tensor
        total = tensor.cpu().clone()
        dist.all_reduce(total, group=self.handle)
        return total.to(tensor.device)


@contextlib.contextmanager
def process_group(rank: int, size: int, device: torch.device, init_method: str = "env://") -> Iterator[Group]:
    """Join the group (gloo, module docstring) for the ``with`` block; ``size`` 1 forms none. Workers that do
    not all join within :func:`join_timeout` are a :class:`ConfigError` naming where they were awaited."""
    if size == 1:
        yield Group(0, 1)
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    seconds = join_timeout()
    where = (f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}" if init_method == "env://"
             else init_method)
    if init_method == "env://":  # a torchrun launch, whose peers may be slow to come; spawned ones join at once
        log.info("worker %d/%d: waiting up to %g s for the other workers to join at %s (%s sets the seconds)", rank,
                 size, seconds, where, JOIN_TIMEOUT_VARIABLE)
    try:
        with _native_stderr_dropped():  # c10d's own lines on each failed try to connect
            dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=seconds))
    except dist.DistError:
        raise ConfigError(f"worker {rank} of {size}: the other workers did not join at {where} within {seconds:g} s "
                          f"({JOIN_TIMEOUT_VARIABLE}); start all of them (torchrun), or unset RANK and WORLD_SIZE "
                          "to sample without torchrun") from None
    try:
        yield Group(rank, size, dist.new_group(backend="gloo", timeout=TIMEOUT))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _native_stderr_dropped() -> Iterator[None]:
    """Whatever native code writes to file descriptor 2 in the block is dropped (Python's own ``sys.stderr``
    is flushed first)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def spawn(worker: Callable[..., None], nprocs: int, *args: Any, on_death: Callable[[int, str], str]) -> None:
    """Run ``worker(rank, size, init_method, *args)`` in ``nprocs`` fresh processes on this machine and wait.

    Each is a ``python -m apd.pipeline.spawned`` (which ties it to this process before anything else and
    ignores Ctrl-C) in a process group of its own; the task goes to them pickled, in a private temporary
    folder (:func:`task_folder`). A worker's :class:`~apd.errors.ApdError` comes back as the same error (its
    one line); a worker that dies (a signal, or an exit without an error) stops the others and becomes an
    :class:`ArtifactError` with ``on_death(rank, how)``'s sentence. Any other exception in a worker comes back
    as a ``RuntimeError`` with its traceback. However this call ends (a Ctrl-C, SIGTERM, a failed worker), no
    worker is left running when it returns (:func:`_stop`): the caller still holds the artifact lock then.
    """
    # the workers import this checkout's apd, wherever the parent found it
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    with task_folder() as folder:
        # they meet at a file of the folder: no port to choose, which another process could take before the
        # first worker listens on it (gloo binds the ports it sends on itself)
        init_method = f"file://{folder / 'rendezvous'}"
        task = folder / "task.pickle"
        task.write_bytes(pickle.dumps((worker, nprocs, init_method, args)))
        command = [sys.executable, "-m", "apd.pipeline.spawned", str(os.getpid()), str(task)]
        processes: list[subprocess.Popen] = []
        try:
            for rank in range(nprocs):
                with interrupts_deferred():  # a Ctrl-C cannot leave a started worker unrecorded
                    processes.append(subprocess.Popen([*command, str(rank)], stdin=subprocess.DEVNULL, env=env,
                                                      process_group=0))
            failed = _first_failure(processes)
        finally:
            with interrupts_deferred():
                _stop(processes)
        if failed is not None:
            raise _failure(failed, processes[failed].returncode, folder, on_death)


@contextlib.contextmanager
def task_folder(root: Path | None = None) -> Iterator[Path]:
    """A private temporary folder under ``root`` (the system's temporary directory) for one :func:`spawn`: its
    task and its workers' error reports, removed when the block ends. The folder's ``.lock`` is held (an
    ``fcntl`` lock, which the kernel drops when its holder exits) for as long as the block runs, so a folder
    whose lock nobody holds is one a parent killed before it could remove it left behind (SIGKILL, the
    out-of-memory killer): such folders are removed first (:func:`remove_orphaned_task_folders`)."""
    root = Path(tempfile.gettempdir()) if root is None else root
    remove_orphaned_task_folders(root)
    folder, fd = Path(tempfile.mkdtemp(prefix=TASK_FOLDER_PREFIX, dir=root)), None
    try:
        # locked under another name, then renamed: a ``.lock`` is held from the moment it exists
        fd = os.open(folder / ".lock-new", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(folder / ".lock-new", folder / ".lock")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # before the lock goes: no other spawn removes it meanwhile
        if fd is not None:
            os.close(fd)


def remove_orphaned_task_folders(root: Path) -> list[Path]:
    """Remove the :func:`task_folder` folders under ``root`` whose ``.lock`` nobody holds; returns them.
    Folders of running spawns (their lock held), of other users (unreadable) and without a lock are left."""
    removed = []
    for folder in root.glob(f"{TASK_FOLDER_PREFIX}*"):
        try:
            fd = os.open(folder / ".lock", os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: that spawn is running
            os.close(fd)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        removed.append(folder)
    return removed


def _first_failure(processes: list[subprocess.Popen]) -> int | None:
    """Wait until every worker has exited 0 (None) or one has failed (its rank). A Ctrl-C or SIGTERM raises
    here, in the sleep, or at the safe point each round."""
    while True:
        raise_if_interrupted()
        codes = [process.poll() for process in processes]
        failed = next((rank for rank, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None or all(code == 0 for code in codes):
            return failed
        time.sleep(POLL_SECONDS)


def _failure(rank: int, code: int, folder: Path, on_death: Callable[[int, str], str]) -> Exception:
    """The error of a failed worker: the first error a worker reported (``FOLDER/RANK.json``, written by
    :func:`apd.pipeline.spawned.run`), else ``rank``'s death."""
    reported = sorted(folder.glob("*.json"))
    if reported:
        kind, message = json.loads(reported[0].read_text())
        if kind == "traceback":
            return RuntimeError(f"worker {reported[0].stem} failed:\n{message}")
        return getattr(errors, kind, ApdError)(message)
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return ArtifactError(on_death(rank, how))


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to every worker still running, then wait for them all: each stops at once, and a publication
    under way completes (:mod:`apd.pipeline.spawned`). One still running after :data:`STOP_GRACE` seconds
    (blocked in native code: a collective whose peer is gone, a join) is killed, which is safe there."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
