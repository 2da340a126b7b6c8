"""Parts of a stage's or a study's work that an interrupted run finished, kept so that the next run takes them
instead of doing them again (``apd evaluate``'s kept-sample sets, the longest part of its yardstick; the
frontier's kept sets, trainings and ceilings; a row of the precision or distillers study).

A folder holds one JSON file per finished part and ``key.json``: what the parts were made under (the stage's
config hash, the digests of its inputs, apd's version, the machine and its thread count). A run under any
other key, or one told to start over (``--force``), empties the folder first, so a part is taken only by a run
that would have made it the same. Each part is written atomically and names itself inside its file; a file
that cannot be read, or names another part, is made again. A part drawn from a random stream records where
it left the stream, and taking it puts the stream there, so parts that share a stream can be taken or made in
turn. Parts are JSON, never pickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from apd._version import __version__
from apd.io import remove_tree, write_json_atomic, write_text_atomic
from apd.pipeline.runtime import RunContext, machine

log = logging.getLogger(__name__)

KEY_FILE = "key.json"


def _as_json(value: Any) -> Any:
    """``value`` as JSON gives it back (what a later run reads): tuples as lists, every dict's keys in their
    order (an order sums over a dict's values follow)."""
    return json.loads(json.dumps(value))


class FinishedParts:
    """The parts finished under ``key`` (a JSON object) in ``folder``; with ``start_over``, none."""

    def __init__(self, folder: Path, key: dict, start_over: bool = False) -> None:
        self.folder, self.key = folder, _as_json(key)
        if start_over or self._recorded_key() != self.key:
            remove_tree(folder)
            write_json_atomic(folder / KEY_FILE, self.key)

    def _recorded_key(self) -> Any:
        try:
            return json.loads((self.folder / KEY_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _path(self, name: str) -> Path:
        return self.folder / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"

    def get(self, name: str, stream: torch.Generator | None = None) -> Any | None:
        """The part ``name`` as a run under this key finished it, ``stream`` set where making it left it; None
        (``stream`` untouched) where none did."""
        try:
            found = json.loads(self._path(name).read_text())
            if found["name"] != name:
                return None
            state = None if stream is None else torch.tensor(list(bytes.fromhex(found["stream"])), dtype=torch.uint8)
            value = found["value"]
        except (OSError, ValueError, KeyError, TypeError):  # none, cut short, or not one of these files
            return None
        if state is not None:
            stream.set_state(state)
        return value

    def put(self, name: str, value: Any, stream: torch.Generator | None = None) -> Any:
        """Keep ``value`` as the finished part ``name``, and where ``stream`` (which made it) was left; returns
        ``value`` as :meth:`get` will (:func:`_as_json`), so that a run that made a part and one that took it
        go on from the same value."""
        where = {} if stream is None else {"stream": bytes(stream.get_state().tolist()).hex()}
        write_text_atomic(self._path(name), json.dumps({"name": name, "value": value, **where}))
        return _as_json(value)

    def remove(self) -> None:
        """The stage is complete: nothing is left to take."""
        remove_tree(self.folder)


def run_parts(ctx: RunContext, folder: Path, key: dict) -> FinishedParts:
    """The parts in ``folder`` that an interrupted run of ``ctx``'s command finished under ``key`` (what the
    work depends on) on this apd version and this machine at its thread count; none with ``--force``."""
    return FinishedParts(folder, {**key, "version": __version__, "machine": machine(ctx.device)},
                         start_over=ctx.force)


def taken_or_made(finished: FinishedParts | None, name: str, make: Callable[[], Any],
                  stream: torch.Generator | None = None) -> Any:
    """The part ``name`` that ``finished`` holds (``stream`` set where making it left it), else ``make()``, kept
    there as finished (:meth:`FinishedParts.put`); without ``finished``, ``make()``."""
    taken = None if finished is None else finished.get(name, stream)
    if taken is not None:
        log.info("%s: taken from an interrupted run", name)
        return taken
    made = make()
    return made if finished is None else finished.put(name, made, stream)
