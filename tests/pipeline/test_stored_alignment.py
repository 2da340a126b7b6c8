"""The samples' alignment stored once per pipeline (apd/pipeline/stored_alignment.py): made by the first process
that needs it, read by the others, made again when its samples, settings or file change, never written for a
study's other settings."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from apd.config import DistillConfig
from apd.pipeline import recipes
from apd.pipeline.layout import manifest_of
from apd.pipeline.manifests import manifest_digest
from apd.pipeline.runtime import RunContext
from apd.samplers.store import SampleStore
from tests.tiny_pipeline import copy_samples, copy_samples_as_two_chains, tiny_context

ALIGNED = {"align": "permutation", "fit_samples": 50}


def aligned(ctx):
    """The pipeline's permutations of every stored row, as a fresh process of this context finds them."""
    with SampleStore.open(ctx.layout.samples) as store:
        return recipes.store_alignment(ctx, store)


def refuse_to_align(monkeypatch):
    """Make computing an alignment fail, so that only a stored one can be had."""
    def refused(*args, **kwargs):
        raise AssertionError("aligned again")
    monkeypatch.setattr(recipes, "_align", refused)
    monkeypatch.setattr(recipes, "_align_chains", refused)


def test_the_first_process_stores_the_alignment_and_the_next_reads_it(tiny_pipeline, tmp_path, monkeypatch):
    copy_samples(tiny_pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill=ALIGNED)
    made = aligned(ctx)
    path = ctx.layout.alignment
    record = json.loads(manifest_of(path).read_text())
    assert path.is_file() and (record["alignment"]["method"], record["alignment"]["fit_samples"]) == ("permutation", 50)
    refuse_to_align(monkeypatch)
    read = aligned(tiny_context(tmp_path, distill=ALIGNED))  # another process: nothing prepared in memory
    assert read.dtype == torch.int64 and torch.equal(read, made)
    with SampleStore.open(ctx.layout.samples) as store:
        data = recipes.training_samples(tiny_context(tmp_path, distill=ALIGNED), store, DistillConfig(**ALIGNED))
    assert data.alignment == record["alignment"] and torch.equal(data.perms, made)


@pytest.mark.parametrize("change", ["fit_samples", "seed", "samples", "file", "manifest"])
def test_the_alignment_is_made_again_when_what_it_depends_on_changes(tiny_pipeline, tmp_path, caplog, change):
    copy_samples(tiny_pipeline[0], tmp_path)
    aligned(tiny_context(tmp_path, distill=ALIGNED))
    path = tiny_context(tmp_path).layout.alignment
    first, before = path.read_bytes(), json.loads(manifest_of(path).read_text())
    other = tiny_context(tmp_path, distill={**ALIGNED, "fit_samples": 40 if change == "fit_samples" else 50})
    if change == "seed":
        other = RunContext(cfg=dataclasses.replace(other.cfg, seed=7), artifacts_root=tmp_path, quiet=True)
    elif change == "samples":
        copy_samples_as_two_chains(tiny_pipeline[0], tmp_path)  # the store's manifest changes
    elif change == "file":
        path.write_bytes(first[:-1] + bytes([first[-1] ^ 1]))
    elif change == "manifest":  # still matching its file, but without the alignment's record
        manifest_of(path).write_text(json.dumps({k: v for k, v in before.items() if k != "alignment"}))
    aligned(other)
    after = json.loads(manifest_of(path).read_text())
    if change in ("file", "manifest"):  # made again, as it was
        assert ("changed since" if change == "file" else "unreadable") in caplog.text and path.read_bytes() == first
        assert after["alignment"] == before["alignment"] | {"seconds": after["alignment"]["seconds"]}
    else:
        assert (after["config_hash"], after["inputs"]) != (before["config_hash"], before["inputs"])
    assert after["alignment"]["fit_samples"] == (40 if change == "fit_samples" else 50)


def test_a_study_aligning_otherwise_leaves_the_stored_alignment_alone(tiny_pipeline, tmp_path):
    copy_samples(tiny_pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill=ALIGNED)
    aligned(ctx)
    stored = ctx.layout.alignment.read_bytes(), manifest_of(ctx.layout.alignment).read_text()
    with SampleStore.open(ctx.layout.samples) as store:
        data = recipes.training_samples(ctx, store, DistillConfig(align="permutation", fit_samples=30))
    assert data.alignment["fit_samples"] == 30
    assert (ctx.layout.alignment.read_bytes(), manifest_of(ctx.layout.alignment).read_text()) == stored


def test_an_unaligned_pipeline_stores_nothing(tiny_pipeline, tmp_path):
    copy_samples(tiny_pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path)
    assert aligned(ctx) is None and not ctx.layout.alignment.exists()


def test_distill_aligns_once_before_its_workers_start(tiny_pipeline, tmp_path, monkeypatch):
    """With several worker processes the stage aligns the samples and stores them before it starts them, so
    that every worker reads them."""
    from apd.pipeline import distill
    from apd.pipeline.manifests import is_complete
    from apd.pipeline.stored_alignment import alignment_key

    copy_samples(tiny_pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill={**ALIGNED, "seeds": 2, "workers": 2})
    started = []

    def workers(ctx, work, pieces, count, what, command):
        inputs = {"samples": manifest_digest(manifest_of(ctx.layout.samples))}
        started.append(is_complete(manifest_of(ctx.layout.alignment), alignment_key(ctx), inputs))

    monkeypatch.setattr(distill, "split_work", workers)
    distill.distill_offline(ctx)
    assert started == [True]


def test_the_samples_after_the_burn_in_are_aligned_as_their_rows_of_the_store(tiny_pipeline, tmp_path):
    """SGLD's samples after the trace's burn-in (a view of some rows, ``evaluate.burn_in_from_trace``) get those
    rows' permutations of the pipeline's one alignment, so that the fidelity table sets a method fit to the
    aligned samples against SGLD's in its frame."""
    from apd.pipeline.methods import sgld_samples
    from apd.samplers.store import StoreRows

    copy_samples(tiny_pipeline[0], tmp_path)
    ctx = tiny_context(tmp_path, distill=ALIGNED, evaluate={"burn_in_from_trace": True})
    whole = aligned(ctx)
    with SampleStore.open(ctx.layout.samples) as store:
        view = sgld_samples(ctx, store)
        assert isinstance(view, StoreRows) and 0 < len(view) < len(store)
        perms = recipes.store_alignment(ctx, view)
    assert len(perms) == len(view) and torch.equal(perms, whole[torch.from_numpy(view.rows)])
