"""Laplace approximations of the SGD network (laplace-torch) as weight-space posteriors.

A Laplace approximation is the Gaussian N(θ̂, P⁻¹) around the trained network θ̂ with precision
P = GGN(θ̂) + P₀, the generalised Gauss–Newton matrix of the summed training NLL plus a diagonal
Gaussian prior precision P₀ (Daxberger et al., 2021, "Laplace Redux"). Two structures are provided:

- :func:`fit_kfac` — all weights, the GGN Kronecker-factored per parameter tensor (KFAC): a Linear
  weight's block is B ⊗ A (B [out, out] over output gradients, A [in, in] over inputs, matching the
  row-major order of the flat vector), a bias's block is a full [out, out] matrix; the prior is added
  exactly in the factors' eigenbasis.
- :func:`fit_last_layer` — the last Linear layer's weight and bias with a full GGN and covariance; every
  earlier layer stays at the SGD weights.

laplace-torch computes the curvature (its curvlinops backend) and draws from N(θ̂, P⁻¹) (its
``sample``, which takes a ``torch.Generator``). laplace-torch orders parameters as
``model.parameters()`` and flattens each row-major, which is exactly :class:`apd.nets.ParamSpec`'s
order (checked when fitting), so draws are flat vectors [K, D] like every other weight-space method's.

How the hyperparameters are chosen:

1. **Prior precision** P₀ by maximising laplace-torch's Laplace approximation to the log marginal
   likelihood of the training data over log-precisions (L-BFGS), one precision per parameter tensor by
   default (``prior="layerwise"``: weight and bias of each layer apart), or one (``prior="scalar"``).
2. **Posterior scale** τ on the validation split only: draws are θ = θ̂ + τ·(θ_L − θ̂) with θ_L ~ the
   Laplace posterior, i.e. covariance τ²·P⁻¹ (the posterior of likelihood and prior both tempered by
   T = τ²). τ is the value of ``scales`` whose sampled ensemble (``val_draws`` networks, the same
   standard normals for every τ) has the lowest validation NLL; with ``nll_tolerance`` > 0, the largest
   τ whose validation NLL is within that many nats of the lowest. The GLM predictive gets its own τ
   (``glm_scale``), chosen by the same rule on the validation NLL of the probit GLM predictive.
   ``scales=(1.0,)`` gives the untempered Laplace posterior.

Everything is fitted, drawn and predicted on the device of ``net``'s weights. laplace-torch's fit makes
tensors without naming a device (its curvlinops backend multiplies the full GGN by ``torch.eye(n)``, and
the DataLoader draws its seed into ``torch.empty(())``), which on a CUDA network stops the last-layer fit
with a device mismatch; so the fit runs with the weights' device as torch's default. Everything else it
and this module make names its device (tests/posteriors/test_laplace.py checks that no fit or prediction
makes a tensor on any other device).

The training split fits the curvature and the prior; the validation split chooses τ; nothing here
sees the test split. Measured on digits (``benchmarks/laplace_digits.py``): the marginal likelihood
picks priors far wider than the trained weights (per-tensor precisions 4.8–141, standard deviations
0.08–0.46, against weight RMS 0.03–0.15; a scalar prior differs little), untempered KFAC draws are poor
networks (23 % mean accuracy), and the validation NLL grows with τ from the SGD network's (KFAC: 0.190
at τ = 0.01, 0.196 at 0.1, 1.57 at 1), so the lowest-NLL rule returns the smallest τ of the grid (draws
≈ the SGD network); ``nll_tolerance=0.01`` keeps a spread (τ = 0.1 for KFAC, 0.3 for the last layer).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from apd.nets import ParamSpec, predict_probs
from apd.posteriors.base import Posterior
from apd.posteriors.laplace_glm import glm_draws, kfac_glm_moments, probit_predictive

# Posterior scales τ tried on the validation split (τ = 1: the Laplace posterior itself).
DEFAULT_SCALES: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
# Elements of one chunk of laplace-torch's Jacobians [n, C, P] (64 M floats, 256 MB), for the full-Hessian
# fit and the GLM predictive, and inputs per chunk of the KFAC GLM moments (which never form J).
_JACOBIAN_CHUNK_ELEMENTS = 2**26
_GLM_CHUNK_INPUTS = 4096


@dataclass
class LaplaceFitInfo:
    """What fitting chose and measured."""

    prior_groups: list[str]
    prior_precision: list[float]
    log_marglik: float
    scales: list[float]
    val_nll: list[float]
    glm_val_nll: list[float]
    fit_seconds: float
    tune_seconds: float


class LaplacePosterior(Posterior):
    """Draws θ = θ̂ + τ·(θ_L − θ̂), θ_L ~ N(θ̂, P⁻¹) from a fitted laplace-torch approximation.

    ``block`` is the slice of the flat vector the approximation covers (all of it for KFAC, the last
    layer for last-layer Laplace); outside it every draw equals the SGD weights exactly.
    """

    def __init__(self, la, spec: ParamSpec, base: Tensor, block: slice, scale: float, glm_scale: float,
                 kind: str, info: LaplaceFitInfo, name: str) -> None:
        self.la, self.spec, self.base, self.block = la, spec, base, block
        self.scale, self.glm_scale, self.kind, self.info, self.name = scale, glm_scale, kind, info, name
        self.device = base.device

    # ----- weight space -----------------------------------------------------------------------------

    def _deviations(self, k: int, generator: torch.Generator | None) -> Tensor:
        """θ_L − θ̂ for k draws of the block, untempered: [k, block size]."""
        return self.la.sample(k, generator=self.on_device(generator)) - self.la.mean

    def _assemble(self, deviations: Tensor, scale: float) -> Tensor:
        weights = self.base.unsqueeze(0).repeat(deviations.shape[0], 1)
        weights[:, self.block] += scale * deviations
        return weights

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k flat weight vectors [K, D] in ParamSpec order; randomness only from ``generator``."""
        return self._assemble(self._deviations(k, generator), self.scale)

    def covariance(self) -> Tensor:
        """Dense covariance τ²·P⁻¹ of the block the draws vary (for small networks and tests)."""
        precision = self.la.posterior_precision
        dense = precision.to_matrix() if hasattr(precision, "to_matrix") else precision
        return torch.linalg.inv(dense.double()).to(dense.dtype) * self.scale**2

    def stored_parameters(self) -> int:
        """The SGD vector D, plus for KFAC each factor's eigenvectors and eigenvalues (n² + n per factor),
        for last-layer Laplace the block's symmetric covariance (p(p+1)/2), plus the prior precisions and τ."""
        extra = len(self.info.prior_precision) + 1
        if self.kind == "kron":
            for vectors, values in zip(self.la.H.eigenvectors, self.la.H.eigenvalues, strict=True):
                extra += sum(q.numel() for q in vectors) + sum(v.numel() for v in values)
        else:
            p = self.block.stop - self.block.start
            extra += p * (p + 1) // 2
        return self.spec.numel + extra

    # ----- GLM (linearised) predictive ----------------------------------------------------------------

    def glm_moments(self, x: Tensor, scale: float | None = None) -> tuple[Tensor, Tensor]:
        """Mean f(x; θ̂) [N, C] and covariance τ²·J P⁻¹ Jᵀ [N, C, C] of the linearised network's logits
        (J = ∂f/∂θ at θ̂ over the block); ``scale`` τ defaults to ``glm_scale``.

        KFAC over all layers: computed per layer in the factors' eigenbasis from the inputs and output
        gradients of each Linear layer (:func:`kfac_glm_moments`, the cost of a few forward passes);
        otherwise laplace-torch's Jacobians and ``functional_variance``.
        """
        x = x.reshape(x.shape[0], -1).to(device=self.device, dtype=self.base.dtype)
        tau = self.glm_scale if scale is None else scale
        means, variances = [], []
        if self.kind == "kron" and self.block == slice(0, self.spec.numel):
            precision = self.la.posterior_precision
            for i in range(0, x.shape[0], _GLM_CHUNK_INPUTS):
                f_mu, f_var = kfac_glm_moments(self.spec, self.base, precision, x[i:i + _GLM_CHUNK_INPUTS])
                means.append(f_mu)
                variances.append(f_var)
        else:
            chunk = _jacobian_chunk(self._n_classes(), self.la.n_params)
            for i in range(0, x.shape[0], chunk):
                f_mu, f_var = self.la._glm_predictive_distribution(x[i:i + chunk])
                means.append(f_mu.detach())
                variances.append(f_var.detach())
        return torch.cat(means), torch.cat(variances) * tau**2

    def glm_probs(self, x: Tensor, link_approx: Literal["probit", "mc"] = "probit", n_samples: int = 100,
                  generator: torch.Generator | None = None, scale: float | None = None) -> Tensor:
        """The GLM predictive p(y | x) = E_{f ~ N(f(x; θ̂), τ² J P⁻¹ Jᵀ)}[softmax f]: [N, C].

        ``link_approx`` "probit": softmax(f̄ / √(1 + π/8 · diag Σ_f)) (laplace-torch's default
        closed form); "mc": the mean of ``n_samples`` draws of softmax f from ``generator``.
        """
        f_mu, f_var = self.glm_moments(x, scale)
        if link_approx == "probit":
            return probit_predictive(f_mu, f_var)
        if link_approx == "mc":
            return glm_draws(f_mu, f_var, n_samples, self.on_device(generator)).mean(0)
        raise ValueError(f"link_approx must be 'probit' or 'mc', got {link_approx!r}")

    def glm_samples(self, x: Tensor, k: int, generator: torch.Generator | None = None,
                    scale: float | None = None) -> Tensor:
        """k draws softmax(f), f ~ the GLM predictive of each input: [K, N, C]. The draws are
        independent across inputs (marginals per input), so per-input scores (entropy, BALD) are
        well defined but a row is not one function."""
        f_mu, f_var = self.glm_moments(x, scale)
        return glm_draws(f_mu, f_var, k, self.on_device(generator))

    def _n_classes(self) -> int:
        return self.spec.shapes[-1][0]


