from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from apd.config import DataConfig
from apd.data import available_ood, load_dataset, ood_set, read_idx
from apd.errors import ConfigError, DataError
from tests.conftest import FASHION_DIR


def write_idx(path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def write_mnist_like(directory, n_train=300, n_test=50, compress=True, seed=0):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": np.arange(n_test) % 10,
    }
    for stem, array in arrays.items():
        write_idx(directory / (stem + suffix), array, compress)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_idx_reader_round_trip(tmp_path, compress):
    array = np.random.default_rng(1).integers(0, 256, (5, 3, 4)).astype(np.uint8)
    path = tmp_path / ("x.idx" + (".gz" if compress else ""))
    write_idx(path, array, compress)
    np.testing.assert_array_equal(read_idx(path), array)


def test_idx_reader_rejects_bad_files(tmp_path):
    bad_magic = tmp_path / "bad"
    bad_magic.write_bytes(b"\x00\x00\x0d\x01" + struct.pack(">I", 3) + b"abc")
    with pytest.raises(DataError, match="bad magic"):
        read_idx(bad_magic)
    short = tmp_path / "short"
    write_idx(short, np.zeros((4, 2, 2)))
    short.write_bytes(short.read_bytes()[:-3])
    with pytest.raises(DataError, match="header says"):
        read_idx(short)


def test_mnist_directory_split_and_normalisation(tmp_path):
    arrays = write_mnist_like(tmp_path / "mnist")
    cfg = DataConfig(dataset="mnist", data_dir=str(tmp_path / "mnist"), val_size=100)
    data = load_dataset(cfg, seed=0)
    assert data.sizes() == {"train": 200, "val": 100, "test": 50}
    assert data.image_shape == (28, 28) and data.x_train.shape == (200, 784)
    # Test split is the official one, mapped from [0, 255] to [-1, 1].
    expected = torch.from_numpy(arrays["t10k-images-idx3-ubyte"].reshape(50, -1) / 255.0 * 2 - 1).float()
    torch.testing.assert_close(data.x_test, expected)
    # Validation is stratified: 10 of each class.
    assert torch.bincount(data.y_val).tolist() == [10] * 10


def test_an_idx_datasets_test_size_keeps_a_seeded_subset_of_the_official_test_set_in_its_order(tmp_path):
    write_mnist_like(tmp_path / "mnist")

    def test_split(seed: int, test_size: int) -> torch.Tensor:
        cfg = DataConfig(dataset="mnist", data_dir=str(tmp_path / "mnist"), val_size=100, test_size=test_size)
        return load_dataset(cfg, seed=seed).x_test

    official, kept = test_split(0, 0), test_split(0, 20)  # 0: the whole official test set
    rows = [next(i for i in range(50) if torch.equal(official[i], image)) for image in kept]
    assert len(rows) == 20 == len(set(rows)) and rows == sorted(rows)  # official images, in their order
    assert torch.equal(test_split(0, 20), kept) and not torch.equal(test_split(1, 20), kept)
    with pytest.raises(DataError, match="test_size 51 exceeds 50"):
        test_split(0, 51)


@pytest.mark.parametrize(("stem", "row", "label", "message"), [
    ("train-labels-idx1-ubyte", 0, 250, "training labels .* must be the classes 0 … C − 1"),
    ("t10k-labels-idx1-ubyte", 3, 250, "a test label .* is 250, not one of the training labels' classes 0 … 9"),
    ("train-labels-idx1-ubyte", None, None, "class 9 has one item"),
])
def test_labels_a_split_cannot_use_are_one_clear_error(tmp_path, stem, row, label, message):
    arrays = write_mnist_like(tmp_path / "idx", compress=False)
    labels = arrays[stem].copy()
    if row is None:  # class 9 down to one training image
        labels[labels == 9] = 8
        labels[9] = 9
    else:
        labels[row] = label
    write_idx(tmp_path / "idx" / stem, labels)
    with pytest.raises(DataError, match=message):
        load_dataset(DataConfig(dataset="mnist", data_dir=str(tmp_path / "idx"), val_size=50), seed=0)


def test_an_ood_set_of_no_kind_apd_builds_is_a_config_error_before_any_data_is_read():
    with pytest.raises(ConfigError, match="'data.ood' names 'unifrom', no OOD set apd builds"):
        load_dataset(DataConfig(dataset="mnist", data_dir="/nonexistent", ood=["gaussian", "unifrom"]), seed=0)


def test_mnist_plain_files_and_env_var(tmp_path, monkeypatch):
    write_mnist_like(tmp_path / "plain", compress=False)
    monkeypatch.setenv("APD_DATA_DIR", str(tmp_path / "plain"))
    data = load_dataset(DataConfig(dataset="mnist", val_size=50), seed=0)
    assert data.sizes() == {"train": 250, "val": 50, "test": 50}


def test_missing_dataset_messages(tmp_path, monkeypatch):
    monkeypatch.delenv("APD_DATA_DIR", raising=False)
    with pytest.raises(DataError, match="--data-dir"):
        load_dataset(DataConfig(dataset="mnist"), seed=0)
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset(DataConfig(dataset="fashion-mnist", data_dir=str(tmp_path / "nope")), seed=0)
    (tmp_path / "partial").mkdir()
    with pytest.raises(DataError, match="has no train-images-idx3-ubyte"):
        load_dataset(DataConfig(dataset="fashion-mnist", data_dir=str(tmp_path / "partial")), seed=0)


