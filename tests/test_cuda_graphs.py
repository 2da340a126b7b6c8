"""RecordedStep's call sequence, on a CUDA that torch.cuda is made to pretend (its streams, graphs and recording
are stand-ins; the CUDA-marked tests of the chains, the GANs and SGD run real recordings on a card): warm-up
calls run the step, the next call records and replays it, later calls only replay; a refused recording falls
back to the step as usual; and the recording's owner goes without a garbage collection."""

from __future__ import annotations

import contextlib
import gc
import logging
import weakref
from collections.abc import Callable, Iterator

import pytest
import torch

from apd.cuda_graphs import RecordedStep


class Stream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other: Stream) -> None:
        pass


class PretendCUDA:
    """What RecordedStep asks of torch.cuda, with a "recording" that keeps the kernels a step launches (the
    step asks :meth:`launch`) and a replay that runs them, as a CUDA graph does."""

    def __init__(self) -> None:
        self.refuse, self.recording, self.current = False, None, Stream("default")

    def launch(self, kernel: Callable[[], None]) -> None:
        """A kernel launched by a step: run now, or kept by the graph being recorded."""
        if self.recording is None:
            kernel()
        else:
            self.recording.kernels.append(kernel)

    @contextlib.contextmanager
    def graph(self, graph: Graph, stream: Stream, capture_error_mode: str) -> Iterator[None]:
        assert capture_error_mode == "thread_local"
        self.current = stream  # as torch.cuda.graph does, and leaves it so when the capture is refused
        if self.refuse:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        self.recording = graph
        try:
            yield
        finally:
            self.recording = None


class Graph:
    def __init__(self) -> None:
        self.kernels, self.generators = [], []

    def register_generator_state(self, generator: torch.Generator) -> None:
        self.generators.append(generator)

    def replay(self) -> None:
        for kernel in self.kernels:
            kernel()


@pytest.fixture
def cuda(monkeypatch) -> PretendCUDA:
    pretend = PretendCUDA()
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream(f"side on {device}"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: pretend.current)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: setattr(pretend, "current", stream))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", pretend.graph)
    return pretend


class Counter:
    """A step's owner, as the chains, the GAN trainer and SGD are: it holds its recording and calls it with
    its own bound method, which launches one kernel adding one to its total."""

    def __init__(self, cuda: PretendCUDA, warmup: int = 3) -> None:
        self.cuda, self.total, self.entered = cuda, torch.zeros(()), 0
        self.recording = RecordedStep("counting", torch.device("cuda:0"), warmup=warmup)

    def _step(self) -> torch.Tensor:
        self.entered += 1
        total = self.total  # what a kernel holds: the tensor, not its owner
        self.cuda.launch(lambda: total.add_(1))
        return total

    def __call__(self) -> torch.Tensor:
        return self.recording(self._step)


def test_warm_up_calls_run_the_step_the_next_records_it_and_later_calls_replay_it(cuda):
    """Every call is one real step (ten calls: a total of ten), but the step's Python runs only at the three
    warm-up calls and the recording; each replay returns the recorded call's output."""
    counter = Counter(cuda)
    outputs = [counter() for _ in range(10)]
    assert float(counter.total) == 10 and counter.entered == 4 and counter.recording.recorded
    assert all(output is counter.total for output in outputs)


def test_a_refused_recording_warns_once_and_the_step_runs_as_usual(cuda, caplog):
    """A recording the runtime refuses: one warning naming the step, the caller's stream current again (a
    refused capture leaves its own current), and every call, that one included, a step run as usual."""
    cuda.refuse = True
    counter = Counter(cuda)
    default = cuda.current
    with caplog.at_level(logging.WARNING, logger="apd.cuda_graphs"):
        for _ in range(10):
            counter()
    assert float(counter.total) == 10 and counter.entered == 10 and not counter.recording.recorded
    assert cuda.current is default
    assert [record.getMessage() for record in caplog.records] == [
        "counting steps without a CUDA graph: recording failed (CUDA error: operation not permitted when stream "
        "is capturing)"]


def test_the_recording_goes_with_its_owner_without_a_garbage_collection(cuda):
    """The owner holds its recording and the recording does not hold the owner (it is given the step at each
    call), so dropping the owner frees the recording, its graph and (on a card) the graph's memory pool at once."""
    counter = Counter(cuda)
    for _ in range(5):
        counter()
    owner, recording = weakref.ref(counter), weakref.ref(counter.recording)
    gc.disable()
    try:
        del counter
        assert owner() is None and recording() is None
    finally:
        gc.enable()
