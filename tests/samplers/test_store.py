from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from apd.errors import ArtifactError
from apd.nets import ParamSpec, mlp
from apd.samplers.store import SampleStore, chain_partition
from tests.store_helpers import META, SPEC, row, rows, write_shard

REPO = Path(__file__).resolve().parent.parent
OTHER_SPEC = ParamSpec.from_module(mlp([6, 4, 3]))


def write_store(path: Path, n: int, **kwargs) -> None:
    with SampleStore.create(path, SPEC, META, **kwargs) as store:
        store.append_many(rows(n), steps=np.arange(n) * 20)


def test_spec_dimension():
    assert SPEC.numel == 53


@pytest.mark.parametrize("compression", ["none", "lzf", "gzip"])
def test_round_trip(tmp_path, compression):
    path = tmp_path / "s.h5"
    with SampleStore.create(path, SPEC, META, compression=compression) as store:
        indices = [store.append(torch.from_numpy(row(i)), step=100 + 20 * i, chain=i % 2, lr=0.01 * (i + 1),
                                log_lik=-float(i)) for i in range(4)]
        indices.append(store.append(row(4).astype(np.float64), step=180))  # numpy, cast to float32
        added = store.append_many(rows(3, start=5), steps=[200, 220, 240], chains=3, lrs=0.5)
        assert indices == [0, 1, 2, 3, 4]
        assert added == range(5, 8)
        assert len(store) == 8
    with SampleStore.open(path) as store:
        assert store.spec == SPEC
        assert store.meta == META
        assert len(store) == 8
        assert store.samples.dtype == np.float32
        assert store.samples.chunks == (1, SPEC.numel)
        assert store.samples.compression == (None if compression == "none" else compression)
        np.testing.assert_array_equal(store.samples[:], rows(8))
        np.testing.assert_array_equal(store.read_all().numpy(), rows(8))
        np.testing.assert_array_equal(store.read_all(2, 5).numpy(), rows(3, start=2))
        np.testing.assert_array_equal(store.steps, [100, 120, 140, 160, 180, 200, 220, 240])
        np.testing.assert_array_equal(store.chains, [0, 1, 0, 1, 0, 3, 3, 3])
        np.testing.assert_allclose(store.lrs[:4], [0.01, 0.02, 0.03, 0.04])
        assert np.isnan(store.lrs[4])
        np.testing.assert_array_equal(store.lrs[5:], [0.5, 0.5, 0.5])
        np.testing.assert_array_equal(store.log_liks[:4], [0.0, -1.0, -2.0, -3.0])
        assert np.isnan(store.log_liks[4:]).all()
        assert store.steps.dtype == np.int64 and store.chains.dtype == np.int32
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "apd-samples"
        assert f.attrs["format_version"] == 1
        assert ParamSpec.from_json(f.attrs["spec"]) == SPEC


def test_read_matches_numpy_indexing(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, 30)
    expected = rows(30)
    indices = [17, 3, 3, 29, 0, 17, 5, 6, 7, 8, 28, 29]  # unsorted, repeated, and a contiguous run
    with SampleStore.open(path) as store:
        got = store.read(indices)
        assert got.dtype == torch.float32 and got.shape == (12, SPEC.numel)
        np.testing.assert_array_equal(got.numpy(), expected[indices])
        np.testing.assert_array_equal(store.read(torch.tensor([4, 2])).numpy(), expected[[4, 2]])
        np.testing.assert_array_equal(store.read([9, 10, 11]).numpy(), expected[9:12])
        assert store.read([]).shape == (0, SPEC.numel)
        with pytest.raises(IndexError):
            store.read([30])
        batch = store.random_batch(6, torch.Generator().manual_seed(3))
        drawn = torch.randint(30, (6,), generator=torch.Generator().manual_seed(3)).numpy()
        np.testing.assert_array_equal(batch.numpy(), expected[drawn])
        batch = store.random_batch(5, np.random.default_rng(4))
        np.testing.assert_array_equal(batch.numpy(), expected[np.random.default_rng(4).integers(0, 30, 5)])


