"""What every stage needs besides the config: device, paths, data, progress bars, logging."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from tqdm import tqdm

from apd.config import DEVICE_PATTERN, PipelineConfig
from apd.data import Dataset, load_dataset
from apd.errors import ConfigError
from apd.interrupts import raise_if_interrupted
from apd.nets import network
from apd.pipeline import seeds
from apd.pipeline.kernels import cpu_kernels
from apd.pipeline.layout import Layout

log = logging.getLogger("apd")
T = TypeVar("T")


class InterruptibleBar(tqdm):
    """A tqdm bar, shown or not, whose every step raises a Ctrl-C that was swallowed before it
    (:func:`apd.interrupts.raise_if_interrupted`), so that a long loop stops there."""

    def __iter__(self):
        for item in super().__iter__():
            raise_if_interrupted()
            yield item

    def update(self, n: float = 1) -> bool | None:
        raise_if_interrupted()
        return super().update(n)


@contextlib.contextmanager
def stopwatch(timing: dict[str, float], name: str) -> Iterator[None]:
    """``with stopwatch(timing, name):`` adds the block's wall-clock seconds (2 decimals) to ``timing[name]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = round(timing.get(name, 0.0) + time.perf_counter() - started, 2)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """``with torch_threads(n):`` runs the block on n torch CPU threads (0: as it is) and restores the count."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def resolve_device(name: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cpu``, ``cuda`` or ``cuda:N`` as asked. Any other name,
    or a CUDA device that is not there, is a config error."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ConfigError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} requested but no CUDA device is available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def make_current(device: torch.device) -> None:
    """Make a CUDA card named by its number (``cuda:N``) the process's current device, so that what a command
    makes without naming a device (a CUDA stream, a Triton kernel's launch) is made on it; the CPU and plain
    ``cuda`` (the current card) change nothing."""
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


@dataclass
class RunContext:
    """One invocation of a stage: the config plus command-line choices."""

    cfg: PipelineConfig
    artifacts_root: Path = Path("artifacts")
    data_dir: str | None = None
    device_name: str | None = None
    force: bool = False
    quiet: bool = False
    _data: Dataset | None = field(default=None, repr=False)
    _once: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.device  # noqa: B018 (a bad device name fails here, before any stage work or reuse)

    @functools.cached_property
    def device(self) -> torch.device:
        return resolve_device(self.device_name or self.cfg.device)

    @property
    def out_dir(self) -> Path:
        return self.artifacts_root / self.cfg.name

    @property
    def layout(self) -> Layout:
        """Every artifact path of this pipeline."""
        return Layout(self.out_dir)

    def seed(self, *names: str | int) -> int:
        """The seed of the named random stream (:mod:`apd.pipeline.seeds`)."""
        return seeds.seed(self.cfg.seed, *names)

    def once(self, key: tuple, make: Callable[[], T]) -> T:
        """``make()``, computed once per run for ``key``: what several parts of a stage prepare alike (the
        samples' alignment, which the generators, the MoG and the mode mixture are all fit to)."""
        if key not in self._once:
            self._once[key] = make()
        return self._once[key]

    @property
    def net_sizes(self) -> list[int]:
        """Layer sizes of the target MLP: ``[features, *hidden, classes]``."""
        return [self.data.num_features, *self.cfg.net.hidden, self.data.num_classes]

    def network(self, dropout: float = 0.0) -> nn.Sequential:
        """A fresh target network (:func:`apd.nets.network` of :attr:`net_sizes` and ``net.conv``)."""
        try:
            return network(self.net_sizes, self.cfg.net.conv, dropout)
        except ValueError as exc:
            raise ConfigError(f"{self.cfg.source}: 'net.conv' does not fit {self.data.name}'s images: {exc}") from None

    @property
    def net_record(self) -> dict:
        """The target network as a manifest records it (:func:`apd.api.load` checks a baseline's record against it)."""
        return {"sizes": self.net_sizes, "conv": list(self.cfg.net.conv)}

    @property
    def data(self) -> Dataset:
        """The dataset, loaded once per run (on the CPU; stages move what they need)."""
        if self._data is None:
            self._data = load_dataset(self.cfg.data, self.cfg.seed, self.data_dir)
        return self._data

    def progress(self, iterable: Iterable | None = None, **kwargs) -> tqdm:
        """A tqdm bar, shown only on a terminal and without ``--quiet``; each step is a safe point for
        Ctrl-C (:class:`InterruptibleBar`)."""
        disable = self.quiet or not sys.stderr.isatty()
        return InterruptibleBar(iterable, disable=disable, dynamic_ncols=True, leave=False, **kwargs)

    @staticmethod
    def show(bar: tqdm, where: str, **postfix: object) -> None:
        """Show figures on the bar, or log them as a line when the bar is hidden (not a terminal)."""
        if bar.disable:
            log.info("%s: %s", where, ", ".join(f"{key} {value}" for key, value in postfix.items()))
        else:
            bar.set_postfix(**postfix)


def machine(device: torch.device) -> dict[str, object]:
    """What a result was measured on: CPU model, cores, torch threads, torch version, the CPU kernels MKL and
    OpenBLAS take (:func:`~apd.pipeline.kernels.cpu_kernels`), device (and its name)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, object] = {"cpu": model, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                               "torch": torch.__version__, "kernels": cpu_kernels(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def setup_logging(quiet: bool, prefix: str = "") -> None:
    """Our messages (the ``apd`` loggers) on stderr from INFO, or from WARNING when ``quiet``; other
    libraries' records only from WARNING up (laplace-torch logs a note at INFO when it is imported)."""
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format=f"{prefix}%(message)s",
                        stream=sys.stderr, force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_ours_or_warnings)


def _ours_or_warnings(record: logging.LogRecord) -> bool:
    return record.name == "apd" or record.name.startswith("apd.") or record.levelno >= logging.WARNING
