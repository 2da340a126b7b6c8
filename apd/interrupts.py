"""Ctrl-C (and SIGTERM) that is never lost and stops a run once.

SIGINT makes Python raise ``KeyboardInterrupt`` wherever the main thread is. Where that is a weakref
callback or a ``__del__`` (a garbage collection can run one at any moment), the exception cannot reach
the caller: the interpreter prints "Exception ignored in ..." with a traceback and the run carries on,
and it would go on to publish its artifacts as if no Ctrl-C had come. So :func:`noting_interrupts`
records every Ctrl-C and hides that lost traceback, and :func:`raise_if_interrupted` raises the
interrupt again at the next safe point: each step of a progress bar, before an artifact is published,
and when the command returns.

SIGTERM takes the same path (its exit code is 143 where Ctrl-C's is 130: :func:`exit_code`). Only the
first signal raises: one that comes while the first unwinds (``timeout`` signals the process and then
its whole group, a user presses Ctrl-C twice) is noted and nothing more, so the clean-up that runs in
``finally`` blocks (stopping workers, closing files) is never cut short and nothing prints a second
traceback. :func:`interrupts_deferred` holds the raise back through a few steps that must happen together
(swapping files in under their manifest, starting a process and recording it).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state = {"signal": 0, "deferred": 0}  # the first signal noted (0: none); depth of interrupts_deferred


def interrupted() -> int:
    """The signal that interrupted the current :func:`noting_interrupts` block (SIGINT or SIGTERM), or 0."""
    return _state["signal"]


def exit_code() -> int:
    """The exit code of a process stopped by the noted signal: 128 + its number (130 for Ctrl-C, 143 for
    SIGTERM); 130 for a ``KeyboardInterrupt`` that no signal raised."""
    return 128 + (_state["signal"] or signal.SIGINT)


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if a signal came, even where the first one was swallowed; a safe point
    to stop at."""
    if _state["signal"]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Within the block a signal is only noted; it raises when the block ends. For steps that must not be
    split (files swapped in under one manifest, a child process started and recorded)."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1
    raise_if_interrupted()


@contextlib.contextmanager
def noting_interrupts() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise ``KeyboardInterrupt`` (the first of them only, outside
    :func:`interrupts_deferred`) and are noted, so that :func:`raise_if_interrupted` raises it again where it
    was swallowed, and the traceback of a swallowed one is not printed. Only the main thread can install a
    signal handler; elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["signal"] = 0

    def interrupt(signum, frame):
        first = not _state["signal"]
        _state["signal"] = _state["signal"] or signum
        if first and not _state["deferred"]:
            raise KeyboardInterrupt

    def hide_swallowed_interrupt(unraisable):
        if not (_state["signal"] and issubclass(unraisable.exc_type, KeyboardInterrupt)):
            previous_hook(unraisable)

    previous_hook, sys.unraisablehook = sys.unraisablehook, hide_swallowed_interrupt
    previous = {signum: signal.signal(signum, interrupt) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is None:  # one installed outside Python: Python's own for Ctrl-C
                handler = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, handler)
        sys.unraisablehook = previous_hook
        _state["signal"] = 0


def ignore_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on: for a process that is leaving, so that a late one cannot cut
    its exit handlers short (torch's print "Exception ignored in atexit callback" and a traceback)."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