def test_digits_split(digits):
    assert digits.sizes() == {"train": 1000, "val": 300, "test": 497}
    assert digits.image_shape == (8, 8) and digits.num_classes == 10
    assert digits.x_train.min() >= -1 and digits.x_train.max() <= 1
    counts = torch.bincount(digits.y_train, minlength=10).float()
    assert counts.min() >= 95 and counts.max() <= 105  # stratified: ≈ 100 per class
    all_x = torch.cat([digits.x_train, digits.x_val, digits.x_test])
    assert torch.unique(all_x, dim=0).shape[0] >= 1780  # disjoint splits (digits has a few duplicates)


def test_digits_split_is_seeded(digits):
    cfg = DataConfig(dataset="digits", train_size=1000, val_size=300)
    again = load_dataset(cfg, seed=0)
    assert again.fingerprint() == digits.fingerprint()
    other = load_dataset(cfg, seed=1)
    assert other.fingerprint() != digits.fingerprint()


def test_digits_split_that_does_not_fit():
    with pytest.raises(DataError, match="does not fit"):
        load_dataset(DataConfig(dataset="digits", train_size=1700, val_size=300), seed=0)


@pytest.mark.parametrize("name", ["gaussian", "uniform", "photos"])
def test_builtin_ood_sets_match_shape_and_range(digits, name):
    x = ood_set(name, digits, 200, seed=3)
    assert x.shape == (200, 64) and x.dtype == torch.float32
    assert x.min() >= -1 and x.max() <= 1
    assert torch.equal(x, ood_set(name, digits, 200, seed=3))
    assert not torch.equal(x, ood_set(name, digits, 200, seed=4))


def test_gaussian_ood_matches_training_pixel_statistics(digits):
    x = ood_set("gaussian", digits, 2000, seed=0)
    assert abs(float(x.mean()) - float(digits.x_train.mean())) < 0.1


def test_upscaled_digits_for_28x28(tmp_path):
    write_mnist_like(tmp_path / "m")
    data = load_dataset(DataConfig(dataset="mnist", data_dir=str(tmp_path / "m"), val_size=100), seed=0)
    x = ood_set("digits", data, 100, seed=0)
    assert x.shape == (100, 784) and x.min() >= -1 and x.max() <= 1
    assert "digits" in available_ood(DataConfig(dataset="mnist"), data)


def test_directory_ood_sets(tmp_path, digits):
    rng = np.random.default_rng(0)
    for letter in "AB":
        (tmp_path / "notmnist" / letter).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(
                tmp_path / "notmnist" / letter / f"{i}.png")
    char = tmp_path / "omniglot" / "images_background" / "Latin" / "character01"
    char.mkdir(parents=True)
    Image.fromarray(np.full((105, 105), 255, dtype=np.uint8)).save(char / "blank.png")
    (tmp_path / "cifar").mkdir()
    record = np.concatenate([[3], np.full(3072, 255)]).astype(np.uint8)
    np.tile(record, 4).tofile(tmp_path / "cifar" / "data_batch_1.bin")
    dirs = {"notmnist": str(tmp_path / "notmnist"), "omniglot": str(tmp_path / "omniglot"),
            "cifar10": str(tmp_path / "cifar")}
    for name in dirs:
        x = ood_set(name, digits, 10, seed=0, ood_dirs=dirs)
        assert x.shape == (10, 64) and x.min() >= -1 and x.max() <= 1
    # A white Omniglot page has no strokes: inverted, it is all background (-1).
    assert torch.allclose(ood_set("omniglot", digits, 5, 0, dirs), torch.tensor(-1.0))
    # White CIFAR images stay white (+1) in grey.
    assert torch.allclose(ood_set("cifar10", digits, 5, 0, dirs), torch.tensor(1.0), atol=1e-5)
    assert set(dirs) <= set(available_ood(DataConfig(ood_dirs=dirs), digits))


def test_ood_errors(digits, tmp_path):
    with pytest.raises(DataError, match="unknown OOD set 'noise'"):
        ood_set("noise", digits, 10, 0)
    with pytest.raises(DataError, match="data.ood_dirs.notmnist"):
        ood_set("notmnist", digits, 10, 0)
    (tmp_path / "cifar").mkdir()
    np.zeros(100, dtype=np.uint8).tofile(tmp_path / "cifar" / "bad.bin")
    with pytest.raises(DataError, match="3073-byte records"):
        ood_set("cifar10", digits, 10, 0, {"cifar10": str(tmp_path / "cifar")})


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package(digits):
    data = load_dataset(DataConfig(dataset="fashion-mnist", val_size=10000), seed=0)
    assert data.sizes() == {"train": 50000, "val": 10000, "test": 10000}
    assert data.image_shape == (28, 28) and data.num_classes == 10
    assert torch.bincount(data.y_test).tolist() == [1000] * 10
    assert data.x_train.min() == -1 and data.x_train.max() == 1
    fashion_for_digits = ood_set("fashion", digits, 50, seed=0)
    assert fashion_for_digits.shape == (50, 64)
