from __future__ import annotations

import pytest
import torch

from apd.config_load import load_config
from apd.pipeline.runtime import RunContext


@pytest.mark.parametrize(("name", "made_current"), [("cuda:1", [torch.device("cuda:1")]), ("cuda", []), ("cpu", [])])
def test_a_cuda_card_named_by_number_becomes_the_current_device(monkeypatch, name, made_current):
    """A run on cuda:1 makes card 1 the process's current device, where CUDA streams, graphs and Triton
    launches made without naming a device go; "cuda" (the current card) and the CPU change nothing."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    context = RunContext(cfg=load_config("pipelines/digits.toml"), device_name=name)
    assert context.device == torch.device(name)
    assert calls == made_current
