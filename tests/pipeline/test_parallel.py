"""Independent pieces of a stage on several processes (:mod:`apd.pipeline.parallel`): how many workers, and
which pieces each takes. That a piece's result does not depend on the workers is tested with the stages that
use it (the baselines in test_peers_stage.py, the generator seeds in test_pipeline.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from apd.pipeline import parallel


@pytest.mark.parametrize(("device", "pieces", "workers", "expected"),
                         [("cpu", 3, 2, 2), ("cpu", 1, 2, 1), ("cpu", 0, 2, 1), ("cpu", 4, 1, 1),
                          ("cuda", 3, 2, 1)])
def test_never_more_workers_than_pieces_and_one_on_a_gpu(device, pieces, workers, expected):
    ctx = SimpleNamespace(device=torch.device(device))
    assert parallel.worker_count(ctx, pieces, workers) == expected


def test_pieces_are_dealt_round_robin_and_one_worker_works_here(monkeypatch, tmp_path):
    from tests.tiny_pipeline import tiny_context

    ctx, started, here = tiny_context(tmp_path), [], []
    monkeypatch.setattr(parallel, "spawn", lambda worker, size, context, command, work, shares, on_death:
                        started.append((size, shares, on_death(1, "was killed by SIGKILL"))))
    parallel.split_work(ctx, lambda _, share: here.append(share), [0, 1, 2], 2, "generator seeds", "distill")
    assert here == [] and started[0][:2] == (2, [[0, 2], [1]])
    assert started[0][2].startswith("the worker of generator seeds 1 was killed by SIGKILL; complete artifacts")
    parallel.split_work(ctx, lambda _, share: here.append(share), [0, 1, 2], 1, "generator seeds", "distill")
    assert here == [[0, 1, 2]] and len(started) == 1
    parallel.split_work(ctx, lambda _, share: here.append(share), [("sgd", "swag"), ("mcdropout",)], 2, "baselines",
                        "sample")
    assert started[1][2].startswith("the worker of baselines mcdropout was killed")
    assert parallel._names(started[1][1][0]) == "sgd then swag"


def _out_of_memory(ctx, share):
    raise MemoryError


def test_a_worker_out_of_memory_is_the_commands_one_line_error(tmp_path):
    """What a worker raises reaches the parent as its one line when it is a user's error (apd.pipeline.spawned):
    running out of memory in a worker is one, naming what to lower for the command the worker serves."""
    from apd.errors import DeviceMemoryError
    from tests.tiny_pipeline import tiny_context

    context = parallel.portable(tiny_context(tmp_path))
    with pytest.raises(DeviceMemoryError, match="^out of CPU memory: lower distill.in_memory_gb"):
        parallel._worker(0, 2, "", context, "distill", _out_of_memory, [[0], [1]])
