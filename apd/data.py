"""Datasets and out-of-distribution (OOD) sets, all in one normalisation.

Every image, in distribution or not, is first brought to pixel values in [0, 1] and then mapped to
[-1, 1] by x ↦ 2x − 1 (:data:`INPUT_RANGE`), so attack budgets are in the paper's units (PGD ε 0.3 in
[-1, 1]). Images are flattened to [N, H·W] float32 tensors; ``Dataset.image_shape`` restores them.

Sources: ``digits`` (scikit-learn, 8×8, embedded); ``fashion-mnist`` (the Debian package
``dataset-fashion-mnist`` or any directory with the four IDX files); ``mnist`` (a directory with the
four IDX files, from ``data_dir`` or ``$APD_DATA_DIR``); ``toy2d`` (two Gaussian blobs in the plane,
:mod:`apd.toy2d`: raw coordinates, no image, its own OOD sets). OOD sets: see :func:`ood_set`.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.model_selection import train_test_split
from torch import Tensor

from apd.config import DataConfig
from apd.errors import ConfigError, DataError
from apd.toy2d import OOD_SETS as TOY2D_OOD
from apd.toy2d import toy2d_ood, toy2d_splits

INPUT_RANGE = (-1.0, 1.0)
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
HOW_TO_GET = {
    "fashion-mnist": "install it with `apt-get install dataset-fashion-mnist`, or pass --data-dir DIR "
                     "with the four Fashion-MNIST IDX files",
    "mnist": "pass --data-dir DIR (or set APD_DATA_DIR) to a directory with the four MNIST IDX files "
             "(train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-…)",
}
BUILTIN_OOD = ("gaussian", "uniform", "photos")
DIRECTORY_OOD = ("notmnist", "omniglot", "cifar10")


def input_range(dataset: str) -> tuple[float, float] | None:
    """The scale the inputs of ``dataset`` are in: :data:`INPUT_RANGE` for images, None for toy2d's raw
    coordinates (any point of the plane)."""
    return None if dataset == "toy2d" else INPUT_RANGE


def normalise(pixels: np.ndarray | Tensor) -> Tensor:
    """Pixels in [0, 1], any shape [N, ...] → float32 [N, prod(...)] in :data:`INPUT_RANGE`."""
    x = torch.as_tensor(np.asarray(pixels, dtype=np.float32))
    return (2.0 * x - 1.0).reshape(x.shape[0], -1)


@dataclass
class Dataset:
    """Normalised, flattened splits of one classification dataset; ``image_shape`` is ``None`` for
    features that are not an image (toy2d)."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    image_shape: tuple[int, int] | None
    num_classes: int

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])

    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of every split's bytes: identifies the exact data a run saw."""
        digest = hashlib.sha256()
        for t in (self.x_train, self.y_train, self.x_val, self.y_val, self.x_test, self.y_test):
            digest.update(t.numpy().tobytes())
        return digest.hexdigest()[:16]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}


def load_dataset(cfg: DataConfig, seed: int, data_dir: str | None = None) -> Dataset:
    """Load and split the configured dataset; ``data_dir`` (e.g. from ``--data-dir``) overrides
    ``cfg.data_dir``. A missing or malformed dataset raises a one-line :class:`DataError`, an OOD set name
    of no kind this module builds a :class:`ConfigError` (a set of a known kind missing here is only skipped
    when evaluating: :func:`available_ood`)."""
    known = (*BUILTIN_OOD, "digits", "fashion", "mnist", *DIRECTORY_OOD, *TOY2D_OOD, *cfg.ood_dirs)
    if unknown := [name for name in cfg.ood if name not in known]:
        raise ConfigError(f"'data.ood' names {unknown[0]!r}, no OOD set apd builds (choose from "
                          f"{', '.join(dict.fromkeys(known))})")
    if cfg.dataset == "digits":
        return _load_digits(cfg, seed)
    if cfg.dataset == "toy2d":
        splits = toy2d_splits(cfg, seed)
        return Dataset("toy2d", *splits["train"], *splits["val"], *splits["test"], image_shape=None, num_classes=2)
    directory = resolve_data_dir(cfg.dataset, data_dir or cfg.data_dir)
    images, labels, test_images, test_labels = read_idx_dataset(directory, cfg.dataset)
    return _split_official(cfg, seed, images, labels, test_images, test_labels)


