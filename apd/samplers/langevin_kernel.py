"""The SGLD step of C chains as one fused GPU kernel, each chain's Langevin noise from a counter-based
generator keyed by the chain (a Triton kernel; used on CUDA where Triton is installed).

For chain c at iteration t, with θ_c ∈ R^D, its gradient g_c and the step of :func:`apd.samplers.sgld.
langevin_update_`,

    θ_c ← θ_c·(1 − lr/(2·N·prior_std²)) − (lr/2)·g_c + √(lr·T/N)·ξ_c,t,   ξ_c,t[d] = Philox(k_c,t, d),

where Philox is the counter-based generator of Salmon et al. (SC 2011), as Triton's ``tl.randn`` draws it
(a Box–Muller pair of its uniform outputs), with key k_c,t = key_c XOR (t + 1)·φ (φ = 0x9E3779B97F4A7C15,
arithmetic modulo 2⁶⁴) and counter d. ξ_c,t is a pure function of (key_c, t, d): it does not depend on the
other chains of the batch, on their number, or on anything a checkpoint would have to save. One kernel
reads θ and g and writes θ once, where a torch generator per chain would launch C draws per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: the chains draw their noise from torch generators
    triton = None

_GOLDEN = 0x9E3779B97F4A7C15
_BLOCK = 1024


def fused_update_available(device: torch.device) -> bool:
    """Whether the fused kernel runs on ``device``: CUDA with Triton installed."""
    return triton is not None and device.type == "cuda"


def step_mix(t: int) -> int:
    """(t + 1)·φ mod 2⁶⁴ as a signed 64-bit integer: what iteration t XORs into every chain's key."""
    mix = ((t + 1) * _GOLDEN) % 2**64
    return mix - 2**64 if mix >= 2**63 else mix


def step_keys(chain_keys: Tensor, t: int, out: Tensor | None = None) -> Tensor:
    """k_c,t = key_c XOR (t + 1)·φ mod 2⁶⁴ for every chain (int64 [C], on the chains' device; into ``out``
    where given, with no host synchronisation)."""
    return torch.bitwise_xor(chain_keys, step_mix(t), out=out)


def keyed_langevin_update_(theta: Tensor, grad: Tensor, keys: Tensor, coefficients: Tensor) -> None:
    """The module docstring's step for θ [C, D] (contiguous float32, updated in place) with gradients g [C, D],
    the iteration's keys k_c,t [C] (int64, :func:`step_keys`) and ``coefficients`` (float32 [3] on the
    device: a, b, c of :func:`apd.samplers.sgld.langevin_coefficients`, θ ← a·θ − b·g + c·ξ). Every input
    is read on the device, so the launch can be captured in a CUDA graph and replayed with new keys and
    coefficients written into the same tensors."""
    chains, dim = theta.shape
    grid = (chains, triton.cdiv(dim, _BLOCK))
    with torch.cuda.device_of(theta):  # Triton launches on the current device, which may be another card
        _update_kernel[grid](theta, grad.contiguous(), keys, coefficients, dim, BLOCK=_BLOCK)


if triton is not None:

    @triton.jit
    def _update_kernel(theta_ptr, grad_ptr, keys_ptr, coefficients_ptr, dim, BLOCK: tl.constexpr):
        chain = tl.program_id(0)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < dim
        row = chain.to(tl.int64) * dim
        decay = tl.load(coefficients_ptr)
        half_lr = tl.load(coefficients_ptr + 1)
        noise_scale = tl.load(coefficients_ptr + 2)
        theta = tl.load(theta_ptr + row + offsets, mask=inside)
        grad = tl.load(grad_ptr + row + offsets, mask=inside)
        xi = tl.randn(tl.load(keys_ptr + chain), offsets)
        tl.store(theta_ptr + row + offsets, theta * decay - half_lr * grad + noise_scale * xi, mask=inside)
