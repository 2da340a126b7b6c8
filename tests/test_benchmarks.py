"""The benchmark scripts' own set-up (their timings are runs, not tests)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_seed_workers_timing_distills_in_a_scratch_copy_of_the_store(tmp_path, monkeypatch):
    """``time_seed_workers.py`` distills beside the pipeline, never in it: the scratch directory links to the
    store's files, holds a copy of its manifest and nothing of the pipeline's generators."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from time_seed_workers import scratch_pipeline

    from apd.pipeline.layout import Layout

    pipeline = tmp_path / "artifacts" / "demo"
    pipeline.mkdir(parents=True)
    for name in ("samples.h5", "samples-0.h5", "samples-1.h5", "samples.json", "generator.pt", "generator.json"):
        (pipeline / name).write_text(name)
    scratch = tmp_path / "scratch"
    scratch_pipeline(Layout(pipeline), scratch)

    copied = scratch / "demo"
    assert sorted(p.name for p in copied.iterdir()) == ["samples-0.h5", "samples-1.h5", "samples.h5", "samples.json"]
    for name in ("samples.h5", "samples-0.h5", "samples-1.h5"):
        assert (copied / name).is_symlink() and (copied / name).resolve() == (pipeline / name).resolve()
    assert not (copied / "samples.json").is_symlink() and (copied / "samples.json").read_text() == "samples.json"
