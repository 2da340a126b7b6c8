"""The Python API: the README's snippet, run as written, on the tiny pipeline's artifacts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from apd.methods import LOADABLE

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
    namespace: dict = {}
    exec(snippet, namespace)
    data = namespace["data"]
    assert namespace["probs"].shape == (100, len(data.splits.y_test), 10)
    assert set(data.ood) == {"gaussian", "uniform"} and namespace["name"] == "uniform"


@pytest.mark.parametrize("method", LOADABLE)
def test_every_method_loads(tiny_pipeline, method):
    import apd

    root, _ = tiny_pipeline
    post = apd.load(root / "tiny", method)
    probs = post.predict_probs(torch.zeros(3, 64), 4, torch.Generator().manual_seed(0))
    assert probs.shape[1:] == (3, 10) and probs.shape[0] == post.ensemble_size(4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:2]))


def test_public_names():
    import apd

    for name in ("SGLD", "SampleStore", "scores", "detection", "predict_probs", "Posterior", "load", "load_data",
                 "mlp", "ParamSpec"):
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
    from tests.tiny_pipeline import copy_samples

    root, _ = tiny_pipeline
    copy = tmp_path / "tiny"
    copy_samples(root, tmp_path)  # the configuration whose network the record is checked against
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


def test_predict_probs_takes_a_numpy_array_or_a_tensor_of_another_dtype(tiny_pipeline):
    import apd

    root, _ = tiny_pipeline
    post = apd.load(root / "tiny", "sgld")
    x = torch.rand(4, 64) * 2 - 1
    expected = post.predict_probs(x, 3, torch.Generator().manual_seed(0))
    for given in (x.numpy().astype("float64"), x.double(), x.reshape(4, 8, 8)):
        torch.testing.assert_close(post.predict_probs(given, 3, torch.Generator().manual_seed(0)), expected)


@pytest.mark.cuda
def test_predict_probs_moves_a_tensor_on_another_device(tiny_pipeline):
    import apd

    root, _ = tiny_pipeline
    post = apd.load(root / "tiny", "sgd")
    x = torch.rand(4, 64) * 2 - 1
    torch.testing.assert_close(post.predict_probs(x.cuda(), 1), post.predict_probs(x, 1))


@pytest.mark.parametrize(("x", "message"), [
    (torch.zeros(64), r"x must be a batch of inputs \[N, features\] \(or \[N, H, W\] images\), got shape \[64\]; "
                      r"for one input pass x\[None\]"),
    (torch.zeros(0, 64), r"got shape \[0, 64\]$"),
    (torch.zeros(3, 63), "^inputs have 63 features, the network takes 64$"),
    (torch.arange(3 * 64).reshape(3, 64) % 17, r"^x has values in \[0, 16\], outside the pipeline's input range "
                                               r"\[-1, 1\]: scale pixels p in \[0, 1\] to 2p − 1"),
    (torch.full((3, 64), float("nan")), "^x has NaN or infinite values$"),
])
@pytest.mark.parametrize("method", ["sgld", "apd", "sgd", "mcdropout"])
def test_predict_probs_refuses_what_is_not_a_batch_in_the_pipeline_scale_in_one_line(tiny_pipeline, method, x,
                                                                                       message):
    import apd

    root, _ = tiny_pipeline
    with pytest.raises(ValueError, match=message) as err:
        apd.load(root / "tiny", method).predict_probs(x, 2)
    assert "\n" not in str(err.value)


def test_load_data_gives_what_evaluate_scores(tiny_pipeline):
    """The artifacts' recorded configuration and the pipeline file give the inputs evaluate_methods scores."""
    import apd
    from apd.pipeline.recipes import evaluation_inputs
    from tests.tiny_pipeline import tiny_context

    root, config = tiny_pipeline
    expected = evaluation_inputs(tiny_context(root))
    for source in (root / "tiny", config):
        data = apd.load_data(source)
        assert torch.equal(data.splits.x_test, expected.x_test) and torch.equal(data.splits.y_test, expected.y_test)
        assert torch.equal(data.x_in, expected.x_in)
        assert list(data.ood) == list(expected.ood)
        assert all(torch.equal(data.ood[name], expected.ood[name]) for name in expected.ood)


def test_load_data_refuses_artifacts_sampled_on_other_data(tiny_pipeline, tmp_path):
    import json

    import h5py

    import apd
    from apd.errors import DataError
    from tests.tiny_pipeline import copy_samples

    root, _ = tiny_pipeline
    copy_samples(root, tmp_path)
    with h5py.File(tmp_path / "tiny" / "samples.h5", "r+") as h5:
        h5.attrs["meta"] = json.dumps({**json.loads(h5.attrs["meta"]), "data_fingerprint": "0123456789abcdef"})
    with pytest.raises(DataError, match=r"samples\.h5: sampled on data with fingerprint 0123456789abcdef, but "
                                        r"digits here has [0-9a-f]{16}; pass the data_dir it was sampled from$"):
        apd.load_data(tmp_path / "tiny")


@pytest.mark.parametrize("method", LOADABLE)
def test_load_gives_the_posterior_evaluate_judged(tiny_pipeline, method):
    """Drawn as ``apd evaluate`` draws it (its stream, members and runs), the loaded posterior scores the
    accuracy and NLL the tiny pipeline's results.json records: the same fit (MoG, modes, Stein, Laplace, with
    the evaluation's seeds), the same rows, the same networks."""
    import json

    import apd
    from apd.evaluation.protocol import judge
    from apd.pipeline.methods import ensemble_sizes
    from apd.pipeline.recipes import evaluation_inputs
    from tests.tiny_pipeline import tiny_context

    root, _ = tiny_pipeline
    ctx = tiny_context(root)
    e = ctx.cfg.evaluate
    recorded = json.loads((root / "tiny" / "eval" / "results.json").read_text())["accuracy"][method]
    post = apd.load(root / "tiny", method)
    generator = torch.Generator().manual_seed(ctx.seed("evaluate", "draws", method))
    inputs, members = evaluation_inputs(ctx), ensemble_sizes(ctx, {method: post})[method]
    runs = [judge(post, inputs, members, generator, e.scores) for _ in range(e.runs)]
    for key in ("acc", "nll"):
        mean = sum(run.accuracy[key] for run in runs) / len(runs)
        assert mean == pytest.approx(recorded[key]["mean"], abs=1e-4), key
