"""Permutation alignment of MLP weight vectors: every sample moved to the hidden-unit order of one reference.

Permuting the units of hidden layer l by P_l (new unit j = old unit p_l[j]) maps an :func:`apd.nets.mlp`'s
weights to W_l' = P_l W_l P_{l−1}ᵀ, b_l' = P_l b_l (P_0 = P_L = I on the input and output), which computes
exactly the same function. A posterior over θ is therefore symmetric under these permutations, and SGLD
chains visit differently permuted copies of the same modes: the mean of the samples is not a good
network, and a generator of θ has to learn the copies as separate modes. Aligning the samples first
removes the symmetry from the distribution the generator learns, without changing any sample's function.

Weight matching (Ainsworth, Hayase & Srinivasa, 2023, "Git Re-Basin", Algorithm 1) aligns θ_B to a
reference θ_A: for each hidden layer l, with the other layers' permutations held fixed,

    P_l = argmax_P ⟨P, W_l^A (W_l^B P_{l−1}ᵀ)ᵀ + b_l^A b_l^Bᵀ + W_{l+1}^Aᵀ (P_{l+1} W_{l+1}^B)⟩_F,

a linear assignment problem (solved exactly by ``scipy.optimize.linear_sum_assignment``); with one hidden
layer this is the exact minimiser of ‖P θ_B − θ_A‖, with several the layers are updated in turn until no
permutation changes. A set of samples is aligned to a reference that is itself re-estimated, as in
generalised Procrustes analysis: all are matched to the first sample, then repeatedly to the mean of the
aligned set until no permutation changes (each round lowers Σ_i ‖P_i θ_i − θ̄‖²).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from apd.nets import ParamSpec

_CHUNK_ELEMENTS = 2**24  # floats of samples handled at once


def hidden_widths(spec: ParamSpec) -> list[int]:
    """Units per hidden layer of an :func:`~apd.nets.mlp` spec; a permutation array has their sum columns."""
    if not spec.is_mlp:
        raise ValueError("unit alignment permutes an MLP's hidden units; this network has convolution layers")
    return spec.layer_sizes[1:-1]


def identity(spec: ParamSpec, n: int = 1) -> Tensor:
    """The permutations that change nothing, [n, H]."""
    return torch.cat([torch.arange(w) for w in hidden_widths(spec)] or [torch.empty(0, dtype=torch.long)]
                     ).repeat(n, 1)


def _layers(spec: ParamSpec, theta: Tensor) -> list[tuple[Tensor, Tensor]]:
    """(W [k, out, in], b [k, out]) views of θ [k, D] per Linear layer."""
    return [(theta[:, w:w + out * n_in].view(-1, out, n_in), theta[:, b:b + out])
            for w, b, out, n_in in spec.linear_layers()]


def _split(spec: ParamSpec, perms: Tensor) -> list[Tensor]:
    return list(perms.long().split(hidden_widths(spec), dim=1))


def permute(theta: Tensor, spec: ParamSpec, perms: Tensor) -> Tensor:
    """θ [k, D] (or [D]) with each row's hidden units reordered by its permutations [k, H] (or [H], for all
    rows): W_l ← W_l[p_l][:, p_{l−1}], b_l ← b_l[p_l]. A new tensor; the function of every row is unchanged."""
    single = theta.ndim == 1
    theta = theta.reshape(-1, spec.numel)
    perms = perms.reshape(-1, perms.shape[-1]).expand(len(theta), -1)
    layers, parts = _layers(spec, theta), _split(spec, perms)
    out = []
    for i, (weight, bias) in enumerate(layers):
        if i < len(parts):  # the rows of a hidden layer's weight and its bias
            weight = weight.gather(1, parts[i][:, :, None].expand(-1, -1, weight.shape[2]))
            bias = bias.gather(1, parts[i])
        if i > 0:  # the columns that read the hidden layer before
            weight = weight.gather(2, parts[i - 1][:, None, :].expand(-1, weight.shape[1], -1))
        out += [weight.reshape(len(theta), -1), bias]
    result = torch.cat(out, dim=1)
    return result[0] if single else result


def match(samples: Tensor, reference: Tensor, spec: ParamSpec, init: Tensor | None = None,
          sweeps: int = 10) -> Tensor:
    """Weight matching of each row of ``samples`` [k, D] to ``reference`` [D]: permutations [k, H] (int64)
    such that ``permute(samples, spec, P)`` is close to the reference. Several hidden layers: coordinate
    descent from ``init`` (identity by default), at most ``sweeps`` passes over the layers."""
    widths = hidden_widths(spec)
    perms = identity(spec, len(samples)) if init is None else init.long().clone()
    ref = _layers(spec, reference.reshape(1, -1).float())
    chunk = max(1, _CHUNK_ELEMENTS // spec.numel)
    for start in range(0, len(samples), chunk):
        rows = slice(start, start + chunk)
        layers = _layers(spec, samples[rows].float())
        parts = _split(spec, perms[rows])
        for _ in range(sweeps if len(widths) > 1 else 1):
            changed = False
            for h in range(len(widths)):
                w_in, b_in = layers[h]
                w_out = layers[h + 1][0]
                if h > 0:
                    w_in = w_in.gather(2, parts[h - 1][:, None, :].expand(-1, w_in.shape[1], -1))
                if h < len(widths) - 1:
                    w_out = w_out.gather(1, parts[h + 1][:, :, None].expand(-1, -1, w_out.shape[2]))
                # similarity[j, i] of the reference's unit j and the sample's unit i
                similarity = (ref[h][0] @ w_in.transpose(1, 2) + ref[h][1][:, :, None] * b_in[:, None, :]
                              + ref[h + 1][0].transpose(1, 2) @ w_out).double().numpy()
                for r, s in enumerate(similarity):
                    _, col = linear_sum_assignment(s, maximize=True)
                    if not np.array_equal(col, parts[h][r].numpy()):
                        parts[h][r] = torch.from_numpy(col)
                        changed = True
            if not changed:
                break
        perms[rows] = torch.cat(parts, dim=1)
    return perms


def hidden_activations(theta: Tensor, spec: ParamSpec, x: Tensor) -> list[Tensor]:
    """ReLU activations [N, width] of every hidden layer of the network θ [D] on inputs ``x`` [N, ...]."""
    h, out = x.reshape(len(x), -1).float(), []
    for weight, bias in _layers(spec, theta.reshape(1, -1).float())[:-1]:
        h = torch.relu(torch.addmm(bias[0], h, weight[0].t()))
        out.append(h)
    return out


def match_activations(theta: Tensor, reference: Tensor, spec: ParamSpec, x: Tensor) -> Tensor:
    """Activation matching (Ainsworth, Hayase & Srinivasa, 2023, "Git Re-Basin", §3.1) of the network θ [D]
    to ``reference`` [D] on inputs ``x``: for each hidden layer l, with h the standardised activations,

        P_l = argmax_P Σ_j corr(h_l^ref[:, j], h_l^θ[:, p_l(j)]),

    one linear assignment per layer (a unit's activation does not depend on how the layers below are
    ordered, so the layers are matched independently). Returns the permutations [H] for :func:`permute`.
    Unlike weight matching it compares what the units compute on data, not their weights, so weights that
    no input moves (e.g. those of pixels that are always 0) do not enter the cost. By the same token, units
    silent on every input of ``x`` (a ReLU that never fires) have nothing to be matched by: two or more of
    them in one layer are paired in no particular order, which leaves the function on ``x`` unchanged but
    may leave their weights apart."""
    perms = []
    for h_ref, h in zip(hidden_activations(reference, spec, x), hidden_activations(theta, spec, x), strict=True):
        z_ref = (h_ref - h_ref.mean(0)) / h_ref.std(0).clamp_min(1e-6)
        z = (h - h.mean(0)) / h.std(0).clamp_min(1e-6)
        _, col = linear_sum_assignment((z_ref.t() @ z).double().numpy(), maximize=True)
        perms.append(torch.from_numpy(col))
    return torch.cat(perms) if perms else torch.empty(0, dtype=torch.long)


def aligned_mean(samples: Tensor, spec: ParamSpec, perms: Tensor) -> Tensor:
    """Mean of the permuted samples [D], a chunk at a time."""
    chunk = max(1, _CHUNK_ELEMENTS // spec.numel)
    total = torch.zeros(spec.numel, dtype=torch.float64)
    for start in range(0, len(samples), chunk):
        total += permute(samples[start:start + chunk], spec, perms[start:start + chunk]).double().sum(0)
    return (total / len(samples)).float()


def mean_distance(samples: Tensor, spec: ParamSpec, perms: Tensor, reference: Tensor) -> tuple[float, float]:
    """(mean ‖P_i θ_i − θ_ref‖, mean ‖P_i θ_i − θ_ref‖²) over the samples."""
    chunk = max(1, _CHUNK_ELEMENTS // spec.numel)
    dist = torch.cat([(permute(samples[s:s + chunk], spec, perms[s:s + chunk]) - reference).double().norm(dim=1)
                      for s in range(0, len(samples), chunk)])
    return float(dist.mean()), float(dist.square().mean())


@dataclass
class Alignment:
    """Per-sample permutations [n, H] to the ``reference`` [D] (the aligned samples' mean), the rounds taken,
    the samples' mean distance to their mean before and after, and whether aligning was refused (``refused``:
    the identity kept, the reference the unaligned mean)."""

    perms: Tensor
    reference: Tensor
    rounds: int
    distance_before: float
    distance_after: float
    refused: bool = False


def align_set(samples: Tensor, spec: ParamSpec, rounds: int = 20, tol: float = 1e-3) -> Alignment:
    """Align samples [n, D] to their own re-estimated mean (module docstring): match all to the first
    sample, then to the mean of the aligned set, until no permutation changes, a round lowers the mean
    squared distance to the mean by less than the fraction ``tol``, or after ``rounds`` rounds. If the
    aligned set were farther from its mean (in mean squared distance) than the unaligned one from its own,
    the identity is kept."""
    unaligned = identity(spec, len(samples))
    mean = samples.double().mean(0).float()
    before, before_sq = mean_distance(samples, spec, unaligned, mean)
    perms = match(samples, samples[0], spec)
    reference = aligned_mean(samples, spec, perms)
    after, after_sq = mean_distance(samples, spec, perms, reference)
    done = 0
    while done < rounds:
        done += 1
        new = match(samples, reference, spec, init=perms)
        if torch.equal(new, perms):
            break
        new_reference = aligned_mean(samples, spec, new)
        new_after, new_sq = mean_distance(samples, spec, new, new_reference)
        perms, reference, after, gain = new, new_reference, new_after, 1 - new_sq / after_sq
        after_sq = new_sq
        if gain < tol:
            break
    if after_sq > before_sq:
        return Alignment(unaligned, mean, done, before, before, refused=True)
    return Alignment(perms, reference, done, before, after)
