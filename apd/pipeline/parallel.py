"""Independent pieces of a stage on several processes of this machine: the baselines and peers of ``apd
sample``, the generator seeds of ``apd distill``.

:func:`split_work` deals the pieces round-robin (piece i to worker i mod P) and runs ``work(ctx, pieces)``
for each worker's share in a process started by :func:`~apd.pipeline.distributed.spawn` (tied to this
one, which keeps the artifact lock; a worker's error comes back as its one line). Each piece draws only from
its own named seed streams and writes only its own files, and each worker computes on the pipeline's
``threads`` (one per core when unset: the cores shared between the workers), so a piece's result does not
depend on how many workers share the work. One worker, or a CUDA device (processes on one card take turns
on it), runs the pieces here, in turn.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm import tqdm

from apd.errors import device_failures_are_errors
from apd.pipeline.distributed import spawn
from apd.pipeline.runtime import RunContext, setup_logging

log = logging.getLogger(__name__)


def worker_count(ctx: RunContext, pieces: int, workers: int) -> int:
    """Processes for ``pieces`` independent pieces with ``workers`` allowed: never more than the pieces, and
    one on a CUDA device."""
    return 1 if ctx.device.type == "cuda" else max(1, min(workers, pieces))


def split_work(ctx: RunContext, work: Callable[[RunContext, list], None], pieces: Sequence[Any], workers: int,
               what: str, command: str) -> None:
    """``work(ctx, share)`` for the shares of ``pieces`` dealt to :func:`worker_count` workers: here when
    that is one, else each in a process of its own (module docstring). ``work`` is a module-level function
    (it reaches the workers by name); ``what`` names the pieces in the log and in a dead worker's message;
    ``command`` is the ``apd`` command whose settings a worker's out-of-memory error names, as the command's
    own does (:func:`~apd.errors.device_failures_are_errors`)."""
    size = worker_count(ctx, len(pieces), workers)
    if size == 1:
        work(ctx, list(pieces))
        return
    shares = [list(pieces[rank::size]) for rank in range(size)]
    log.info("%s on %d workers: %s", what, size, "; ".join(_names(share) for share in shares))
    spawn(_worker, size, portable(ctx), command, work, shares,
          on_death=lambda rank, how: f"the worker of {what} {_names(shares[rank])} {how}; complete artifacts are "
                                     "unchanged: run the same command again to redo the rest")


def _names(share: list) -> str:
    """A worker's pieces as a log line names them: "2, 4", or "sgd then swag, ensemble" for pieces that are
    sequences of steps."""
    return ", ".join(" then ".join(map(str, piece)) if isinstance(piece, tuple) else str(piece) for piece in share)


def portable(ctx: RunContext) -> dict:
    """What a worker process needs to rebuild ``ctx`` (``RunContext(**portable(ctx))``)."""
    return {"cfg": ctx.cfg, "artifacts_root": ctx.artifacts_root, "data_dir": ctx.data_dir,
            "device_name": ctx.device_name, "force": ctx.force, "quiet": ctx.quiet}


def worker_context(rank: int, size: int, context: dict, threads: int) -> RunContext:
    """A spawned worker's set-up: its log lines prefixed with its rank, ``threads`` torch threads, and the
    run's context rebuilt from :func:`portable`'s ``context``."""
    # tqdm's default lock is a multiprocessing semaphore, which a killed worker would leave to the resource
    # tracker's "leaked semaphore" complaint; the workers share no bar, so a thread lock does
    tqdm.set_lock(threading.RLock())
    setup_logging(context["quiet"], prefix=f"worker {rank}/{size}: ")
    torch.set_num_threads(threads)
    return RunContext(**context)


def _worker(rank: int, size: int, init_method: str, context: dict, command: str,
            work: Callable[[RunContext, list], None], shares: list[list]) -> None:
    """One worker of :func:`split_work`: its share on the pipeline's threads (or its part of the cores)."""
    del init_method  # the pieces exchange nothing
    threads = context["cfg"].threads or max(1, (os.cpu_count() or 1) // size)
    ctx = worker_context(rank, size, context, threads)
    with device_failures_are_errors(command, ctx.device):
        work(ctx, shares[rank])