def test_append_after_reopen(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, 4)
    with SampleStore.open(path, mode="a") as store:
        assert [store.append(row(i), step=20 * i) for i in range(4, 7)] == [4, 5, 6]
    with SampleStore.open(path) as store:
        assert len(store) == 7
        np.testing.assert_array_equal(store.read_all().numpy(), rows(7))
        np.testing.assert_array_equal(store.steps, np.arange(7) * 20)


def test_truncate(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, 10)
    with SampleStore.open(path, mode="a") as store:
        store.truncate(6)
        assert len(store) == 6 and store.samples.shape == (6, SPEC.numel)
        with pytest.raises(ValueError, match="truncate"):
            store.truncate(7)
        assert store.append(row(40), step=999) == 6
    with SampleStore.open(path) as store:
        assert len(store) == 7
        np.testing.assert_array_equal(store.read_all().numpy(), np.vstack([rows(6), row(40)]))
        np.testing.assert_array_equal(store.steps, [0, 20, 40, 60, 80, 100, 999])


def test_read_mode_leaves_file_untouched_and_refuses_writes(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, 3)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with SampleStore.open(path) as store:
        store.read([2, 0])
        with pytest.raises(ValueError, match="read-only"):
            store.append(row(3), step=0)
        with pytest.raises(ValueError, match="read-only"):
            store.truncate(1)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_create_refuses_to_overwrite(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, 3)
    with pytest.raises(ArtifactError, match="already exists"):
        SampleStore.create(path, SPEC, META)
    with SampleStore.create(path, SPEC, {"new": True}, overwrite=True) as store:
        assert len(store) == 0
    with SampleStore.open(path) as store:
        assert len(store) == 0 and store.meta == {"new": True}


def test_wrong_shapes_are_value_errors(tmp_path):
    with SampleStore.create(tmp_path / "s.h5", SPEC, META) as store:
        with pytest.raises(ValueError, match=r"\[53\]"):
            store.append(np.zeros(52), step=0)
        with pytest.raises(ValueError, match=r"\[53\]"):
            store.append(np.zeros((1, 53)), step=0)
        with pytest.raises(ValueError, match=r"\[k, 53\]"):
            store.append_many(np.zeros(53), steps=0)
        assert len(store) == 0


def test_non_finite_samples_are_refused_and_the_store_stays_readable(tmp_path):
    with SampleStore.create(tmp_path / "s.h5", SPEC, META) as store:
        store.append(np.ones(SPEC.numel), step=0)
        bad = np.ones((3, SPEC.numel))
        bad[1, 7] = np.nan
        with pytest.raises(ValueError, match="sample 1 .* NaN or infinite"):
            store.append_many(bad, steps=[1, 2, 3])
        too_large = np.full(SPEC.numel, 1e39)  # finite in float64, infinite at float32
        with pytest.raises(ValueError, match="sample 0 .* NaN or infinite"):
            store.append(too_large, step=1)
        assert len(store) == 1
    with SampleStore.open(tmp_path / "s.h5") as store:
        np.testing.assert_array_equal(store.read_all().numpy(), np.ones((1, SPEC.numel), np.float32))


def test_rows_past_n_complete_are_ignored_then_dropped(tmp_path):
    """A writer that died between resizing and committing leaves longer datasets than ``n_complete``."""
    path = tmp_path / "s.h5"
    write_store(path, 5)
    with h5py.File(path, "r+") as f:
        for name in ("samples", "step", "chain", "lr", "log_lik"):
            f[name].resize(7, axis=0)
    with SampleStore.open(path) as store:
        assert len(store) == 5 and store.steps.shape == (5,)
    with SampleStore.open(path, mode="a") as store:
        assert store.samples.shape[0] == 5
        assert store.append(row(5), step=100) == 5
    with SampleStore.open(path) as store:
        np.testing.assert_array_equal(store.read_all().numpy(), rows(6))


