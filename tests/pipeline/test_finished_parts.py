"""Finished parts of an interrupted stage: taken only under the key they were made under."""

from __future__ import annotations

import json

import torch

from apd.pipeline.finished_parts import FinishedParts

KEY = {"stage": "abc", "inputs": {"sgld": "123"}}


def test_a_part_is_taken_under_its_key_as_json_gives_it_in_its_order_and_not_under_another(tmp_path):
    folder = tmp_path / "eval.kept.partial"
    parts = FinishedParts(folder, KEY)
    made = parts.put("25 int4", {"k": 25, "band": (0.5, 1.5), "values": [0.1, None]})
    assert made == {"band": [0.5, 1.5], "k": 25, "values": [0.1, None]}  # a tuple comes back a list
    assert FinishedParts(folder, KEY).get("25 int4") == made and parts.get("4") is None
    # in the order it was made: sums over a dict's values (the mean over OOD sets) follow it to the last bit
    assert list(made) == list(FinishedParts(folder, KEY).get("25 int4")) == ["k", "band", "values"]
    assert FinishedParts(folder, {**KEY, "stage": "abd"}).get("25 int4") is None  # another configuration
    assert list(folder.iterdir()) == [folder / "key.json"]


def test_starting_over_a_damaged_or_misnamed_part_are_not_taken(tmp_path):
    folder = tmp_path / "parts"
    FinishedParts(folder, KEY).put("4", {"k": 4})
    assert FinishedParts(folder, KEY, start_over=True).get("4") is None
    parts = FinishedParts(folder, KEY)
    parts.put("4", {"k": 4})
    path = next(p for p in folder.iterdir() if p.name != "key.json")
    path.write_text('{"name": "4", "val')  # cut short
    assert parts.get("4") is None
    path.write_text(json.dumps({"name": "5", "value": {"k": 5}}))  # another part's
    assert parts.get("4") is None
    path.write_text(json.dumps({"name": "4", "value": {"k": 4}}))  # made without the stream asked for
    stream = torch.Generator().manual_seed(3)
    assert parts.get("4") == {"k": 4} and parts.get("4", stream) is None
    path.write_text("[4]")
    assert parts.get("4") is None
    parts.remove()
    assert not folder.exists()


def test_taking_a_part_puts_its_stream_where_making_it_left_it(tmp_path):
    parts = FinishedParts(tmp_path / "parts", KEY)
    made = torch.Generator().manual_seed(7)
    parts.put("1", torch.randint(100, (3,), generator=made).tolist(), made)
    taken = torch.Generator().manual_seed(7)
    assert parts.get("1", taken) is not None
    assert torch.equal(torch.randint(100, (5,), generator=taken), torch.randint(100, (5,), generator=made))
    untouched = torch.Generator().manual_seed(7)
    assert parts.get("2", untouched) is None
    assert torch.equal(torch.randint(100, (3,), generator=untouched),
                       torch.randint(100, (3,), generator=torch.Generator().manual_seed(7)))
