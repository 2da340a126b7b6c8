"""Artifact writers (apd.io): a write that fails leaves the complete file as it was and nothing beside it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from apd import io as apd_io
from apd.errors import ArtifactError


def test_json_is_written_sorted_and_indented_with_a_final_newline(tmp_path):
    path = tmp_path / "new" / "record.json"
    apd_io.write_json_atomic(path, {"b": 1, "a": [1.5, None]})
    assert path.read_text() == '{\n  "a": [\n    1.5,\n    null\n  ],\n  "b": 1\n}\n'
    assert apd_io.read_json(path) == {"a": [1.5, None], "b": 1} and oct(path.stat().st_mode & 0o777) == "0o644"


def test_json_that_cannot_be_written_leaves_the_complete_file(tmp_path):
    path = tmp_path / "record.json"
    apd_io.write_json_atomic(path, {"complete": True})
    with pytest.raises(TypeError):
        apd_io.write_json_atomic(path, {"tensor": torch.zeros(2)})
    assert apd_io.read_json(path) == {"complete": True} and os.listdir(tmp_path) == ["record.json"]


@pytest.mark.parametrize("write", [
    lambda path: apd_io.write_bytes_atomic(path, b"new"),
    lambda path: apd_io.save_torch_atomic(path, {"w": torch.ones(2)}),
], ids=["bytes", "torch"])
def test_a_failed_rename_leaves_the_complete_file_and_no_temporary(tmp_path, monkeypatch, write):
    path = tmp_path / "artifact"
    path.write_bytes(b"complete")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(apd_io.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        write(path)
    assert path.read_bytes() == b"complete" and os.listdir(tmp_path) == ["artifact"]


def test_files_written_together_replace_none_where_the_block_fails(tmp_path):
    finals = [tmp_path / "a.md", tmp_path / "b.csv"]
    for final in finals:
        final.write_text("old")
    with pytest.raises(RuntimeError), apd_io.written_together(finals) as built:
        built[finals[0]].write_text("new")
        raise RuntimeError("the second file could not be rendered")
    assert [final.read_text() for final in finals] == ["old", "old"] and len(os.listdir(tmp_path)) == 2
    with apd_io.written_together(finals) as built:
        for final in finals:
            built[final].write_text("new")
    assert [final.read_text() for final in finals] == ["new", "new"] and len(os.listdir(tmp_path)) == 2


@pytest.mark.parametrize(("content", "message"), [
    (None, "not found"), ("{", "not valid JSON"), ("[1, 2]", "expected a JSON object")])
def test_a_missing_or_corrupt_json_artifact_is_one_artifact_error(tmp_path, content, message):
    path = tmp_path / "record.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ArtifactError, match=f"^{path}: {message}"):
        apd_io.read_json(path)


def test_a_directory_replaced_whole_where_the_system_cannot_exchange_it(tmp_path, monkeypatch):
    """Without ``renameat2`` the old folder is moved aside and removed once the new one is in place; one cut
    short between the two renames is put back by ``restore_directory``."""
    final, built = tmp_path / "eval", tmp_path / "eval.partial"
    final.mkdir()
    (final / "results.json").write_text(json.dumps({"old": True}))
    built.mkdir()
    (built / "results.json").write_text(json.dumps({"new": True}))
    monkeypatch.setattr(apd_io, "_exchange", lambda a, b: False)
    apd_io.replace_directory(built, final)
    assert apd_io.read_json(final / "results.json") == {"new": True} and sorted(os.listdir(tmp_path)) == ["eval"]
    final.rename(tmp_path / "eval.old")  # as a process killed after moving the old folder aside leaves it
    apd_io.restore_directory(final)
    assert apd_io.read_json(final / "results.json") == {"new": True}
