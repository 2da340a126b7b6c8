"""A sampling worker started by :func:`apd.pipeline.distributed.spawn`: ``python -m apd.pipeline.spawned
PARENT_PID TASK RANK``.

This module imports only the standard library and apd's light modules, so its first lines run some tens of
milliseconds after the process starts, before torch is imported (about 3 s on a CPU). There it

1. **dies with its parent**: on Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` has the kernel kill the worker
   when the parent dies, however it dies (SIGKILL included); then it checks that the parent is still
   ``PARENT_PID``, since one that died before that call left the worker orphaned already. Elsewhere a thread
   polls the parent. So a worker never outlives the process that holds the artifact lock, and never
   publishes without it;
2. **ignores Ctrl-C**: the parent decides, and stops the workers with SIGTERM (the workers run in a process
   group of their own, so a Ctrl-C at the terminal reaches the parent alone). A SIGTERM before the work
   starts ends the worker silently; during the work it stops at once, quietly, leaving what a kill leaves
   (resumable shards and checkpoints), and a publication under way completes first
   (:func:`apd.interrupts.interrupts_deferred`);
3. prints the stack of each of its threads to stderr on SIGUSR1 (``kill -USR1 PID``: where a worker that
   seems stuck is);
4. loads its task (the pickled worker function and arguments, written by the parent into its private
   temporary folder), runs it and leaves with :func:`os._exit`, past the interpreter's teardown: a finished
   worker was once aborted there ("terminate called without an active exception", SIGABRT), and a signal
   there printed tracebacks from exit handlers. A user error goes to the parent as ``FOLDER/RANK.json``
   (``[kind, message]``, exit code 2) and so does any other exception (``["traceback", text]``, exit 1).
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from apd.errors import ApdError
from apd.interrupts import exit_code, interrupted, noting_interrupts

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_SECONDS = 0.5


def die_with_parent(parent: int) -> None:
    """Have this process end when ``parent`` does (module docstring, 1.); it exits at once when ``parent``
    is gone already."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    else:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def run(rank: int, task: Path) -> int:
    """Run the task in ``task`` as worker ``rank``; its exit code (module docstring, 4.)."""
    worker, size, init_method, args = pickle.loads(task.read_bytes())
    with noting_interrupts():  # SIGTERM stops the work; a Ctrl-C swallowed in a destructor stops it too
        try:
            worker(rank, size, init_method, *args)
            return 0
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) or interrupted():
                return exit_code()
            if isinstance(exc, ApdError):
                report, code = [type(exc).__name__, str(exc)], 2
            else:
                report, code = ["traceback", "".join(traceback.format_exception(exc))], 1
            (task.parent / f"{rank}.json").write_text(json.dumps(report))
            return code


def main() -> None:
    parent, task, rank = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    code = run(rank, task)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
