"""A training step of small networks run as a CUDA graph (:class:`RecordedStep`): on a GPU such a step is a
few dozen to a few hundred short kernels, and launching them one by one from Python costs more than running
them; a recorded graph launches them all in one call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import torch

log = logging.getLogger(__name__)

Output = TypeVar("Output")


class RecordedStep(Generic[Output]):
    """A step — a function of tensors on the CUDA ``device`` that reads its inputs from tensors filled before
    each call and has no effect but on tensors — run as a CUDA graph. Each call is given the step (the same
    one every time: a replay runs what was recorded), rather than the step being kept from construction, so
    that its owner (whose bound method it usually is) holding this object makes no reference cycle: the
    graph and its memory pool go when the owner does, not at some later garbage collection.

    Its first ``warmup`` calls run as usual, on a side stream of its own, so that cuBLAS, autograd and the
    optimisers set up their workspaces and state for that stream, as recording requires. The next call
    records it as a graph on that stream and replays it; every later call replays it, and returns the
    recorded call's outputs: the same tensors each time, holding the new values (copy what must outlive the
    next call). Each call, warm-up or replay, is one real step: a replay runs the kernels the recorded call
    would have run, on what the inputs hold now. ``generators`` are the step's own ``torch.Generator`` s on
    the device: a replay draws from each what that call would have drawn, and leaves each where that call
    would. A recording the CUDA runtime refuses logs one warning naming ``what``, and the step then runs
    as usual at every call.

    The recording forbids unsafe CUDA calls (an allocation, a synchronisation) on the recording thread only
    (capture mode "thread_local"): a thread that copies the next epoch's minibatch orders to the card
    (:class:`apd.data.MinibatchOrders`) may allocate while a step is recorded, which the default mode
    would count as an error of the recording.
    """

    def __init__(self, what: str, device: torch.device, warmup: int = 3,
                 generators: Sequence[torch.Generator] = ()) -> None:
        self.what, self.warmup, self.generators = what, warmup, list(generators)
        self.device = torch.device(device)
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.output: Output | None = None
        self.side = torch.cuda.Stream(self.device)

    @property
    def recorded(self) -> bool:
        return self.graph is not None

    def __call__(self, step: Callable[[], Output]) -> Output:
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return self.output
        if self.failed:
            return step()
        if self.calls > self.warmup:
            self._record(step)
            if self.graph is not None:
                self.graph.replay()
                return self.output
            return step()
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            output = step()
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        return output

    def _record(self, step: Callable[[], Output]) -> None:
        """Record the step on the side stream; nothing runs until the graph is replayed."""
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)
        before = torch.cuda.current_stream(self.device)
        try:
            with torch.cuda.graph(graph, stream=self.side, capture_error_mode="thread_local"):
                self.output = step()
        except RuntimeError as err:  # a capture the CUDA runtime refuses: run the step kernel by kernel
            torch.cuda.set_stream(before)  # a refused recording's exit leaves the side stream current
            log.warning("%s steps without a CUDA graph: recording failed (%s)", self.what,
                        str(err).strip().splitlines()[0])
            self.failed, self.output = True, None
            torch.cuda.synchronize()
            return
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        self.graph = graph