def test_store_left_open_by_a_dead_writer_is_rebuilt_before_appending(tmp_path):
    """``writing`` = 1 (as a killed writer leaves it): appending first copies the committed rows, columns,
    chunking, compression and creation time into a fresh file; a reader never touches it."""
    path = tmp_path / "s.h5"
    with SampleStore.create(path, SPEC, META, compression="lzf", chunk_rows=2) as store:
        for i in range(5):
            store.append(row(i), step=10 * i, chain=3, lr=0.5, log_lik=-float(i))
    with h5py.File(path, "r+") as f:
        assert f.attrs["writing"] == 0  # a clean close
        f.attrs["writing"] = np.int8(1)
        f["samples"].resize(7, axis=0)  # and rows past n_complete
        created = f.attrs["created"]
    before = path.read_bytes()
    with SampleStore.open(path) as store:
        assert len(store) == 5
    assert path.read_bytes() == before
    with SampleStore.open(path, mode="a") as store:
        assert store.append(row(5), step=50, chain=3) == 5
    with h5py.File(path, "r") as f:
        assert f.attrs["writing"] == 0 and f.attrs["created"] == created
        assert f["samples"].compression == "lzf" and f["samples"].chunks == (2, SPEC.numel)
    with SampleStore.open(path) as store:
        np.testing.assert_array_equal(store.read_all().numpy(), rows(6))
        np.testing.assert_array_equal(store.steps, [0, 10, 20, 30, 40, 50])
        assert (store.chains == 3).all() and list(store.lrs[:5]) == [0.5] * 5
        np.testing.assert_array_equal(store.log_liks[:5], -np.arange(5.0))
    assert not (tmp_path / "s.h5.rebuild").exists()


