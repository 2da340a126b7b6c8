"""Storing a posterior's numbers at lower precision, and what that storage costs.

Every stored tensor (a kept sample, a generator's weights, a codec's mean, basis and residual factors) is
kept at one of :data:`PRECISIONS` and read back as float32; a module's scalars stay at float32
(:func:`precision_of`):

- ``float32``: as is, 4 bytes a number;
- ``float16``: IEEE half precision, 2 bytes a number: a relative error of at most 2⁻¹¹ from 2⁻¹⁴ ≈ 6.1e-5
  up, an absolute one of at most 2⁻²⁵ below it (subnormals); a value beyond its range (±65,504) is an
  error, not an infinity;
- ``int8``: the tensor flattened and cut into blocks of :data:`CODE_BLOCK` consecutive numbers, each block
  stored as round(v / s) ∈ [−127, 127] with its own float32 scale s = max|v| / 127 (block-wise absmax
  quantisation, as Dettmers et al., 2022, "8-bit optimizers via block-wise quantization", with a linear
  code): 1 + 4/64 bytes a number, and an error of at most s/2 per number;
- ``int4``: the same blocks with codes round(v / s) ∈ [−7, 7], s = max|v| / 7, two codes to a byte (the
  4-bit block-wise absmax code of Dettmers & Zettlemoyer, 2023, "The case for 4-bit precision", with a
  linear code): 1/2 + 4/64 bytes a number, and an error of at most s/2 per number.

Storage is counted in SGLD samples' worth, bytes / (4·D), so a float32 sample costs 1, an int8 one
about 0.27 and an int4 one about 0.14: a budget of S samples buys ⌊S/0.27⌋ int8 samples (⌊S/0.14⌋ int4
ones), and the kept-samples yardstick has to be quantised as well for the comparison to be at equal
storage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from apd.distillation.codec import storage_in_samples

Precision = Literal["float32", "float16", "int8", "int4"]
PRECISIONS: tuple[str, ...] = ("float32", "float16", "int8", "int4")
CODE_BLOCK = 64  # numbers per block of the integer codes, int8 and int4 alike
_CODE_MAX = {"int8": 127, "int4": 7}  # largest code magnitude of each integer precision
PrecisionOf = str | Callable[[str], str]  # one precision for every tensor, or one by the tensor's name


def _check(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def stored_bytes(numel: int, precision: str) -> int:
    """Bytes that one tensor of ``numel`` numbers takes at ``precision`` (int8: its block scales included)."""
    _check(precision)
    if precision == "float32":
        return 4 * numel
    if precision == "float16":
        return 2 * numel
    code_bytes = numel if precision == "int8" else math.ceil(numel / 2)
    return code_bytes + 4 * math.ceil(numel / CODE_BLOCK)


def pack(values: Tensor, precision: str) -> dict[str, Tensor]:
    """``values`` as stored at ``precision`` (module docstring), by part: ``{"": values}`` (float32) or
    ``{"": half}`` (float16); for int8 ``{".int8": codes}`` (int8, one per number of the flattened tensor),
    for int4 ``{".int4": pairs}`` (uint8, codes + 8 of numbers 2i and 2i + 1 in the low and high four bits
    of byte i, a last odd number paired with a zero), each with ``{".scale": scales}`` (float32, one per
    block): :func:`stored_bytes` bytes in all. :func:`unpack` reads them back."""
    _check(precision)
    values = values.detach().float()
    if precision == "float32":
        return {"": values.clone()}
    if precision == "float16":
        half = values.half()
        if bool((torch.isinf(half) & torch.isfinite(values)).any()):
            raise ValueError(f"a value of magnitude {values.abs().max().item():.3g} does not fit float16 "
                             "(largest 65,504)")
        return {"": half}
    flat = values.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros(-flat.numel() % CODE_BLOCK)]).view(-1, CODE_BLOCK)
    code_max = _CODE_MAX[precision]
    scale = padded.abs().amax(1, keepdim=True) / code_max
    codes = torch.where(scale > 0, padded / scale.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    codes = codes.round().clamp(-code_max, code_max).view(-1)[:_code_count(flat.numel(), precision)].clone()
    if precision == "int8":
        return {".int8": codes.to(torch.int8), ".scale": scale.view(-1)}
    nibbles = (codes + 8).to(torch.uint8).view(-1, 2)
    return {".int4": nibbles[:, 0] | (nibbles[:, 1] << 4), ".scale": scale.view(-1)}


def _code_count(numel: int, precision: str) -> int:
    """How many codes :func:`pack` stores for ``numel`` numbers: one each, int4's rounded up to whole bytes."""
    return numel + numel % 2 if precision == "int4" else numel


