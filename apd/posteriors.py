"""One interface for every method the evaluation compares: ``predict_probs(x, k) -> [K, N, C]``.

- :class:`PointEstimate` — one network (the SGD baseline); K is always 1.
- :class:`MCDropout` — one network with dropout active: k passes, each a fresh mask (Gal &
  Ghahramani, 2016).
- :class:`SGLDSamples` — k rows drawn without replacement from the sample store.
- :class:`APDGenerator` — k weight vectors from the distilled generator (Wang et al., 2018).
- :class:`GaussianMixture` — a diagonal-covariance mixture of Gaussians fit to SGLD samples with
  scikit-learn (the paper's storage baseline).

Weight-space methods also have ``sample_weights(k) -> [K, D]``; their predictions go through the
batched :func:`apd.nets.predict_probs`. Randomness comes from the ``generator`` argument, so a seeded
evaluation is reproducible.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np
import torch
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture
from torch import Tensor, nn

from apd.baselines import mc_dropout_probs
from apd.distill import DistilledGenerator, load_generator
from apd.nets import ParamSpec, predict_probs
from apd.store import SampleStore


class Posterior(ABC):
    """A predictive ensemble: ``predict_probs(x, k)`` gives the class probabilities of k members."""

    name: str

    @abstractmethod
    def predict_probs(self, x: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
        """p_k(y | x) for k members: [K, N, C]."""

    @abstractmethod
    def stored_parameters(self) -> int:
        """Numbers this method keeps at test time (its storage cost)."""


class WeightSpacePosterior(Posterior):
    """A distribution over flat weight vectors of one MLP."""

    spec: ParamSpec
    device: torch.device

    @abstractmethod
    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k weight vectors [K, D] on ``self.device``."""

    def predict_probs(self, x: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
        return predict_probs(self.spec, self.sample_weights(k, generator), x.to(self.device))


class PointEstimate(WeightSpacePosterior):
    """A single network θ̂: every draw is θ̂, so the ensemble has one member."""

    def __init__(self, module: nn.Module, name: str = "sgd") -> None:
        self.name, self.spec = name, ParamSpec.from_module(module)
        self.weights = self.spec.flatten(module).unsqueeze(0)
        self.device = self.weights.device

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return self.weights

    def stored_parameters(self) -> int:
        return self.spec.numel


class MCDropout(Posterior):
    """MC dropout: the predictive (1/k) Σ_t p(y | x, mask_t) over k stochastic passes."""

    def __init__(self, module: nn.Module, name: str = "mcdropout") -> None:
        self.name, self.module, self.spec = name, module, ParamSpec.from_module(module)
        self.device = next(module.parameters()).device

    def predict_probs(self, x: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
        if generator is None:
            return mc_dropout_probs(self.module, x.to(self.device), k)
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=generator.device)))
            return mc_dropout_probs(self.module, x.to(self.device), k)

    def stored_parameters(self) -> int:
        return self.spec.numel


class SGLDSamples(WeightSpacePosterior):
    """Rows of a sample store, k drawn without replacement per call (read from disk, never all loaded)."""

    def __init__(self, store: SampleStore, device: torch.device | str = "cpu", name: str = "sgld") -> None:
        self.name, self.store, self.spec, self.device = name, store, store.spec, torch.device(device)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        if k > len(self.store):
            raise ValueError(f"asked for {k} SGLD samples, the store holds {len(self.store)}")
        rows = torch.randperm(len(self.store), generator=generator)[:k]
        return self.store.read(rows.numpy()).to(self.device)

    def stored_parameters(self) -> int:
        return len(self.store) * self.spec.numel


class APDGenerator(WeightSpacePosterior):
    """The distilled generator: θ = decode(G(z)), z ~ N(0, I)."""

    def __init__(self, model: DistilledGenerator, spec: ParamSpec, name: str = "apd") -> None:
        self.name, self.model, self.spec = name, model, spec
        self.device = next(model.parameters()).device

    @classmethod
    def load(cls, path: str | Path, expect_spec: ParamSpec | None = None,
             device: torch.device | str = "cpu") -> APDGenerator:
        """Rebuild from ``generator.pt`` + ``generator.json``; a spec mismatch is an ArtifactError."""
        model, manifest = load_generator(Path(path), expect_spec, device)
        return cls(model, ParamSpec.from_json(manifest["spec"]))

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        if generator is not None and generator.device != self.device:
            generator = torch.Generator(device=self.device).manual_seed(
                int(torch.randint(2**62, (1,), generator=generator)))
        return self.model.sample_weights(k, generator)

    def stored_parameters(self) -> int:
        return self.model.stored_parameters()


class GaussianMixture(WeightSpacePosterior):
    """Σ_j π_j N(μ_j, diag(σ_j²)) fit by EM (scikit-learn, diagonal covariances) to SGLD samples."""

    def __init__(self, samples: Tensor, components: int, seed: int = 0, device: torch.device | str = "cpu",
                 spec: ParamSpec | None = None, name: str = "mog") -> None:
        if spec is None or samples.shape[1] != spec.numel:
            raise ValueError("GaussianMixture needs the samples' ParamSpec")
        self.name, self.spec, self.device = name, spec, torch.device(device)
        mixture = SklearnGaussianMixture(n_components=components, covariance_type="diag", max_iter=50,
                                         reg_covar=1e-8, init_params="k-means++", random_state=seed)
        mixture.fit(samples.double().numpy())
        self.components = components
        self.weights = torch.from_numpy(mixture.weights_).float().to(self.device)
        self.means = torch.from_numpy(mixture.means_).float().to(self.device)
        self.stds = torch.from_numpy(np.sqrt(mixture.covariances_)).float().to(self.device)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        which = torch.multinomial(self.weights, k, replacement=True, generator=generator)
        noise = torch.randn(k, self.spec.numel, generator=generator, device=self.device)
        return torch.addcmul(self.means[which], noise, self.stds[which])

    def stored_parameters(self) -> int:
        return self.components * (2 * self.spec.numel + 1)


def parameters_in_samples(posterior: PointEstimate | MCDropout | WeightSpacePosterior) -> float:
    """Storage of a method as a number of D-dimensional weight vectors."""
    return posterior.stored_parameters() / posterior.spec.numel
