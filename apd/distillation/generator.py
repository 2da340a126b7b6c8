"""The distilled posterior: θ = codec.decode(G(z)), z ~ 𝒩(0, I) (Wang et al., 2018, with the codecs of
:mod:`apd.distillation.codec`), and how it is described, rebuilt and loaded.

A generator is saved as a weights-only state_dict, stored at its precisions
(:meth:`DistilledGenerator.pack`), plus a JSON description (``architecture``) from which
:func:`build_generator` makes modules of the right shapes; :func:`load_generator` joins the two.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from apd.config import DistillConfig
from apd.distillation.chain_generators import ChainGenerators
from apd.distillation.codec import WeightCodec
from apd.distillation.conditioned import ConditionedGenerator
from apd.distillation.gan import Generator
from apd.distillation.kronecker import KroneckerResidual
from apd.distillation.precision import (
    PartPrecisions,
    in_samples,
    module_bytes,
    module_tensors,
    pack_state,
    unpack_state,
)
from apd.errors import ArtifactError
from apd.io import load_torch
from apd.nets import ParamSpec


class DistilledGenerator(nn.Module):
    """θ = codec.decode(G(z)), z ~ N(0, I): the APD posterior approximation over flat weight vectors. ``G``
    is one generator, one per chain (:class:`~apd.distillation.chain_generators.ChainGenerators`) or one
    conditioned on the chain (:class:`~apd.distillation.conditioned.ConditionedGenerator`); ``stored_as``
    says what each part is stored at (default: float32 throughout)."""

    def __init__(self, generator: Generator | ChainGenerators | ConditionedGenerator, codec: WeightCodec,
                 stored_as: PartPrecisions | None = None) -> None:
        super().__init__()
        self.generator, self.codec, self.stored_as = generator, codec, stored_as or PartPrecisions()

    @property
    def precision(self) -> str:
        """What the codec's tensors (and every part not stored otherwise) are stored at."""
        return self.stored_as.codec

    @torch.no_grad()
    def sample_weights(self, k: int, generator: torch.Generator | None = None) -> Tensor:
        return self.codec.decode(self.generator.sample(k, generator=generator), generator=generator)

    def stored_parameters(self) -> int:
        """Numbers stored: the generators' weights (and chain shares and embeddings), the codec's tensors."""
        return sum(t.numel() for t in module_tensors(self))

    def stored_bytes(self) -> int:
        """Bytes of every stored tensor, each at the precision ``stored_as`` gives its part."""
        return module_bytes(self, self.stored_as.of)

    def rounds(self) -> bool:
        """Whether storing loses anything: some part is stored below float32."""
        return self.stored_as.rounds()

    def pack(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """``state`` (this module's state_dict, or one of the same names) as stored: each part at its
        precision (:func:`~apd.distillation.precision.pack_state`)."""
        return pack_state(state, self.stored_as.of)

    def unpack(self, packed: dict[str, Tensor]) -> dict[str, Tensor]:
        """The state_dict :meth:`pack` stored, read back on this module's names and shapes; errors as
        :func:`~apd.distillation.precision.unpack_state`'s."""
        return unpack_state(packed, self.state_dict(), self.stored_as.of)

    def storage_in_samples(self) -> float:
        return in_samples(self.stored_bytes(), self.codec.dim)


def codec_kind(cfg: DistillConfig) -> str:
    """The codec a distill config asks for: ``subspace``, ``standardize`` or ``identity``."""
    if cfg.generator == "subspace":
        return "subspace"
    return "standardize" if cfg.standardize else "identity"


def part_precisions(cfg: DistillConfig) -> PartPrecisions:
    """What a distill config stores each part of its generator at: ``precision``, ``generators_at`` and
    ``mean_at``."""
    return PartPrecisions(cfg.precision, cfg.generators_at, cfg.mean_at)


def architecture(cfg: DistillConfig, dim: int, layer_sizes: list[int], chains: int = 1) -> dict:
    """What :func:`build_generator` needs to rebuild the modules (stored in the generator's manifest);
    ``layer_sizes``: the MLP's (a CNN's head's) sizes, read by a Kronecker residual; ``chains``: the store's
    chains, one generator each when ``cfg.per_chain``, one embedding each when ``cfg.mode_embedding``."""
    kronecker = cfg.uses_kronecker()
    return {"codec": codec_kind(cfg), "dim": dim, "rank": cfg.subspace_rank,
            "residual": cfg.generator == "subspace" and cfg.residual.model == "diagonal",
            "kronecker_rank": cfg.residual.kronecker_rank if kronecker else 0, "layer_sizes": layer_sizes,
            "z_dim": cfg.z_dim, "gen_hidden": cfg.gen_hidden, "critic_hidden": cfg.critic_hidden, "loss": cfg.loss,
            "chains": chains if cfg.per_chain or cfg.mode_embedding else 0, "mode_embedding": cfg.mode_embedding,
            **stored_as_json(part_precisions(cfg))}


def stored_as_json(stored_as: PartPrecisions) -> dict[str, str]:
    """The ``precision``, ``generators_at`` and ``mean_at`` entries of an architecture (:func:`architecture`)."""
    return {"precision": stored_as.codec, "generators_at": stored_as.generators, "mean_at": stored_as.mean}


def build_generator(arch: dict) -> DistilledGenerator:
    """Modules of the shapes ``arch`` describes, ready for a saved state_dict."""
    codec = WeightCodec.empty(arch["codec"], arch["dim"], arch["rank"], arch["residual"])
    if arch.get("kronecker_rank"):
        codec.kronecker = KroneckerResidual(arch["layer_sizes"], arch["kronecker_rank"])
    def generator() -> Generator:
        return Generator(arch["z_dim"], arch["gen_hidden"], codec.code_dim)

    chains = arch.get("chains", 0)  # 0: one generator for the whole store
    shares = torch.full((chains,), 1 / max(chains, 1))  # the saved shares (and embeddings) replace these
    embedding = arch.get("mode_embedding", 0)  # 0: not conditioned on the chain
    if embedding:
        g = ConditionedGenerator(arch["z_dim"], arch["gen_hidden"], codec.code_dim, shares, embedding)
    else:
        g = ChainGenerators([generator() for _ in range(chains)], shares) if chains else generator()
    stored_as = PartPrecisions(arch.get("precision", "float32"), arch.get("generators_at", ""), arch.get("mean_at", ""))
    return DistilledGenerator(g, codec, stored_as)


def load_generator(weights: Path, manifest: dict, expect_spec: ParamSpec | None = None,
                   device: torch.device | str = "cpu") -> tuple[DistilledGenerator, ParamSpec]:
    """Rebuild a saved generator from its weights-only state_dict and its manifest (``spec`` and
    ``architecture``); returns it in eval mode with the spec of the networks it makes. A generator for
    another network, or weights that do not fit the description, is an :class:`ArtifactError`."""
    try:
        spec, arch = ParamSpec.from_json(manifest["spec"]), manifest["architecture"]
    except KeyError as exc:
        raise ArtifactError(f"{weights}: its manifest is not a generator's (no {exc})") from None
    if expect_spec is not None and spec != expect_spec:
        raise ArtifactError(f"{weights}: generator makes weights for a {spec.describe()} network, the pipeline's "
                            f"network is {expect_spec.describe()}; run `apd distill --force`")
    model = build_generator(arch)
    try:
        model.load_state_dict(model.unpack(load_torch(weights)))
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ArtifactError(f"{weights}: does not match its manifest ({str(exc).splitlines()[0]})") from None
    return model.to(device).eval(), spec
