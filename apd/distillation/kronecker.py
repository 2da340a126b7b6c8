"""A Kronecker-factored Laplace model of the posterior's spread outside the principal subspace.

For each linear layer of the MLP, with input a (and a 1 for the bias) and pre-activation z, the Fisher
block of the weights [out, in + 1] is approximated as G ⊗ A (Martens & Grosse, 2015), with

    A = E_x[ã ãᵀ],   G = E_x E_{y ~ p(y|x, θ)}[g gᵀ],   g = ∂(−log p(y | x, θ))/∂z,

taken at the samples' mean θ = μ on training inputs. With N training points and a N(0, λ⁻¹ I) prior, the
Laplace approximation of the layer's posterior (Ritter, Botev & Barber, 2018) has covariance
(N·G ⊗ A + λI)⁻¹; with A = Q_A diag(a) Q_Aᵀ and G = Q_G diag(g) Q_Gᵀ a draw is

    W = Q_G [Z ⊘ sqrt(N·g aᵀ + λ)] Q_Aᵀ,   Z ~ N(0, I).

Unlike a per-weight variance, this puts little spread in the directions the data pins down and much
in those it does not. Only the top-``rank`` eigenpairs of each A are stored; the remaining directions
share the mean of their eigenvalues. The draw is scaled by α (``scale``, see :mod:`apd.distillation.residual`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apd.nets import ParamSpec, mlp


def fisher_factors(layer_sizes: list[int], theta: Tensor, x: Tensor,
                   generator: torch.Generator | None = None) -> list[tuple[Tensor, Tensor]]:
    """(A, G) of every linear layer of ``mlp(layer_sizes)`` at weights ``theta`` on inputs ``x``, one
    label per input drawn from the network's own predictive (the true Fisher, not the empirical one)."""
    net = mlp(layer_sizes)
    ParamSpec.from_module(net).load_into(net, theta)
    h = x.reshape(len(x), -1)
    inputs, pre_activations = [], []
    for module in net:
        if isinstance(module, nn.Linear):
            inputs.append(torch.cat([h.detach(), torch.ones(len(h), 1, device=h.device)], 1))
            h = module(h)
            h.retain_grad()
            pre_activations.append(h)
        else:
            h = module(h)
    labels = torch.multinomial(torch.softmax(h.detach(), -1), 1, generator=generator)[:, 0]
    F.cross_entropy(h, labels, reduction="sum").backward()
    n = len(x)
    return [(a.t() @ a / n, z.grad.t() @ z.grad / n) for a, z in zip(inputs, pre_activations, strict=True)]


class KroneckerResidual(nn.Module):
    """Draws of the Kronecker-factored Laplace posterior of every layer (module docstring), flattened in
    the :class:`~apd.nets.ParamSpec` order of ``mlp(layer_sizes)``. Build with :meth:`fit`; the plain
    constructor makes zero buffers of the right shapes to load a saved state into."""

    def __init__(self, layer_sizes: list[int], rank: int) -> None:
        super().__init__()
        self.layers = [(n_in, n_out, min(rank, n_in + 1)) for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:],
                                                                                 strict=True)]
        for i, (n_in, n_out, k) in enumerate(self.layers):
            self.register_buffer(f"input_basis_{i}", torch.zeros(n_in + 1, k))
            self.register_buffer(f"input_eigenvalues_{i}", torch.zeros(k))
            self.register_buffer(f"input_tail_{i}", torch.zeros(()))  # mean of the other eigenvalues
            self.register_buffer(f"output_basis_{i}", torch.zeros(n_out, n_out))
            self.register_buffer(f"output_eigenvalues_{i}", torch.zeros(n_out))
        self.register_buffer("data_size", torch.zeros(()))
        self.register_buffer("prior_precision", torch.ones(()))
        self.register_buffer("scale", torch.ones(()))

    @classmethod
    def fit(cls, layer_sizes: list[int], rank: int, theta: Tensor, x: Tensor, data_size: int,
            prior_precision: float, generator: torch.Generator | None = None) -> KroneckerResidual:
        """Factors at ``theta`` on inputs ``x`` (:func:`fisher_factors`), for N = ``data_size`` and λ =
        ``prior_precision``; keeps the top-``rank`` eigenpairs of each A."""
        return cls.from_factors(layer_sizes, rank, fisher_factors(layer_sizes, theta, x, generator), data_size,
                                prior_precision)

    @classmethod
    def from_factors(cls, layer_sizes: list[int], rank: int, factors: list[tuple[Tensor, Tensor]], data_size: float,
                     prior_precision: float) -> KroneckerResidual:
        """The model for given (A, G) per layer."""
        model = cls(layer_sizes, rank).to(factors[0][0].device)
        for i, (input_moment, output_moment) in enumerate(factors):
            k = model.layers[i][2]
            a, q_a = torch.linalg.eigh(input_moment.double())
            g, q_g = torch.linalg.eigh(output_moment.double())
            a = a.clamp_min(0).flip(0).float()
            getattr(model, f"input_basis_{i}").copy_(q_a.flip(1)[:, :k])
            getattr(model, f"input_eigenvalues_{i}").copy_(a[:k])
            getattr(model, f"input_tail_{i}").fill_(float(a[k:].mean()) if k < len(a) else 0.0)
            getattr(model, f"output_basis_{i}").copy_(q_g)
            getattr(model, f"output_eigenvalues_{i}").copy_(g.clamp_min(0))
        model.data_size.fill_(data_size)
        model.prior_precision.fill_(prior_precision)
        return model

    def sample(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        """k draws [k, D], times ``scale``."""
        device = self.scale.device
        parts = []
        for i, (n_in, n_out, rank) in enumerate(self.layers):
            q_a, a = getattr(self, f"input_basis_{i}"), getattr(self, f"input_eigenvalues_{i}")
            q_g, g = getattr(self, f"output_basis_{i}"), getattr(self, f"output_eigenvalues_{i}")
            precision = self.data_size * g[:, None] * a[None, :] + self.prior_precision  # [out, rank]
            z = torch.randn(k, n_out, rank, generator=generator, device=device) / precision.sqrt()
            layer = torch.einsum("go,nor,ar->nga", q_g, z, q_a)  # [k, out, in + 1]
            if rank < n_in + 1:  # the other directions of A, all with eigenvalue input_tail
                tail = self.data_size * g * getattr(self, f"input_tail_{i}") + self.prior_precision
                z = torch.randn(k, n_out, n_in + 1, generator=generator, device=device) / tail.sqrt()[:, None]
                z = torch.einsum("go,noa->nga", q_g, z)
                layer += z - (z @ q_a) @ q_a.t()
            parts += [layer[:, :, :n_in].reshape(k, -1), layer[:, :, n_in]]
        return torch.cat(parts, 1).mul_(self.scale)