class LaplaceGLM(Posterior):
    """The GLM (linearised) predictive of a fitted :class:`LaplacePosterior` at its ``glm_scale``, as an
    ensemble of K draws softmax(f), f ~ N(f(x; θ̂), τ² J P⁻¹ Jᵀ) per input (:meth:`LaplacePosterior.glm_samples`).

    Not weight-space (``has_weights`` False): its members are per-input draws of the logits, not
    networks, so there is nothing to attack and ``sample_weights`` raises. ``members(k, generator)``
    fixes one seed: two calls on the same inputs give the same draws. Storage: the Laplace
    approximation's.
    """

    has_weights = False

    def __init__(self, laplace: LaplacePosterior, name: str = "laplace-glm") -> None:
        self.laplace, self.name, self.spec, self.device = laplace, name, laplace.spec, laplace.device

    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError(f"{self.name} is a predictive (GLM) approximation: it has no weight samples")

    def members(self, k: int, generator: torch.Generator | None = None):
        device = generator.device if generator is not None else torch.device("cpu")
        seed = int(torch.randint(2**62, (1,), generator=generator, device=device))

        def probs(x: Tensor) -> Tensor:
            draws = torch.Generator(device=self.device).manual_seed(seed)
            return self.laplace.glm_samples(x.to(self.device), k, draws).float()

        return probs

    def stored_parameters(self) -> int:
        return self.laplace.stored_parameters()


