"""The toy 2-D dataset: two Gaussian blobs in the plane, and its out-of-distribution (OOD) sets.

Class 0 is 𝒩((−1.5, 0), I), class 1 is 𝒩((1.5, 0), I): the means are 3 sd apart, so the classes
overlap a little (the Bayes classifier, x₁ > 0, errs on Φ(−1.5) ≈ 6.7 % of points). Each split has as
many points of each class (one more of class 0 when its size is odd) and is drawn from its own seeded
stream, so changing one split's size leaves the others' points as they were. Features are the raw
coordinates (no image normalisation: there are no pixels); ``Dataset.image_shape`` is ``None``.

OOD sets are points far from both blobs, more than :data:`FAR_SD` sd from each mean:

- ``ring``: radius uniform in [6, 7] around the origin, angle uniform (≥ 4.5 sd from both means);
- ``box``: uniform on the square [−7, 7]², keeping only the points far from both means.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import Tensor

from apd.config import DataConfig
from apd.errors import DataError

MEANS = ((-1.5, 0.0), (1.5, 0.0))  # class 0, class 1
STD = 1.0
FAR_SD = 4.0  # "far from the data": more than this many sd from both means
BOX = 7.0  # the OOD box (and the figure's plane) is [−BOX, BOX]²
RING_RADIUS = (6.0, 7.0)
OOD_SETS = ("ring", "box")
DEFAULT_SIZES = {"train": 200, "test": 1000}  # for train_size / test_size 0
SPLITS = ("train", "val", "test")


def _stream(seed: int, *names: str) -> np.random.Generator:
    """A seeded stream per (seed, names): independent of every other stream of this module."""
    keys = [int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") for name in names]
    return np.random.default_rng([seed, *keys])


def blobs(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points [n, 2] float32 and labels [n] int64: ⌈n/2⌉ of class 0, ⌊n/2⌋ of class 1, shuffled."""
    labels = rng.permutation(np.arange(n) % 2).astype(np.int64)
    means = np.asarray(MEANS, dtype=np.float64)[labels]
    points = means + STD * rng.standard_normal((n, 2))
    return points.astype(np.float32), labels


def toy2d_splits(cfg: DataConfig, seed: int) -> dict[str, tuple[Tensor, Tensor]]:
    """The configured splits of the two blobs, split name → (points [n, 2], labels [n]) (``train_size`` 0:
    200 points, ``test_size`` 0: 1,000); :func:`apd.data.load_dataset` makes them a ``Dataset``."""
    sizes = {"train": cfg.train_size or DEFAULT_SIZES["train"], "val": cfg.val_size,
             "test": cfg.test_size or DEFAULT_SIZES["test"]}
    if min(sizes.values()) < 2:
        raise DataError(f"toy2d: every split needs at least 2 points (one per class), got {sizes}")
    splits = {name: blobs(sizes[name], _stream(seed, "toy2d", name)) for name in SPLITS}
    return {name: (torch.from_numpy(x), torch.from_numpy(y)) for name, (x, y) in splits.items()}


def far_mask(points: Tensor | np.ndarray) -> Tensor:
    """Which points [N, 2] lie more than :data:`FAR_SD` sd from both blob means: bool [N]."""
    points = torch.as_tensor(np.asarray(points, dtype=np.float32))
    means = torch.tensor(MEANS, dtype=torch.float32)
    return (torch.cdist(points, means) > FAR_SD * STD).all(dim=1)


def toy2d_ood(name: str, n: int, seed: int) -> Tensor:
    """``n`` points [n, 2] of the OOD set ``name`` (module docstring), seeded."""
    rng = _stream(seed, "toy2d-ood", name)
    if name == "ring":
        radius = rng.uniform(*RING_RADIUS, size=n)
        angle = rng.uniform(0.0, 2.0 * np.pi, size=n)
        points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    elif name == "box":
        kept: list[np.ndarray] = []
        count = 0
        while count < n:  # about 60 % of the box is far from both means
            candidates = rng.uniform(-BOX, BOX, size=(2 * n, 2))
            candidates = candidates[far_mask(candidates).numpy()]
            kept.append(candidates)
            count += len(candidates)
        points = np.concatenate(kept)[:n]
    else:
        raise DataError(f"unknown OOD set {name!r} for toy2d (known: {', '.join(OOD_SETS)})")
    return torch.from_numpy(points.astype(np.float32))
