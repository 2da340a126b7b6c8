"""The Python API: the README's snippet, run as written, on the tiny pipeline's artifacts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_snippet() -> str:
    """The README's "Using the artifacts from Python" code block."""
    text = README.read_text()
    section = text[text.index("## Using the artifacts from Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_snippet_runs(tiny_pipeline, monkeypatch):
    root, _ = tiny_pipeline
    snippet = readme_snippet().replace('"artifacts/digits"', f'"{root / "tiny"}"')
    monkeypatch.chdir(root)
    namespace: dict = {"x": torch.zeros(5, 64)}
    exec(snippet, namespace)
    assert namespace["probs"].shape == (100, 5, 10)


@pytest.mark.parametrize("method", ["sgld", "apd", "sgd", "mcdropout", "mog"])
def test_every_method_loads(tiny_pipeline, method):
    import apd

    root, _ = tiny_pipeline
    post = apd.load(root / "tiny", method)
    probs = post.predict_probs(torch.zeros(3, 64), 4, torch.Generator().manual_seed(0))
    assert probs.shape[1:] == (3, 10) and probs.shape[0] == post.ensemble_size(4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:2]))


def test_public_names():
    import apd

    for name in ("SGLD", "SampleStore", "scores", "detection", "predict_probs", "Posterior", "load", "mlp",
                 "ParamSpec"):
        assert hasattr(apd, name), name
    with pytest.raises(ValueError, match="method must be one of"):
        apd.load("nowhere", "bogus")


@pytest.mark.parametrize("method", ["sgld", "apd", "sgd", "mcdropout", "mog"])
def test_a_cuda_device_that_is_not_here_fails_at_load(tiny_pipeline, monkeypatch, method):
    import apd
    from apd.errors import ConfigError

    root, _ = tiny_pipeline
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="'cuda' requested but no CUDA device is available"):
        apd.load(root / "tiny", method, device="cuda")


@pytest.mark.parametrize(("method", "change"), [
    ("sgd", lambda m: m.pop("sizes")), ("sgd", lambda m: m.update(sizes="64-32-10")),
    ("sgd", lambda m: m.update(sizes=[64, 0, 10])), ("mcdropout", lambda m: m.update(dropout="half")),
    ("mcdropout", lambda m: m.update(conv=[6])),
])
def test_a_baseline_manifest_without_a_valid_network_is_one_artifact_error(tiny_pipeline, tmp_path, method, change):
    import json
    import shutil

    import apd
    from apd.errors import ArtifactError

    root, _ = tiny_pipeline
    copy = tmp_path / "tiny"
    shutil.copytree(root / "tiny" / "baselines", copy / "baselines")
    manifest = copy / "baselines" / f"{method}.json"
    record = json.loads(manifest.read_text())
    change(record)
    manifest.write_text(json.dumps(record))
    with pytest.raises(ArtifactError, match=re.escape(str(manifest.with_suffix(""))) + r"\.(json|pt): ") as err:
        apd.load(copy, method)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("method", "edit", "message"), [
    ("apd", "generator.pt", r"generator.pt: changed since it was made; run `apd distill` --force"),
    ("sgld", "samples.h5", r"samples.h5: changed since it was made; run `apd sample` --force"),
    ("apd", "samples.json", r"generator.pt: made from other samples than the ones there now"),
])
def test_load_makes_the_command_lines_integrity_checks(tiny_pipeline, tmp_path, method, edit, message):
    """A swapped generator, an edited store, or a generator of other samples than the store there now is one
    ArtifactError, as the command line gives, not a posterior."""
    import json
    import shutil

    import apd
    from apd.errors import ArtifactError

    root, _ = tiny_pipeline
    copy = tmp_path / "tiny"
    shutil.copytree(root / "tiny", copy)
    path = copy / edit
    if edit.endswith(".json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "note": "another run"}))
    else:
        with path.open("r+b") as file:  # one byte past the headers
            file.seek(path.stat().st_size // 2)
            byte = file.read(1)
            file.seek(-1, 1)
            file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match=message):
        apd.load(copy, method)
