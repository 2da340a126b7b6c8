"""What a study leaves: its JSON, Markdown and figure replaced together, or not at all."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from apd.experiments.outputs import write_study


def _draw(results: dict, path: Path) -> None:
    path.write_bytes(b"png " + str(results["value"]).encode())


def test_a_study_that_fails_while_writing_replaces_none_of_its_outputs(tmp_path, capsys):
    write_study(tmp_path, "study", {"value": 1}, lambda r: f"value {r['value']}", _draw, show=True)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    assert sorted(before) == ["study.json", "study.md", "study.png"]

    def full_disk(results: dict, path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with pytest.raises(OSError, match="No space left"):
        write_study(tmp_path, "study", {"value": 2}, lambda r: f"value {r['value']}", full_disk, show=True)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before  # no temporary left either
    write_study(tmp_path, "study", {"value": 3}, lambda r: f"value {r['value']}", _draw, show=False)
    assert (tmp_path / "study.md").read_text() == "value 3" and (tmp_path / "study.png").read_bytes() == b"png 3"
    assert capsys.readouterr().out.splitlines() == ["value 1"]  # the third not shown