def _codes(parts: dict[str, Tensor]) -> Tensor:
    """The integer codes (as float32, flattened) that :func:`pack` stored in ``parts``."""
    if ".int8" in parts:
        return parts[".int8"].float()
    pairs = parts[".int4"]
    return torch.stack([pairs & 15, pairs >> 4], 1).view(-1).float() - 8


def unpack(parts: dict[str, Tensor], shape: torch.Size | tuple[int, ...], precision: str) -> Tensor:
    """The float32 tensor of ``shape`` that :func:`pack`'s ``parts`` store; parts of another size are a
    ``ValueError``."""
    _check(precision)
    numel = math.prod(shape)
    if precision in ("float32", "float16"):
        if parts[""].numel() != numel:
            raise ValueError(f"{parts[''].numel()} stored numbers for a tensor of shape {list(shape)}")
        return parts[""].float().reshape(shape)
    blocks = math.ceil(numel / CODE_BLOCK)
    codes = _codes(parts)
    # codes padded to whole blocks are how generators stored before the padding was dropped: read them too
    if codes.numel() not in (_code_count(numel, precision), blocks * CODE_BLOCK) or parts[".scale"].numel() != blocks:
        raise ValueError(f"{codes.numel()} {precision} codes and {parts['.scale'].numel()} scales for a tensor of "
                         f"shape {list(shape)}")
    padded = torch.cat([codes[:numel], codes.new_zeros(blocks * CODE_BLOCK - numel)])
    return (padded.view(-1, CODE_BLOCK) * parts[".scale"].view(-1, 1)).view(-1)[:numel].reshape(shape)


def round_trip(values: Tensor, precision: str) -> Tensor:
    """``values`` (float32) as read back after storing the tensor at ``precision``: :func:`unpack` of
    :func:`pack`; a new tensor of the same shape and device."""
    return unpack(pack(values, precision), values.shape, precision)


def precision_of(tensor: Tensor, precision: str) -> str:
    """The precision a module's floating-point ``tensor`` is stored at when the module is stored at
    ``precision``: float32 for a scalar (0-d: a count, a scale; 4 bytes where int8 and int4 would take 5,
    code and block scale, and float16 could not hold a data size above 65,504), else ``precision``."""
    return "float32" if tensor.dim() == 0 else precision


def _by_name(precision: PrecisionOf) -> Callable[[str], str]:
    """``precision`` as a map from a tensor's name to its precision."""
    return precision if callable(precision) else lambda _name: precision


@dataclass(frozen=True)
class PartPrecisions:
    """What each part of a distilled generator is stored at: the codec's basis, scales and residual factors
    at ``codec``, its mean at ``mean`` and the generator networks (with their chain shares and embeddings)
    at ``generators``; an empty ``mean`` or ``generators`` is ``codec``."""

    codec: str = "float32"
    generators: str = ""
    mean: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "generators", self.generators or self.codec)
        object.__setattr__(self, "mean", self.mean or self.codec)
        for precision in (self.codec, self.generators, self.mean):
            _check(precision)

    def of(self, name: str) -> str:
        """The precision of a distilled generator's state_dict entry ``name`` (``codec.…`` or ``generator.…``)."""
        part, _, rest = name.partition(".")
        return self.generators if part == "generator" else self.of_codec(rest)

    def of_codec(self, name: str) -> str:
        """The precision of a codec's own state_dict entry ``name``."""
        return self.mean if name == "mean" else self.codec

    def codec_only(self) -> PartPrecisions:
        """The codec's parts alone (the generator networks at the codec's precision)."""
        return PartPrecisions(self.codec, mean=self.mean)

    def rounds(self) -> bool:
        """Whether storing loses anything: some part is stored below float32."""
        return {self.codec, self.generators, self.mean} != {"float32"}

    def stored_otherwise(self, generators: str = "generators {}", mean: str = "mean {}") -> list[str]:
        """The parts stored otherwise than the codec, each in words: ``generators`` and ``mean`` with ``{}``
        for the precision (e.g. ``"the codec's mean at {}"``)."""
        return [words.format(precision) for words, precision in ((generators, self.generators), (mean, self.mean))
                if precision != self.codec]

    def describe(self) -> str:
        """``int4``, or ``int4, generators int8, mean int8`` for the parts stored otherwise than the codec."""
        return ", ".join([self.codec, *self.stored_otherwise()])