@contextlib.contextmanager
def _quiet_jit_deprecation():
    """Silence torch's `torch.jit.script` deprecation, raised inside laplace-torch's imports and fits."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        yield


def _jacobian_chunk(outputs: int, parameters: int) -> int:
    """Inputs per chunk so that the Jacobians [n, outputs, parameters] hold at most
    :data:`_JACOBIAN_CHUNK_ELEMENTS` floats (at least one input)."""
    return max(1, _JACOBIAN_CHUNK_ELEMENTS // (outputs * parameters))


def _last_linear_name(module: nn.Module) -> str:
    names = [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError("last-layer Laplace needs a network ending in an nn.Linear")
    return names[-1]


def _nll(probs: Tensor, y: Tensor) -> float:
    return -probs[torch.arange(len(y), device=probs.device), y].clamp_min(1e-12).log().mean().item()


def _optimise_prior(la, sizes: list[int], per_tensor: bool, kron: bool, init: float,
                    max_evals: int) -> tuple[Tensor, float]:
    """Maximise laplace-torch's log marginal likelihood over log prior precisions (one per tensor, or one)
    with L-BFGS (strong Wolfe line search; ~10–30 evaluations where Adam needed ~150 steps)."""
    n = len(sizes) if per_tensor else 1
    dtype, device = la.mean.dtype, la.mean.device
    index = torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device))

    def expand(precision: Tensor) -> Tensor:
        # KFAC adds one precision per parameter tensor; a full posterior takes the diagonal.
        return precision if kron or not per_tensor else precision[index]

    log_precision = torch.full((n,), math.log(init), dtype=dtype, device=device, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_precision], lr=1.0, max_iter=max_evals, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-4, tolerance_change=1e-9)

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = -la.log_marginal_likelihood(prior_precision=expand(log_precision.exp()))
        loss.backward()
        return loss

    optimizer.step(closure)
    precision = log_precision.detach().exp()
    la.prior_precision = expand(precision)
    return precision, float(la.log_marginal_likelihood().detach())


def _choose(scales: Sequence[float], nll: list[float], tolerance: float) -> float:
    """The largest τ whose validation NLL is within ``tolerance`` nats of the lowest."""
    best = min(nll)
    return float(max(tau for tau, value in zip(scales, nll, strict=True) if value <= best + tolerance))


def fit_laplace(net: nn.Module, x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor, *,
                subset: Literal["all", "last_layer"] = "all", hessian: Literal["kron", "full"] = "kron",
                prior: Literal["layerwise", "scalar"] = "layerwise", prior_init: float = 1.0,
                marglik_evals: int = 100, scales: Sequence[float] = DEFAULT_SCALES, nll_tolerance: float = 0.0,
                val_draws: int = 32, batch_size: int | None = None, generator: torch.Generator | None = None,
                name: str | None = None) -> LaplacePosterior:
    """Fit a Laplace approximation at the weights of ``net``, an :func:`apd.nets.mlp` (the caller's module
    is not changed), with the prior precision of the highest marginal likelihood and the posterior scales
    τ of the lowest validation NLL (see the module docstring).

    ``nll_tolerance`` > 0 takes instead the largest τ of ``scales`` whose validation NLL is within that
    many nats of the lowest (the widest posterior that costs at most that much on validation), for the
    sampled networks and the GLM predictive alike. ``batch_size`` None: for KFAC the whole training split
    in one batch (the exact factors; laplace-torch sums per-batch factors otherwise); for a full Hessian
    as many inputs as keep one batch's Jacobians [n, C, P] to :data:`_JACOBIAN_CHUNK_ELEMENTS` floats (the
    GGN Σ_n J_nᵀ H_n J_n is a sum over inputs, so the batches add up to the same matrix; fcNN2's last
    layer in one batch of 50,000 inputs would need tens of GB).
    ``generator`` drives the validation draws (default: seeded 0).
    """
    if subset not in ("all", "last_layer") or hessian not in ("kron", "full"):
        raise ValueError(f"unsupported Laplace structure {subset}/{hessian}")
    if prior not in ("layerwise", "scalar"):
        raise ValueError(f"prior must be 'layerwise' or 'scalar', got {prior!r}")
    if not scales or any(s <= 0 for s in scales) or nll_tolerance < 0:
        raise ValueError("scales must be positive and nll_tolerance non-negative")
    try:
        with _quiet_jit_deprecation():
            from laplace import Laplace  # heavy import (torchmetrics), only when a Laplace is fitted
    except ImportError as exc:
        raise ImportError(f"laplace-torch is not usable ({exc}): `make install` installs it, or "
                          "`pip install --no-deps -r requirements-nodeps.txt`") from exc

    model = copy.deepcopy(net).eval()
    for p in model.parameters():
        p.requires_grad_(True)
    spec = ParamSpec.from_module(model)
    if not spec.is_mlp:  # (weight, bias) Linear layers only; linear_layers() raises for other modules
        raise ValueError("the Laplace approximations here are defined for an MLP, not a convolutional network")
    spec.linear_layers()
    base = spec.flatten(model)
    device = base.device
    x_train = x_train.reshape(x_train.shape[0], -1).to(device=device, dtype=base.dtype)
    x_val = x_val.reshape(x_val.shape[0], -1).to(device=device, dtype=base.dtype)
    y_train, y_val = y_train.to(device), y_val.to(device)
    kwargs = {"last_layer_name": _last_linear_name(model)} if subset == "last_layer" else {}
    if batch_size is None:
        fitted = model.get_submodule(kwargs["last_layer_name"]) if subset == "last_layer" else model
        parameters = sum(p.numel() for p in fitted.parameters())
        batch_size = len(y_train) if hessian == "kron" else _jacobian_chunk(spec.layer_sizes[-1], parameters)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size)

    start = time.perf_counter()
    la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=hessian, **kwargs)
    # the fit's forward-mode AD loads torch's scripted decompositions; its tensors made without a device go to
    # the weights' (module docstring)
    with _quiet_jit_deprecation(), torch.device(device):
        la.fit(loader)
    if subset == "all":
        names = list(spec.names)
        block = slice(0, spec.numel)
        tensors = list(la.params)
    else:
        last = kwargs["last_layer_name"]
        names = [f"{last}.{n}" for n, _ in la.model.last_layer.named_parameters()]
        offsets = {n: (a, b) for n, a, b, _ in spec.offsets()}
        block = slice(offsets[names[0]][0], offsets[names[-1]][1])
        tensors = list(la.model.last_layer.parameters())
    if not torch.equal(la.mean.detach(), base[block]):
        raise RuntimeError("laplace-torch's parameter vector does not follow the ParamSpec order")
    sizes = [t.numel() for t in tensors]
    precision, log_marglik = _optimise_prior(la, sizes, prior == "layerwise", hessian == "kron", prior_init,
                                             marglik_evals)
    fit_seconds = time.perf_counter() - start

    start = time.perf_counter()
    groups = names if prior == "layerwise" else ["all"]
    info = LaplaceFitInfo(groups, precision.tolist(), log_marglik, list(scales), [], [], fit_seconds, 0.0)
    post = LaplacePosterior(la, spec, base, block, 1.0, 1.0, hessian, info,
                            name or ("laplace-kfac" if subset == "all" else "laplace-ll"))
    if generator is None:
        generator = torch.Generator(device=device).manual_seed(0)
    deviations = post._deviations(val_draws, generator)  # the same normals for every τ
    f_mu, f_var = post.glm_moments(x_val, scale=1.0)  # the GLM covariance scales as τ²
    for tau in scales:
        probs = predict_probs(spec, post._assemble(deviations, tau), x_val).mean(0)
        info.val_nll.append(_nll(probs, y_val))
        info.glm_val_nll.append(_nll(probit_predictive(f_mu, f_var * tau**2), y_val))
    post.scale = _choose(scales, info.val_nll, nll_tolerance)
    post.glm_scale = _choose(scales, info.glm_val_nll, nll_tolerance)
    info.tune_seconds = time.perf_counter() - start
    return post


def fit_kfac(net: nn.Module, x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor,
             **kwargs) -> LaplacePosterior:
    """KFAC Laplace over all layers (see :func:`fit_laplace` for the options)."""
    return fit_laplace(net, x_train, y_train, x_val, y_val, subset="all", hessian="kron", **kwargs)


def fit_last_layer(net: nn.Module, x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor,
                   **kwargs) -> LaplacePosterior:
    """Full-covariance Laplace over the last Linear layer (see :func:`fit_laplace` for the options)."""
    return fit_laplace(net, x_train, y_train, x_val, y_val, subset="last_layer", hessian="full", **kwargs)
