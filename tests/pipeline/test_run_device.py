from __future__ import annotations

import pytest
import torch

from apd.cli import main
from apd.config_load import load_config
from apd.pipeline.runtime import RunContext


@pytest.fixture
def two_cards(monkeypatch) -> list[torch.device]:
    """torch.cuda as on a machine of two cards; the devices made current, in order."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    made_current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    return made_current


@pytest.mark.parametrize(("name", "made_current"), [("cuda:1", [torch.device("cuda:1")]), ("cuda", []), ("cpu", [])])
def test_a_command_on_a_card_named_by_number_makes_it_the_current_device(tmp_path, two_cards, name, made_current):
    """A command run on cuda:1 makes card 1 the process's current device, where CUDA streams, graphs and
    Triton launches made without naming a device go; "cuda" (the current card) and the CPU change nothing."""
    assert main(["info", "--device", name, "--artifacts", str(tmp_path), "--quiet"]) == 0
    assert two_cards == made_current


def test_a_context_on_a_card_leaves_the_current_device_alone(two_cards):
    """A run context (what ``apd.load`` makes) names its card without making it the caller's current one."""
    context = RunContext(cfg=load_config("pipelines/digits.toml"), device_name="cuda:1")
    assert context.device == torch.device("cuda:1") and two_cards == []
