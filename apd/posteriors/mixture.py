"""A mixture of diagonal Gaussians fit to SGLD samples: the paper's storage baseline.

q(θ) = Σ_j π_j 𝒩(θ; μ_j, diag(σ_j²)), fit by EM (scikit-learn's ``GaussianMixture``, k-means++
initialisation) to samples spread evenly over the store. EM runs until its tolerance is met or
``max_iter`` passes; one that stops before is reported in one line of our own (``converged``) rather
than through scikit-learn's warning.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture
from torch import Tensor

from apd.nets import ParamSpec
from apd.posteriors.base import Posterior

log = logging.getLogger(__name__)

MAX_EM_ITERATIONS = 100


class GaussianMixture(Posterior):
    """Σ_j π_j N(μ_j, diag(σ_j²)) with ``components`` components fit to ``samples`` [n, D] (CPU)."""

    def __init__(self, samples: Tensor, components: int, spec: ParamSpec, seed: int = 0,
                 device: torch.device | str = "cpu", name: str = "mog") -> None:
        if samples.shape[1] != spec.numel:
            raise ValueError(f"samples have {samples.shape[1]} weights, the spec {spec.numel}")
        self.name, self.spec, self.device = name, spec, torch.device(device)
        mixture = SklearnGaussianMixture(n_components=components, covariance_type="diag", max_iter=MAX_EM_ITERATIONS,
                                         reg_covar=1e-8, init_params="k-means++", random_state=seed % 2**32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            mixture.fit(samples.double().numpy())
        self.converged = bool(mixture.converged_)
        if not self.converged:
            log.info("%d-component mixture: EM stopped after %d iterations before its tolerance was met",
                     components, mixture.n_iter_)
        self.components = components
        self.weights = torch.from_numpy(mixture.weights_).float().to(self.device)
        self.means = torch.from_numpy(mixture.means_).float().to(self.device)
        self.stds = torch.from_numpy(np.sqrt(mixture.covariances_)).float().to(self.device)

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        generator = self.on_device(generator)
        which = torch.multinomial(self.weights, k, replacement=True, generator=generator)
        noise = torch.randn(k, self.spec.numel, generator=generator, device=self.device)
        return torch.addcmul(self.means[which], noise, self.stds[which])

    def stored_parameters(self) -> int:
        return self.components * (2 * self.spec.numel + 1)