def pack_state(state: dict[str, Tensor], precision: PrecisionOf) -> dict[str, Tensor]:
    """A state_dict stored at ``precision`` (one for all, or one by name): every floating-point tensor
    ``name`` becomes its :func:`pack` parts at :func:`precision_of` it, ``name`` + part suffix; other
    tensors stay as they are."""
    of = _by_name(precision)
    packed: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            packed[name] = tensor
            continue
        packed.update({name + suffix: part for suffix, part in pack(tensor, precision_of(tensor, of(name))).items()})
    return packed


def unpack_state(packed: dict[str, Tensor], template: dict[str, Tensor], precision: PrecisionOf) -> dict[str, Tensor]:
    """The state_dict :func:`pack_state` stored, read back with the names and shapes of ``template`` (e.g. a
    freshly built module's state_dict); a missing part is a ``KeyError``, a part of the wrong size or one
    the template has no place for a ``ValueError``. A scalar stored at its precision (as modules were stored
    before scalars were kept at float32) reads back too."""
    of = _by_name(precision)

    def stored_at(name: str, tensor: Tensor) -> str:
        return of(name) if tensor.dim() == 0 and name not in packed else precision_of(tensor, of(name))

    def suffixes(name: str, tensor: Tensor) -> list[str]:
        return list(pack(torch.zeros(1), stored_at(name, tensor))) if tensor.is_floating_point() else [""]

    expected = {name + suffix for name, tensor in template.items() for suffix in suffixes(name, tensor)}
    if extra := sorted(set(packed) - expected):
        raise ValueError(f"stored tensor {extra[0]!r} has no place in the module")
    return {name: (unpack({suffix: packed[name + suffix] for suffix in suffixes(name, tensor)}, tensor.shape,
                          stored_at(name, tensor))
                   if tensor.is_floating_point() else packed[name])
            for name, tensor in template.items()}


def named_module_tensors(module: nn.Module) -> list[tuple[str, Tensor]]:
    """Every floating-point parameter and buffer of ``module`` with its name: what saving it stores."""
    return [(name, t) for name, t in (*module.named_parameters(), *module.named_buffers()) if t.is_floating_point()]


def module_tensors(module: nn.Module) -> list[Tensor]:
    """Every floating-point parameter and buffer of ``module``: what saving it stores."""
    return [t for _, t in named_module_tensors(module)]


def module_bytes(module: nn.Module, precision: PrecisionOf) -> int:
    """Bytes of ``module``'s stored tensors at ``precision`` (one for all, or one by name), each tensor
    stored on its own at :func:`precision_of` it."""
    of = _by_name(precision)
    return sum(stored_bytes(t.numel(), precision_of(t, of(name))) for name, t in named_module_tensors(module))


@torch.no_grad()
def round_trip_module_(module: nn.Module, precision: PrecisionOf) -> nn.Module:
    """Replace every stored tensor of ``module`` by its :func:`round_trip` at :func:`precision_of` it under
    ``precision`` (one for all, or one by name), in place; returns ``module``."""
    of = _by_name(precision)
    for name, tensor in named_module_tensors(module):
        tensor.copy_(round_trip(tensor, precision_of(tensor, of(name))))
    return module


def in_samples(nbytes: int, dim: int) -> float:
    """``nbytes`` in SGLD samples' worth: float32 weight vectors of ``dim`` numbers."""
    return storage_in_samples(nbytes / 4, dim)
