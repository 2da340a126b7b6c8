from __future__ import annotations

import h5py
import numpy as np
import pytest
from h5py import h5s

from apd.errors import ArtifactError
from apd.samplers.store import SampleStore
from apd.samplers.store_join import join_stores
from apd.samplers.store_shards import ShardReader, _selected_rows
from tests.store_helpers import write_shard


def test_selected_rows_of_hand_made_selections():
    space = h5s.create_simple((20, 4))
    space.select_hyperslab((1, 0), (3, 1), (5, 1), (2, 4))  # blocks of 2 rows every 5 rows, from row 1
    assert _selected_rows(space, 4).tolist() == [1, 2, 6, 7, 11, 12]
    space.select_hyperslab((0, 0), (4, 2), (1, 2), (1, 2))  # whole rows as two column blocks
    assert _selected_rows(space, 4).tolist() == [0, 1, 2, 3]
    space.select_hyperslab((0, 1), (4, 3))  # part of each row
    assert _selected_rows(space, 4) is None
    space.select_elements(np.array([[0, 0], [1, 0]]))  # points, not a hyperslab
    assert _selected_rows(space, 4) is None


def test_joined_rows_from_the_shards_equal_hdf5s_reading_of_the_virtual_dataset(tmp_path):
    """Chains stepped together (strided in their shard), a chain alone (contiguous), compression: every
    read pattern gives the bytes HDF5's own mapping gives, and the reader is what the store uses."""
    write_shard(tmp_path / "s-0.h5", [0, 2, 4], 7)
    write_shard(tmp_path / "s-1.h5", [1], 7, compression="lzf")
    write_shard(tmp_path / "s-2.h5", [3, 5], 7)
    join_stores(tmp_path / "joined.h5", [tmp_path / f"s-{rank}.h5" for rank in range(3)])
    with h5py.File(tmp_path / "joined.h5", "r") as file:
        mapped = file["samples"][()]
    with SampleStore.open(tmp_path / "joined.h5") as store:
        reader = store._shards
        assert isinstance(reader, ShardReader)
        assert reader.shard.tolist() == [0] * 7 + [1] * 7 + [0] * 7 + [2] * 7 + [0] * 7 + [2] * 7
        assert reader.row[:8].tolist() == [0, 3, 6, 9, 12, 15, 18, 0]
        np.testing.assert_array_equal(store.read_all().numpy(), mapped)
        np.testing.assert_array_equal(store.read_all(5, 23).numpy(), mapped[5:23])
        picks = np.random.default_rng(0).integers(0, len(store), 60)
        np.testing.assert_array_equal(store.read(picks).numpy(), mapped[picks])
    assert all(not file.id.valid for file in reader.files)  # closed with the store


def test_a_damaged_shard_row_read_through_the_join_is_one_clear_error(tmp_path):
    write_shard(tmp_path / "s-0.h5", [0, 1], 4)
    join_stores(tmp_path / "joined.h5", [tmp_path / "s-0.h5"])
    with h5py.File(tmp_path / "s-0.h5", "r+") as file:
        file["samples"][3, 2] = np.nan  # chain 1's second sample: joined row 5
    with SampleStore.open(tmp_path / "joined.h5") as store:
        store.read([0, 4])
        with pytest.raises(ArtifactError, match="sample 5 holds NaN"):
            store.read_all()


def test_a_shard_that_cannot_be_opened_is_one_clear_error(tmp_path):
    write_shard(tmp_path / "s-0.h5", [0], 3)
    write_shard(tmp_path / "s-1.h5", [1], 3)
    join_stores(tmp_path / "joined.h5", [tmp_path / "s-0.h5", tmp_path / "s-1.h5"])
    (tmp_path / "s-1.h5").unlink()  # after SampleStore.open's check, say
    with h5py.File(tmp_path / "joined.h5", "r") as file, \
            pytest.raises(ArtifactError, match=r"joined.h5: cannot open its shard .*s-1.h5"):
        ShardReader.of(file["samples"], tmp_path / "joined.h5", 6)
