"""The interface every method of the evaluation shares: a distribution over the weights of one MLP.

A posterior draws ``sample_weights(k) -> [K, D]`` flat weight vectors (its *members*) and predicts with
them through the batched :func:`apd.nets.predict_probs`: ``predict_probs(x, k) -> [K, N, C]``. Two
capabilities let callers treat every method alike instead of testing types:

- ``max_members()``: how many distinct members it can give (1 for a point estimate, the number kept
  for a finite set of samples, ``None`` for a continuous distribution);
- ``members(k, generator)``: one fixed draw of k members, as a function x ↦ p_k(y | x) [K, N, C] that
  every call shares (an attacker differentiates one fixed network; a detector scores every input with
  the same ensemble).
- ``stored_rows(store, k, generator)``: where a draw of k members is rows of a sample store as stored
  (SGLD's samples, kept ones), those rows, so that predictions of the store's rows made once can be shared
  (:class:`apd.evaluation.stored.StoredPredictions`);
- ``has_weights``: whether members are weight vectors at all. A predictive-only method (the Laplace GLM
  predictive draws logits per input) is scored like the others, but cannot be attacked or compared in
  weight space: ``sample_weights`` raises for it, and attacks and weight-space fidelity leave it out.

Randomness comes from the ``generator`` argument (a ``torch.Generator``), so a seeded evaluation is
reproducible; a generator on another device than the posterior's is reseeded onto it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from apd.nets import ParamSpec, check_input_features, predict_probs
from apd.samplers.store import SampleStore, StoreRows

Members = Callable[[Tensor], Tensor]
RANGE_TOLERANCE = 1e-5  # how far past input_range an input may lie (rounding in whatever scaled it)


class Posterior(ABC):
    """A distribution over flat weight vectors of one MLP (module docstring)."""

    name: str
    spec: ParamSpec
    device: torch.device
    has_weights: bool = True
    precision: str = "float32"  # what its stored numbers are kept at (apd.distillation.precision)
    mean_precision: str = "float32"  # what a stored mean of its weights is kept at, where it keeps one
    input_range: tuple[float, float] | None = None  # the scale predict_probs's inputs must be in (None: any)

    @abstractmethod
    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """min(k, :meth:`max_members`) weight vectors [K, D] on ``self.device``."""

    @abstractmethod
    def stored_parameters(self) -> int:
        """Numbers this method keeps at test time (its storage cost)."""

    def stored_rows(self, store: SampleStore | StoreRows, k: int,
                    generator: torch.Generator | None = None) -> np.ndarray | None:
        """The rows of ``store`` that a draw of k members is, drawn as :meth:`sample_weights` draws them
        (``generator`` advanced alike), where the members are that store's rows as stored; None, with
        ``generator`` untouched, otherwise."""
        return None

    def max_members(self) -> int | None:
        """How many distinct members the method can give (None: as many as asked)."""
        return None

    def ensemble_size(self, k: int) -> int:
        """The members a request for k gives."""
        limit = self.max_members()
        return k if limit is None else min(k, limit)

    def members(self, k: int, generator: torch.Generator | None = None) -> Members:
        """x ↦ p_k(y | x) [K, N, C] for one draw of k members that every call shares."""
        weights = self.sample_weights(k, generator)
        return lambda x: predict_probs(self.spec, weights, x.to(self.device))

    def predict_probs(self, x: Tensor | np.ndarray, k: int, generator: torch.Generator | None = None) -> Tensor:
        """p_k(y | x) for k freshly drawn members: [K, N, C], on this posterior's device.

        ``x`` is a batch of N inputs, [N, features] (or [N, H, W] images), as a tensor on any device or as
        anything ``torch.as_tensor`` takes (a numpy array): it is converted to float32 and moved here. A batch
        of the wrong shape, or (with :attr:`input_range` set, as :func:`apd.load` sets it) values outside the
        scale the pipeline's inputs are in, is a one-line ``ValueError`` saying what was expected."""
        return self.members(k, generator)(self.inputs(x))

    def inputs(self, x: Tensor | np.ndarray) -> Tensor:
        """``x`` as the members take it, float32 on ``self.device``, once checked (:meth:`predict_probs`)."""
        x = torch.as_tensor(x, device=self.device).to(torch.float32)  # never onto torch's default device
        if x.ndim < 2 or len(x) == 0:
            raise ValueError(f"x must be a batch of inputs [N, features] (or [N, H, W] images), got shape "
                             f"{list(x.shape)}" + ("; for one input pass x[None]" if x.ndim == 1 else ""))
        check_input_features(self.spec, x[0].numel())
        if self.input_range is not None:
            low, high = self.input_range
            if not torch.isfinite(x).all():
                raise ValueError("x has NaN or infinite values")
            least, most = x.min().item(), x.max().item()
            if least < low - RANGE_TOLERANCE or most > high + RANGE_TOLERANCE:
                raise ValueError(f"x has values in [{least:g}, {most:g}], outside the pipeline's input range "
                                 f"[{low:g}, {high:g}]: scale pixels p in [0, 1] to 2p − 1 as apd.data.normalise "
                                 "does (8×8 digits' 0–16 values v: v / 8 − 1)")
        return x

    def storage_in_samples(self) -> float:
        """Storage as a number of D-dimensional weight vectors (SGLD samples' worth)."""
        return self.stored_parameters() / self.spec.numel

    def on_device(self, generator: torch.Generator | None) -> torch.Generator | None:
        """``generator``, or a generator on this posterior's device seeded from it. A device named without an
        index ("cuda") is the one a tensor made there lands on (the current "cuda:N"), as a generator's is."""
        if generator is None or _resolved(generator.device) == _resolved(self.device):
            return generator
        seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device))
        return torch.Generator(device=self.device).manual_seed(seed)


def _resolved(device: torch.device | str) -> torch.device:
    """The device a tensor made on ``device`` lands on: "cuda" names the current card, "cuda:N"."""
    return torch.empty(0, device=device).device