def resolve_data_dir(dataset: str, given: str, use_environment: bool = True) -> Path:
    """Where an IDX dataset lives: the given directory, else ``$APD_DATA_DIR`` (for the pipeline's own
    dataset only: ``use_environment``), else the Debian path."""
    if given:
        return Path(given).expanduser()
    if use_environment and os.environ.get("APD_DATA_DIR"):
        return Path(os.environ["APD_DATA_DIR"]).expanduser()
    if dataset == "fashion-mnist":
        return Path(FASHION_MNIST_DIR)
    raise DataError(f"{dataset}: no data directory given; {HOW_TO_GET[dataset]}")


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (plain or gzipped): magic 0x0000 08 ndim, big-endian int32 dims, uint8 data."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as exc:  # gzip's own errors are OSError or EOFError, zlib's are not
        raise DataError(f"{path}: cannot read IDX file: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise DataError(f"{path}: not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: IDX header says {dims} ({int(np.prod(dims))} bytes), file has {data.size}")
    return data.reshape(dims)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def read_idx_dataset(directory: Path, dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four IDX arrays (train images, train labels, test images, test labels) of a directory."""
    if not directory.is_dir():
        raise DataError(f"{dataset}: directory {directory} does not exist; {HOW_TO_GET[dataset]}")
    arrays = {}
    for key, stem in IDX_FILES.items():
        path = _find_idx(directory, stem)
        if path is None:
            raise DataError(f"{dataset}: {directory} has no {stem}[.gz]; {HOW_TO_GET[dataset]}")
        arrays[key] = read_idx(path)
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"{dataset}: {split} images {images.shape} and labels {labels.shape} "
                            "do not match")
    classes = np.unique(arrays["train_labels"])
    if len(classes) < 2 or classes[0] != 0 or classes[-1] != len(classes) - 1:
        raise DataError(f"{dataset}: the training labels in {directory} must be the classes 0 … C − 1 (C ≥ 2), each "
                        f"present; found {len(classes)} distinct labels from {classes[0]} to {classes[-1]}")
    test = arrays["test_labels"]
    if len(test) and test.max() >= len(classes):
        raise DataError(f"{dataset}: a test label in {directory} is {int(test.max())}, not one of the training "
                        f"labels' classes 0 … {len(classes) - 1}")
    return arrays["train_images"], arrays["train_labels"], arrays["test_images"], arrays["test_labels"]


def _load_digits(cfg: DataConfig, seed: int) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = (bunch.images / 16.0).astype(np.float32)
    labels = bunch.target.astype(np.int64)
    n = len(labels)
    train_size = cfg.train_size or n - cfg.val_size - (cfg.test_size or 0)
    test_size = cfg.test_size or n - train_size - cfg.val_size
    if train_size < 10 or test_size < 10 or train_size + cfg.val_size + test_size > n:
        raise DataError(f"digits has {n} images: train {train_size} + val {cfg.val_size} + test "
                        f"{test_size} does not fit (each needs at least 10)")
    _check_stratified("digits", labels, {"data.train_size": train_size, "data.val_size": cfg.val_size,
                                         "data.test_size": test_size})
    index = np.arange(n)
    rest, test = train_test_split(index, test_size=test_size, stratify=labels, random_state=seed)
    train, val = train_test_split(rest, train_size=train_size, test_size=cfg.val_size,
                                  stratify=labels[rest], random_state=seed + 1)
    return _make_dataset("digits", pixels, labels, train, val, pixels[test], labels[test])


def _split_official(cfg: DataConfig, seed: int, images: np.ndarray, labels: np.ndarray,
                    test_images: np.ndarray, test_labels: np.ndarray) -> Dataset:
    """Validation set carved (stratified, seeded) from the official training set; test is official."""
    n = len(labels)
    train_size = cfg.train_size or n - cfg.val_size
    if train_size + cfg.val_size > n:
        raise DataError(f"{cfg.dataset}: train {train_size} + val {cfg.val_size} exceeds the {n} "
                        f"training images")
    _check_stratified(cfg.dataset, labels, {"data.train_size": train_size, "data.val_size": cfg.val_size})
    train, val = train_test_split(np.arange(n), train_size=train_size, test_size=cfg.val_size,
                                  stratify=labels, random_state=seed)
    if cfg.test_size:
        if cfg.test_size > len(test_labels):
            raise DataError(f"{cfg.dataset}: test_size {cfg.test_size} exceeds {len(test_labels)}")
        keep = np.random.default_rng(seed).permutation(len(test_labels))[:cfg.test_size]
        test_images, test_labels = test_images[np.sort(keep)], test_labels[np.sort(keep)]
    pixels = images.astype(np.float32) / 255.0
    return _make_dataset(cfg.dataset, pixels, labels.astype(np.int64), train, val,
                         test_images.astype(np.float32) / 255.0, test_labels.astype(np.int64))


def _check_stratified(dataset: str, labels: np.ndarray, sizes: dict[str, int]) -> None:
    """A :class:`DataError` where a class of ``labels`` has a single item, or naming the first split of
    ``sizes`` (config key → size) smaller than the number of classes: a stratified split gives every class
    at least one item."""
    classes, counts = np.unique(labels, return_counts=True)
    if counts.min() < 2:
        raise DataError(f"{dataset}: class {classes[np.argmin(counts)]} has one item; a stratified split needs two "
                        "of every class")
    classes = len(classes)
    for key, size in sizes.items():
        if size < classes:
            raise DataError(f"{dataset}: '{key}' ({size}) must be at least the number of classes ({classes}): "
                            "the splits are stratified")


def _make_dataset(name: str, pixels: np.ndarray, labels: np.ndarray, train: np.ndarray, val: np.ndarray,
                  test_pixels: np.ndarray, test_labels: np.ndarray) -> Dataset:
    train, val = np.sort(train), np.sort(val)
    return Dataset(
        name=name,
        x_train=normalise(pixels[train]), y_train=torch.from_numpy(labels[train]),
        x_val=normalise(pixels[val]), y_val=torch.from_numpy(labels[val]),
        x_test=normalise(test_pixels), y_test=torch.from_numpy(test_labels),
        image_shape=(pixels.shape[1], pixels.shape[2]),
        num_classes=int(labels.max()) + 1,
    )


# ---------------------------------------------------------------------------------------------------
# Out-of-distribution sets


def available_ood(cfg: DataConfig, dataset: Dataset) -> list[str]:
    """OOD set names that can be built for this dataset with what is installed or configured."""
    if dataset.name == "toy2d":
        return list(TOY2D_OOD)
    names = list(BUILTIN_OOD)
    if dataset.name != "digits":
        names.append("digits")
    if dataset.name != "fashion-mnist" and Path(FASHION_MNIST_DIR).is_dir():
        names.append("fashion")
    if dataset.name != "mnist" and "mnist" in cfg.ood_dirs:
        names.append("mnist")
    names.extend(name for name in DIRECTORY_OOD if name in cfg.ood_dirs)
    return names


OOD_ROLES = ("evaluate", "tuning")


def ood_set(name: str, dataset: Dataset, n: int, seed: int, ood_dirs: dict[str, str] | None = None,
            role: str = "evaluate") -> Tensor:
    """``n`` OOD images for ``dataset``, seeded, resized to its image shape, normalised like it.

    ``role`` keeps the sets that ``apd evaluate`` reports (``evaluate``) apart from the *tuning* pool
    that settings may be chosen on (``tuning``): the two draw from separate random streams and from
    disjoint sources: the top and bottom halves of each photograph, alternate images of the digits,
    the test and the training split of Fashion-MNIST / MNIST, alternate files of a directory set.

    - ``gaussian``: pixels N(m, s²) with the training pixels' mean and std, clipped to [0, 1];
    - ``uniform``: pixels U[0, 1];
    - ``photos``: grey square crops of scikit-learn's bundled sample photographs, resized;
    - ``digits``: scikit-learn's 8×8 digits, upscaled (for 28×28 datasets);
    - ``fashion``: Fashion-MNIST test images from the Debian package, resized; ``mnist``: MNIST test
      images from ``ood_dirs['mnist']`` (never from ``$APD_DATA_DIR``, which names the pipeline's own
      dataset);
    - ``notmnist`` (letter folders of PNGs), ``omniglot`` (``images_background`` alphabet folders of
      PNGs, inverted so strokes are bright like MNIST's), ``cifar10`` (the binary version's ``*.bin``
      batches, to grey): read from ``ood_dirs[name]``.

    For ``toy2d`` (no image) the sets are points in the plane far from the data: ``ring`` and ``box``
    (:func:`apd.toy2d.toy2d_ood`).
    """
    if role not in OOD_ROLES:
        raise ValueError(f"role must be one of {OOD_ROLES}, got {role!r}")
    if dataset.name == "toy2d":  # points in the plane (apd.toy2d), the tuning pool from its own stream
        return toy2d_ood(name, n, seed if role == "evaluate" else seed + 2**32)
    if name not in OOD_BUILDERS:
        raise DataError(f"unknown OOD set {name!r} (known: {', '.join(OOD_BUILDERS)})")
    part = OOD_ROLES.index(role)
    draw = OODDraw(dataset, n, np.random.default_rng([seed, _name_seed(name), part]), part, ood_dirs or {})
    return normalise(OOD_BUILDERS[name](draw))


@dataclass(frozen=True)
class OODDraw:
    """What an OOD builder draws from: the dataset it is for, how many images, the set's seeded stream, and
    ``part`` (0 for the ``evaluate`` role, 1 for ``tuning``: which half of a source it may use)."""

    dataset: Dataset
    n: int
    rng: np.random.Generator
    part: int
    ood_dirs: dict[str, str]

    @property
    def shape(self) -> tuple[int, int]:
        return self.dataset.image_shape


def _gaussian(d: OODDraw) -> np.ndarray:
    pixels01 = (d.dataset.x_train + 1.0) / 2.0
    mean, std = float(pixels01.mean()), float(pixels01.std())
    return np.clip(d.rng.normal(mean, std, size=(d.n, *d.shape)), 0.0, 1.0)


def _uniform(d: OODDraw) -> np.ndarray:
    return d.rng.uniform(0.0, 1.0, size=(d.n, *d.shape))


def _photos(d: OODDraw) -> np.ndarray:
    return _photo_patches(d.n, d.shape, d.rng, half=d.part)


def _digits(d: OODDraw) -> np.ndarray:
    from sklearn.datasets import load_digits

    return _resize(_draw(load_digits().images[d.part::2] / 16.0, d.n, d.rng), d.shape)


def _idx_images(dataset_name: str, key: str) -> Callable[[OODDraw], np.ndarray]:
    """The builder of an IDX dataset's images (``key`` of ``ood_dirs``): its test split for the ``evaluate``
    role, its training split for ``tuning``."""
    def build(d: OODDraw) -> np.ndarray:
        directory = resolve_data_dir(dataset_name, d.ood_dirs.get(key, ""), use_environment=False)
        images = read_idx_dataset(directory, dataset_name)[2 if d.part == 0 else 0]
        return _resize(_draw(images / 255.0, d.n, d.rng), d.shape)
    return build


def _from_directory(name: str, reader: Callable[[Path, int, np.random.Generator, int], np.ndarray],
                    ) -> Callable[[OODDraw], np.ndarray]:
    """The builder of a set read from ``ood_dirs[name]`` by ``reader``."""
    def build(d: OODDraw) -> np.ndarray:
        if name not in d.ood_dirs:
            raise DataError(f"OOD set {name!r} needs a directory: set data.ood_dirs.{name} in the pipeline")
        return _resize(reader(Path(d.ood_dirs[name]).expanduser(), d.n, d.rng, d.part), d.shape)
    return build


def _name_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def _draw(images: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` images drawn without replacement (with replacement when there are fewer than ``n``)."""
    index = rng.choice(len(images), size=n, replace=n > len(images))
    return np.asarray(images)[index]


def _resize(images: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Resize [N, h, w] images in [0, 1] to ``shape`` (bilinear, antialiased when shrinking)."""
    images = np.asarray(images, dtype=np.float32)
    if images.shape[1:] == shape:
        return images
    out = np.empty((len(images), *shape), dtype=np.float32)
    for i, img in enumerate(images):
        resized = Image.fromarray(img, mode="F").resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
        out[i] = np.asarray(resized)
    return np.clip(out, 0.0, 1.0)


def _grey(rgb: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma of [..., 3] RGB values in [0, 255], scaled to [0, 1]."""
    return (rgb[..., :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32)) / 255.0


def _photo_patches(n: int, shape: tuple[int, int], rng: np.random.Generator, half: int) -> np.ndarray:
    """Square crops from the top (``half`` 0) or bottom (1) half of each bundled photograph."""
    from sklearn.datasets import load_sample_images

    photos = []
    for img in load_sample_images().images:
        grey = _grey(np.asarray(img, dtype=np.float32))
        middle = grey.shape[0] // 2
        photos.append(grey[:middle] if half == 0 else grey[middle:])
    patches = np.empty((n, *shape), dtype=np.float32)
    for i in range(n):
        photo = photos[rng.integers(len(photos))]
        size = int(rng.integers(min(shape) * 2, min(photo.shape) // 2))
        top = int(rng.integers(photo.shape[0] - size))
        left = int(rng.integers(photo.shape[1] - size))
        patches[i] = _resize(photo[None, top:top + size, left:left + size], shape)[0]
    return patches


def _load_pngs(paths: list[Path], n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """``n`` of the PNG files ``paths`` (drawn by ``rng``), grey, 28×28, in [0, 1]."""
    if not paths:
        raise DataError(f"{what}: no PNG images found")
    chosen = _draw(np.array(paths, dtype=object), n, rng)
    images = []
    for path in chosen:
        try:
            with Image.open(path) as img:
                images.append(np.asarray(img.convert("L").resize((28, 28), Image.Resampling.BILINEAR),
                                         dtype=np.float32) / 255.0)
        except OSError as exc:
            raise DataError(f"{what}: cannot read {path}: {exc}") from None
    return np.stack(images)


def _read_notmnist(directory: Path, n: int, rng: np.random.Generator, part: int) -> np.ndarray:
    paths = sorted(directory.glob("*/*.png"))[part::2]
    return _load_pngs(paths, n, rng, f"notMNIST ({directory}, letter folders)")


def _read_omniglot(directory: Path, n: int, rng: np.random.Generator, part: int) -> np.ndarray:
    root = directory / "images_background" if (directory / "images_background").is_dir() else directory
    paths = sorted(root.glob("*/*/*.png"))[part::2]
    return 1.0 - _load_pngs(paths, n, rng, f"Omniglot ({root}, alphabet/character folders)")


def _read_cifar10(directory: Path, n: int, rng: np.random.Generator, part: int) -> np.ndarray:
    """CIFAR-10 binary version: records of 1 label byte + 3·1024 channel-planar bytes (32×32 RGB)."""
    files = sorted(directory.glob("*.bin"))
    if not files:
        raise DataError(f"CIFAR-10 ({directory}): no *.bin batches (the binary version) found")
    records = []
    for path in files:
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size % 3073:
            raise DataError(f"CIFAR-10: {path} is not a whole number of 3073-byte records")
        records.append(raw.reshape(-1, 3073)[:, 1:])
    planar = _draw(np.concatenate(records)[part::2], n, rng).reshape(-1, 3, 32, 32).astype(np.float32)
    return _grey(planar.transpose(0, 2, 3, 1))


OOD_BUILDERS: dict[str, Callable[[OODDraw], np.ndarray]] = {  # name → pixels [n, h, w] in [0, 1] (ood_set)
    "gaussian": _gaussian,
    "uniform": _uniform,
    "photos": _photos,
    "digits": _digits,
    "fashion": _idx_images("fashion-mnist", "fashion"),
    "mnist": _idx_images("mnist", "mnist"),
    "notmnist": _from_directory("notmnist", _read_notmnist),
    "omniglot": _from_directory("omniglot", _read_omniglot),
    "cifar10": _from_directory("cifar10", _read_cifar10),
}


def epoch_permutation(n: int, seed: int, epoch: int) -> Tensor:
    """The order of the n training examples in epoch ``epoch`` of the minibatch stream ``seed``: a
    permutation seeded by (seed, epoch) (numpy's ``SeedSequence`` of the pair), on the CPU."""
    state = np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0]
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(state) % 2**63))


def _check_batch_size(n: int, batch_size: int) -> None:
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch size {batch_size} must be between 1 and the {n} training examples")


class MinibatchOrder:
    """Minibatch indices as a pure function of the iteration: epoch e is :func:`epoch_permutation` (seed, e),
    batch t is its slice t mod (N // B). A run resumed at iteration t sees exactly the batches an
    uninterrupted run would, with no sampler state to save."""

    def __init__(self, n: int, batch_size: int, seed: int, device: torch.device | str = "cpu") -> None:
        _check_batch_size(n, batch_size)
        self.n, self.batch_size, self.seed, self.device = n, batch_size, seed, torch.device(device)
        self.batches_per_epoch = n // batch_size
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def indices(self, t: int) -> Tensor:
        epoch, position = divmod(t, self.batches_per_epoch)
        if epoch != self._epoch:
            self._perm = epoch_permutation(self.n, self.seed, epoch).to(self.device)
            self._epoch = epoch
        return self._perm[position * self.batch_size:(position + 1) * self.batch_size]


class MinibatchOrders:
    """The minibatches of several chains at once, chain c's those of ``MinibatchOrder(n, batch_size,
    seeds[c])``: :meth:`indices` gives [C, B]. The next epoch's permutations are built ahead, while the
    current epoch's are in use, on threads of their own (torch's permutation runs without the GIL), since
    each takes a while: 7.5 ms for n = 50,000 on this CPU, so 1,024 chains' would take longer than the 500
    iterations of their epoch on a GPU."""

    def __init__(self, n: int, batch_size: int, seeds: list[int], device: torch.device | str = "cpu") -> None:
        _check_batch_size(n, batch_size)
        self.n, self.batch_size, self.seeds, self.device = n, batch_size, list(seeds), torch.device(device)
        self.batches_per_epoch = n // batch_size
        self._epoch, self._perms = -1, torch.empty(0, dtype=torch.long)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="minibatch-orders")
        self._pool = ThreadPoolExecutor(max(1, min(cores, len(self.seeds))), thread_name_prefix="permutations")
        self._next: tuple[int, Future[Tensor]] | None = None

    def _build(self, epoch: int) -> Tensor:
        perms = self._pool.map(lambda seed: epoch_permutation(self.n, seed, epoch), self.seeds)
        return torch.stack(list(perms)).to(self.device)

    def indices(self, t: int) -> Tensor:
        """Every chain's minibatch of iteration t, [C, B]."""
        epoch, position = divmod(t, self.batches_per_epoch)
        if epoch != self._epoch:
            ahead = self._next
            self._perms = ahead[1].result() if ahead is not None and ahead[0] == epoch else self._build(epoch)
            self._epoch = epoch
            self._next = (epoch + 1, self._ahead.submit(self._build, epoch + 1))
        return self._perms[:, position * self.batch_size:(position + 1) * self.batch_size]
