"""Ctrl-C that is never lost.

SIGINT makes Python raise ``KeyboardInterrupt`` wherever the main thread is. Where that is a weakref
callback or a ``__del__`` (a garbage collection can run one at any moment), the exception cannot reach
the caller: the interpreter prints "Exception ignored in ..." with a traceback and the run carries on,
and it would go on to publish its artifacts as if no Ctrl-C had come. So :func:`noting_interrupts`
records every Ctrl-C and hides that lost traceback, and :func:`raise_if_interrupted` raises the
interrupt again at the next safe point: each step of a progress bar, before an artifact is published,
and when the command returns.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

_noted = threading.Event()


def interrupted() -> bool:
    """Whether Ctrl-C came during the current :func:`noting_interrupts` block."""
    return _noted.is_set()


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if Ctrl-C came, even where the first one was swallowed; a safe point
    to stop at."""
    if _noted.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def noting_interrupts() -> Iterator[None]:
    """Within the block, Ctrl-C raises ``KeyboardInterrupt`` as usual and is also noted, so that
    :func:`raise_if_interrupted` raises it again where it was swallowed, and the traceback of a
    swallowed one is not printed. Only the main thread can install a signal handler; elsewhere the block
    changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _noted.clear()

    def interrupt(signum, frame):
        _noted.set()
        raise KeyboardInterrupt

    def hide_swallowed_interrupt(unraisable):
        if not (_noted.is_set() and issubclass(unraisable.exc_type, KeyboardInterrupt)):
            previous_hook(unraisable)

    previous_hook, sys.unraisablehook = sys.unraisablehook, hide_swallowed_interrupt
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        sys.unraisablehook = previous_hook
        _noted.clear()
