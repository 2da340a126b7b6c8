from __future__ import annotations

import hashlib

import h5py
import numpy as np
import pytest

from apd.samplers.store import SampleStore
from apd.samplers.store_digest import content_digest
from apd.samplers.store_join import join_stores
from tests.store_helpers import META, SPEC, rows


def _store(path, n=6, start=0, chain=0, **kwargs):
    with SampleStore.create(path, SPEC, META, **kwargs) as store:
        store.append_many(rows(n, start), steps=np.arange(start, start + n) * 10, chains=chain, lrs=0.01)
    return path


def _digest(path):
    with SampleStore.open(path) as store:
        return content_digest(store)


def test_digest_is_the_sha256_of_the_rows_then_the_columns_worked_by_hand(tmp_path):
    n = 3
    expected = hashlib.sha256(f"apd-samples dim={SPEC.numel} n={n}".encode())
    expected.update(rows(n).astype("<f4").tobytes())
    expected.update((np.arange(n) * 10).astype("<i8").tobytes())  # step
    expected.update(np.zeros(n, "<i4").tobytes())  # chain
    expected.update(np.full(n, 0.01, "<f8").tobytes())  # lr
    expected.update(np.full(n, np.nan, "<f8").tobytes())  # log_lik: none recorded
    assert _digest(_store(tmp_path / "s.h5", n=n)) == expected.hexdigest()[:16]


@pytest.mark.parametrize("layout", [{"compression": "gzip"}, {"compression": "lzf", "chunk_rows": 4}])
def test_same_samples_in_another_file_have_the_same_digest(tmp_path, layout):
    plain = _store(tmp_path / "plain.h5")
    other = _store(tmp_path / "other.h5", **layout)
    with h5py.File(other, "r+") as file:
        file.attrs["created"] = "1999-01-01T00:00:00+0000"  # another creation time: another file digest
    assert plain.read_bytes() != other.read_bytes()
    assert _digest(plain) == _digest(other)


def test_a_store_joined_from_shards_has_the_digest_of_one_file_holding_its_rows(tmp_path):
    whole = tmp_path / "whole.h5"
    with SampleStore.create(whole, SPEC, META) as store:
        store.append_many(rows(4), steps=np.arange(4) * 10, chains=0, lrs=0.01)
        store.append_many(rows(5, 4), steps=np.arange(4, 9) * 10, chains=1, lrs=0.01)
    shards = [_store(tmp_path / "s-0.h5", n=4), _store(tmp_path / "s-1.h5", n=5, start=4, chain=1)]
    join_stores(tmp_path / "joined.h5", shards, meta=META)
    assert _digest(tmp_path / "joined.h5") == _digest(whole)


def test_one_changed_value_changes_the_digest(tmp_path):
    reference = _digest(_store(tmp_path / "s.h5"))
    for dataset, index in (("samples", (2, 7)), ("step", 4), ("chain", 0)):
        path = _store(tmp_path / f"{dataset}.h5")
        with h5py.File(path, "r+") as file:
            file[dataset][index] = file[dataset][index] + 1
        assert _digest(path) != reference, dataset
    shorter = _store(tmp_path / "shorter.h5", n=5)  # the same first rows, one fewer
    assert _digest(shorter) != reference
