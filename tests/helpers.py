"""Assertions shared by several test modules."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


def assert_gaussian_moments(
    samples: np.ndarray | torch.Tensor,
    mean: np.ndarray | torch.Tensor,
    cov: np.ndarray | torch.Tensor,
    mean_tol_sd: float = 0.15,
    cov_rel_tol: float = 0.2,
) -> None:
    """Assert that ``samples`` [S, d] have the first two moments of 𝒩(mean, cov).

    Mean: |m̂ᵢ − μᵢ| ≤ mean_tol_sd·√Σᵢᵢ for every coordinate i.
    Covariance, in every direction at once: with Σ = LLᵀ (Cholesky) and the whitened sample covariance
    W = L⁻¹ Σ̂ L⁻ᵀ, require ‖W − I‖₂ ≤ cov_rel_tol, i.e. for every direction v the sample variance
    vᵀΣ̂v is within a factor 1 ± cov_rel_tol of vᵀΣv (so small-variance directions count as much as
    large ones, unlike a Frobenius norm of Σ̂ − Σ).
    """
    x = np.asarray(samples, dtype=np.float64)
    mu = np.asarray(mean, dtype=np.float64)
    sigma = np.asarray(cov, dtype=np.float64)
    assert x.ndim == 2 and x.shape[1] == mu.shape[0] == sigma.shape[0] == sigma.shape[1], (
        f"shapes do not match: samples {x.shape}, mean {mu.shape}, cov {sigma.shape}")

    mean_error_sd = np.abs(x.mean(axis=0) - mu) / np.sqrt(np.diag(sigma))
    assert mean_error_sd.max() <= mean_tol_sd, (
        f"sample mean off by {np.array2string(mean_error_sd, precision=3)} sd (tolerance {mean_tol_sd})")

    chol = np.linalg.cholesky(sigma)
    half_whitened = np.linalg.solve(chol, np.cov(x, rowvar=False))
    whitened = np.linalg.solve(chol, half_whitened.T).T
    ratios = np.linalg.eigvalsh((whitened + whitened.T) / 2)
    assert np.abs(ratios - 1).max() <= cov_rel_tol, (
        f"sample/true variance ratios along the principal directions {np.array2string(ratios, precision=3)} "
        f"(tolerance 1 ± {cov_rel_tol})")


@contextlib.contextmanager
def tensors_stay_on(device: torch.device | str, default: torch.device | str) -> Iterator[None]:
    """``with tensors_stay_on(device, default):`` runs the block with ``default`` as torch's default device and
    fails at the first torch call that makes a tensor on a device other than ``device`` where none of its
    tensor arguments is (a factory call that names no device, or a copy to another device).

    With ``default`` another device than ``device``, every tensor the block makes without naming a device is
    caught: on a machine without a GPU, ``tensors_stay_on("cpu", "meta")`` finds the tensors that a CUDA run
    would leave on the CPU.
    """
    expected = torch.empty(0, device=device).device  # "cuda" as a tensor's device reports it: cuda:0
    with torch.device(default), _StrayTensors(expected):
        yield


class _StrayTensors(TorchFunctionMode):
    """The torch function mode of :func:`tensors_stay_on`: raises AssertionError at a stray tensor, naming the
    function that made it and the line outside torch that called it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device != self.device and t.device not in given:
                caller = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/torch/" not in f.filename)
                raise AssertionError(f"{getattr(func, '__name__', func)} made a tensor on {t.device}, not "
                                     f"{self.device}, at {caller.filename}:{caller.lineno}")
        return out


class RecordedBar:
    """A progress bar that records what it was made with and how far it was moved."""

    made: list[RecordedBar] = []

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        RecordedBar.made.append(self)

    def __enter__(self) -> RecordedBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        self.n += n