def _missing(path: Path) -> None:
    pass


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def _truncated(path: Path) -> None:
    write_store(path, 20)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _foreign(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f["samples"] = np.zeros((3, SPEC.numel), np.float32)


def _other_network(path: Path) -> None:
    with SampleStore.create(path, OTHER_SPEC, META) as store:
        store.append(np.zeros(OTHER_SPEC.numel), step=0)


def _negative_count(path: Path) -> None:
    write_store(path, 3)
    with h5py.File(path, "a") as f:
        f.attrs["n_complete"] = -3


@pytest.mark.parametrize(("make", "message"), [
    (_missing, "not found"),
    (_garbage, "not a readable HDF5 file"),
    (_truncated, "not a readable HDF5 file"),
    (_foreign, "not an apd sample store"),
    (_other_network, "different network"),
    (_negative_count, "n_complete is -3"),
])
def test_bad_files_raise_one_clear_error(tmp_path, make, message):
    path = tmp_path / "bad.h5"
    make(path)
    with pytest.raises(ArtifactError, match=message) as info:
        SampleStore.open(path, expect_spec=SPEC)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from apd.nets import ParamSpec, mlp
    from apd.samplers.store import SampleStore

    spec = ParamSpec.from_module(mlp([64, 32, 10]))
    base = np.arange(spec.numel, dtype=np.float32) / 1000
    with SampleStore.create(sys.argv[1], spec, {"writer": "test"}) as store:
        for i in range(1_000_000):
            print(store.append(base + i, step=i, chain=7), flush=True)
""")


def test_sigkilled_writer_leaves_every_reported_row(tmp_path):
    path = tmp_path / "killed.h5"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env=env)
    try:
        reported = [int(proc.stdout.readline()) for _ in range(20)]
        time.sleep(0.013)  # let it get somewhere inside a later append
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    rest = proc.stdout.read()  # through the same buffer as readline (communicate would bypass it)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    reported += [int(line) for line in rest.split()]
    assert reported == list(range(len(reported)))

    spec = ParamSpec.from_module(mlp([64, 32, 10]))
    base = np.arange(spec.numel, dtype=np.float32) / 1000
    with h5py.File(path, "r") as f:
        assert f["samples"].shape[0] >= len(reported)
    with SampleStore.open(path, expect_spec=spec) as store:
        n = len(store)
        assert n >= len(reported)
        expected = base + np.arange(n, dtype=np.float32)[:, None]
        np.testing.assert_array_equal(store.read_all().numpy(), expected)
        np.testing.assert_array_equal(store.steps, np.arange(n))
        assert (store.chains == 7).all()
    with SampleStore.open(path, mode="a") as store:  # a resumed sampler can go on appending
        assert store.append(base, step=-1) == n


@pytest.mark.skipif("HDF5_USE_FILE_LOCKING" in os.environ, reason="HDF5 file locking overridden")
def test_second_process_is_refused_while_a_writer_holds_the_file(tmp_path):
    path = tmp_path / "s.h5"
    opener = f"from apd.samplers.store import SampleStore\nSampleStore.open({str(path)!r})"
    with SampleStore.create(path, SPEC, META) as store:
        store.append(row(0), step=0)
        result = subprocess.run([sys.executable, "-c", opener], capture_output=True, text=True, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert result.returncode == 1
    assert f"ArtifactError: {path}: in use by another process" in result.stderr


# ------------------------------------------------------------------------------------------ joined stores


def test_joined_store_maps_every_shard_row_in_chain_order_without_copying(tmp_path):
    from apd.samplers.store_join import join_stores

    write_shard(tmp_path / "s-0.h5", [0, 2, 4], 6)
    write_shard(tmp_path / "s-1.h5", [1, 3], 6, compression="lzf")
    assert join_stores(tmp_path / "joined.h5", [tmp_path / "s-0.h5", tmp_path / "s-1.h5"], meta={"m": 1}) == 30
    with h5py.File(tmp_path / "joined.h5", "r") as file:  # the samples stay in the shards
        assert file["samples"].is_virtual and file["samples"].id.get_storage_size() == 0
    with SampleStore.open(tmp_path / "joined.h5") as store:
        assert len(store) == 30 and store.meta == {"m": 1} and store.spec == SPEC
        assert store.chains.tolist() == [c for c in range(5) for _ in range(6)]
        np.testing.assert_array_equal(store.read_all().numpy(),
                                      np.stack([row(100 * c + k) for c in range(5) for k in range(6)]))
        np.testing.assert_array_equal(store.read([29, 0, 7, 8]).numpy(), np.stack([row(405), row(0), row(101),
                                                                                     row(102)]))
        np.testing.assert_array_equal(store.steps, [10 * k for _ in range(5) for k in range(6)])
        np.testing.assert_allclose(store.lrs, [0.1 * c for c in range(5) for _ in range(6)])
        np.testing.assert_array_equal(store.log_liks, [-k - c for c in range(5) for k in range(6)])
        assert store.shards == [tmp_path / "s-0.h5", tmp_path / "s-1.h5"]
        with pytest.raises(ValueError, match="read-only"):
            store.append(row(0), step=0)
    with pytest.raises(ArtifactError, match="joined store .* is read-only"):
        SampleStore.open(tmp_path / "joined.h5", mode="a")


def test_joined_store_moves_with_its_folder_and_records_the_names_it_is_given(tmp_path):
    from apd.samplers.store_join import join_stores

    folder = tmp_path / "a"
    folder.mkdir()
    write_shard(folder / "s-0.partial.h5", [0], 4)
    write_shard(folder / "s-1.partial.h5", [1], 4)
    join_stores(folder / "joined.h5", [folder / "s-0.partial.h5", folder / "s-1.partial.h5"],
                names=["s-0.h5", "s-1.h5"])
    for rank in (0, 1):
        (folder / f"s-{rank}.partial.h5").rename(folder / f"s-{rank}.h5")
    folder.rename(tmp_path / "b")
    with SampleStore.open(tmp_path / "b" / "joined.h5") as store:
        np.testing.assert_array_equal(store.read([4]).numpy(), row(100)[None])
        assert store.shards == [tmp_path / "b" / "s-0.h5", tmp_path / "b" / "s-1.h5"]


def test_joined_store_with_a_missing_or_truncated_shard_is_one_clear_error(tmp_path):
    from apd.samplers.store_join import join_stores

    write_shard(tmp_path / "s-0.h5", [0], 5)
    write_shard(tmp_path / "s-1.h5", [1], 5)
    join_stores(tmp_path / "joined.h5", [tmp_path / "s-0.h5", tmp_path / "s-1.h5"])
    with SampleStore.open(tmp_path / "s-1.h5", mode="a") as shard:
        shard.truncate(3)
    with pytest.raises(ArtifactError, match=r"shard .*s-1.h5 holds 3 samples, the joined store reads 5"):
        SampleStore.open(tmp_path / "joined.h5")
    (tmp_path / "s-1.h5").unlink()
    with pytest.raises(ArtifactError, match=r"shard .*s-1.h5 is missing"):
        SampleStore.open(tmp_path / "joined.h5")


def test_join_refuses_split_chains_open_shards_and_other_networks(tmp_path):
    from apd.samplers.store_join import join_stores

    write_shard(tmp_path / "a.h5", [0, 1], 3)
    write_shard(tmp_path / "b.h5", [1], 3)
    with pytest.raises(ArtifactError, match="chain 1 is in .*a.h5 and .*b.h5"):
        join_stores(tmp_path / "j.h5", [tmp_path / "a.h5", tmp_path / "b.h5"])
    with SampleStore.create(tmp_path / "c.h5", SPEC, META) as store:
        store.append_many(rows(4), steps=[0, 1, 1, 2], chains=[5, 5, 6, 5])
    with pytest.raises(ArtifactError, match="chain 5's rows in .*c.h5 are not evenly spaced"):
        join_stores(tmp_path / "j.h5", [tmp_path / "c.h5"])
    with SampleStore.create(tmp_path / "other.h5", OTHER_SPEC, META) as store:
        store.append(np.zeros(OTHER_SPEC.numel), step=0, chain=7)
    with pytest.raises(ArtifactError, match="different network"):
        join_stores(tmp_path / "j.h5", [tmp_path / "a.h5", tmp_path / "other.h5"])
    writing = SampleStore.create(tmp_path / "open.h5", SPEC, META)
    writing.append(row(0), step=0, chain=9)
    writing._file.flush()
    try:
        with pytest.raises(ArtifactError, match="still being written"):
            join_stores(tmp_path / "j.h5", [tmp_path / "a.h5", tmp_path / "open.h5"])
    finally:
        writing.close()


def test_evenly_spaced_rows_of_a_joined_store_take_every_chain_equally(tmp_path):
    """Consumers pick 'evenly spaced' rows over the whole store (the codec fit, the SGLD reference of
    distillation, the MoG fit): ordered by chain, that is an equal share of each equal-length chain."""
    from apd.distillation.training import evenly_spaced
    from apd.samplers.store_join import join_stores

    write_shard(tmp_path / "s-0.h5", [0, 2], 50)
    write_shard(tmp_path / "s-1.h5", [1], 50)
    join_stores(tmp_path / "joined.h5", [tmp_path / "s-0.h5", tmp_path / "s-1.h5"])
    with SampleStore.open(tmp_path / "joined.h5") as store:
        for k in (3, 10, 31, 100, 149):
            counts = np.bincount(store.chains[evenly_spaced(len(store), k)], minlength=3)
            assert counts.max() - counts.min() <= 1, (k, counts)


def test_chain_partition_gives_each_chains_rows_and_share():
    ids, rows, shares = chain_partition([3, 1, 3, 3])
    assert ids == [1, 3] and [r.tolist() for r in rows] == [[1], [0, 2, 3]]
    torch.testing.assert_close(shares, torch.tensor([0.25, 0.75]))
