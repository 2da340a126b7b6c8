"""The pieces a distillation run is built from, free of any stage or artifact path: the codec fit to
samples, the GAN trainer, batches of real codes, and the validation reference a generator is judged by.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
from torch import Tensor

from apd.config import DistillConfig
from apd.distillation.alignment import Alignment, identity, match, permute
from apd.distillation.chain_generators import ChainTrainers
from apd.distillation.codec import WeightCodec, fit_codec
from apd.distillation.conditioned import ConditionedGenerator, ConditionedTrainer, conditioned_critic, labelled
from apd.distillation.gan import Critic, GANLoss, GANTrainer, Generator, make_loss
from apd.distillation.generator import DistilledGenerator, codec_kind
from apd.distillation.kronecker import KroneckerResidual
from apd.distillation.residual import match_residual_scale
from apd.distillation.selection import ReferencePredictive, generated_gap
from apd.nets import ParamSpec
from apd.samplers.store import SampleStore

log = logging.getLogger(__name__)


def evenly_spaced(n: int, k: int) -> list[int]:
    """min(n, k) row indices spread evenly over 0 … n − 1."""
    return sorted({int(i) for i in torch.linspace(0, n - 1, min(n, k)).round().tolist()})


def make_codec(cfg: DistillConfig, samples: Tensor, layer_sizes: list[int], x_fisher: Tensor, data_size: float,
               prior_precision: float, seed: int, device: torch.device) -> WeightCodec:
    """The codec of ``cfg`` fit to ``samples`` [n, D] (CPU), on ``device``. A Kronecker residual is fit
    at the samples' mean on the inputs ``x_fisher``, for a posterior of ``data_size`` points (N/T) and
    prior precision ``prior_precision`` (1/(prior variance · T))."""
    codec = fit_codec(codec_kind(cfg), samples, cfg.subspace_rank, cfg.generator == "subspace"
                      and cfg.residual.model == "diagonal", seed=seed)
    if cfg.uses_kronecker():
        rng = torch.Generator().manual_seed(seed)
        codec.kronecker = KroneckerResidual.fit(layer_sizes, cfg.residual.kronecker_rank, codec.mean, x_fisher,
                                                data_size, prior_precision, rng)
    return codec.to(device)


def seeded(seed: int, build: Callable[[], tuple]) -> tuple:
    """``build()`` with the global random state seeded with ``seed``, and left as it was after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def seeded_networks(cfg: DistillConfig, code_dim: int, seed: int, device: torch.device) -> tuple[Generator, Critic]:
    """Generator and critic for codes of ``code_dim`` on ``device``, initialised from ``seed`` (the global
    random state left as it was)."""
    return seeded(seed, lambda: (Generator(cfg.z_dim, cfg.gen_hidden, code_dim).to(device),
                                 Critic(code_dim, cfg.critic_hidden).to(device)))


def make_trainer(cfg: DistillConfig, code_dim: int, seed: int, device: torch.device) -> GANTrainer:
    """Generator and critic (:func:`seeded_networks` of ``seed``) and their trainer (stream ``seed``); ``lr``
    0 takes the loss's default."""
    return GANTrainer(*seeded_networks(cfg, code_dim, seed, device), _loss(cfg), lr=cfg.lr or None,
                      betas=(cfg.beta1, cfg.beta2), seed=seed)


def make_chain_trainers(cfg: DistillConfig, code_dim: int, seeds: list[int], shares: Tensor,
                        device: torch.device) -> ChainTrainers:
    """One generator and critic per chain of ``shares``, chain j's as :func:`make_trainer` of ``seeds[j]``
    makes them, trained as one (:class:`~apd.distillation.chain_generators.ChainTrainers`)."""
    generators, critics = zip(*(seeded_networks(cfg, code_dim, seed, device) for seed in seeds), strict=True)
    return ChainTrainers(generators, critics, shares.to(device), _loss(cfg), lr=cfg.lr or None,
                         betas=(cfg.beta1, cfg.beta2), seeds=seeds)


def make_conditioned_trainer(cfg: DistillConfig, code_dim: int, seed: int, shares: Tensor,
                             device: torch.device) -> ConditionedTrainer:
    """One generator conditioned on the chains of ``shares`` by ``cfg.mode_embedding`` numbers each, its
    critic reading the chain (:mod:`~apd.distillation.conditioned`), initialised from ``seed``, and their
    trainer (stream ``seed``)."""
    generator, critic = seeded(seed, lambda: (
        ConditionedGenerator(cfg.z_dim, cfg.gen_hidden, code_dim, shares, cfg.mode_embedding).to(device),
        conditioned_critic(code_dim, cfg.critic_hidden, len(shares)).to(device)))
    return ConditionedTrainer(generator, critic, _loss(cfg), lr=cfg.lr or None, betas=(cfg.beta1, cfg.beta2),
                              seed=seed)


def _loss(cfg: DistillConfig) -> GANLoss:
    """The GAN objective ``cfg`` names, with its hyper-parameter."""
    return make_loss(cfg.loss, gp_weight=cfg.gp_weight, clip=cfg.clip)


def store_permutations(store: SampleStore, spec: ParamSpec, rows: list[int], fit: Alignment) -> Tensor:
    """Permutations [len(store), H] aligning every row of ``store`` to ``fit.reference``: ``fit``'s own for
    its ``rows``, the others matched to the reference 1,000 rows at a time; the identity for every row where
    ``fit`` refused to align (its reference then the unaligned mean, which no row is aligned to)."""
    perms = identity(spec, len(store))
    if fit.refused:
        return perms
    perms[rows] = fit.perms
    rest = sorted(set(range(len(store))) - set(rows))
    for i in range(0, len(rest), 1000):
        chunk = rest[i:i + 1000]
        perms[chunk] = match(store.read(chunk), fit.reference, spec)
    return perms


def encode_store(store: SampleStore, codec: WeightCodec, device: torch.device | str, perms: Tensor | None = None,
                 chunk: int = 1000) -> Tensor:
    """The codes [len(store), code_dim] of every row of ``store`` on ``device``, each row's hidden units
    permuted by its row of ``perms`` first (None: as stored), read ``chunk`` rows at a time."""
    parts = []
    for start in range(0, len(store), chunk):
        theta = store.read_all(start, min(len(store), start + chunk))
        if perms is not None:
            theta = permute(theta, store.spec, perms[start:start + chunk])
        parts.append(codec.encode(theta.to(device)))
    return torch.cat(parts)


class StoreBatches:
    """Random real batches, as codes, from a sample store: held in memory when small enough. With
    ``perms`` [len(store), H] (and ``spec``) each row is permuted (:func:`~apd.distillation.alignment.permute`)
    as it is read. :meth:`restricted` gives batches from some rows only (one chain's), :meth:`with_labels`
    batches whose rows carry a label each (their chain's) as a last column."""

    def __init__(self, store: SampleStore, codec: WeightCodec, batch_size: int, in_memory_gb: float,
                 seed: int, device: torch.device, perms: Tensor | None = None, spec: ParamSpec | None = None) -> None:
        self.store, self.codec, self.batch_size, self.device = store, codec, batch_size, device
        self.perms, self.spec = perms, spec
        self.rng = torch.Generator().manual_seed(seed)
        self.rows: Tensor | None = None  # None: every row of the store
        self.labels: Tensor | None = None  # None: codes only
        n, code_dim = len(store), codec.code_dim
        self.codes = None
        if n * code_dim * 4 <= in_memory_gb * 2**30:
            self.codes = encode_store(store, codec, device, perms)

    def _encode(self, theta: Tensor, rows: slice | Tensor) -> Tensor:
        if self.perms is not None:
            theta = permute(theta, self.spec, self.perms[rows])
        return self.codec.encode(theta.to(self.device))

    def restricted(self, rows: Tensor, seed: int) -> StoreBatches:
        """Batches drawn uniformly from the store's ``rows`` only, by a generator seeded with ``seed``; the
        codes held in memory are shared, not encoded again."""
        batches = copy.copy(self)
        batches.rows, batches.rng = rows, torch.Generator().manual_seed(seed)
        return batches

    def with_labels(self, labels: Tensor) -> StoreBatches:
        """The same batches (the same stream) with each row's label, ``labels`` [len(store)], as a last
        column (:func:`~apd.distillation.conditioned.labelled`)."""
        batches = copy.copy(self)
        batches.labels = labels.to(self.device)
        return batches

    def __call__(self) -> Tensor:
        if self.rows is None:
            index = torch.randint(len(self.store), (self.batch_size,), generator=self.rng)
        else:
            index = self.rows[torch.randint(len(self.rows), (self.batch_size,), generator=self.rng)]
        on_device = self._on_device(index)
        codes = self.codes[on_device] if self.codes is not None else self._encode(self.store.read(index.numpy()), index)
        return codes if self.labels is None else labelled(codes, self.labels[on_device])

    def _on_device(self, index: Tensor) -> Tensor:
        """``index``, drawn on the CPU, on the batches' device: to a GPU through pinned memory, a copy the CPU
        does not wait for (from pageable memory it would wait for every queued step, once a batch)."""
        if self.device.type != "cuda":
            return index
        return index.pin_memory().to(self.device, non_blocking=True)


class ValidationMonitor:
    """Judges generator steps on validation inputs ``x`` against SGLD's ``reference_weights`` [K, D]
    (:mod:`apd.distillation.selection`), ``networks`` generated networks at a time, drawn with a
    generator of its own (checkpointed with the run)."""

    def __init__(self, spec: ParamSpec, x: Tensor, y: Tensor, reference_weights: Tensor, networks: int,
                 seed: int) -> None:
        self.spec, self.x, self.networks = spec, x, networks
        self.rng = torch.Generator(device=x.device).manual_seed(seed)
        self.reference = ReferencePredictive.of(spec, reference_weights, x, y)

    def judge(self, model: DistilledGenerator) -> dict[str, float]:
        """The criterion and its parts for the generator's networks without the residual: the residual is
        only scaled after training, and at its fitted scale it would decide the comparison."""
        codes = model.generator.sample(self.networks, generator=self.rng)
        return generated_gap(self.spec, model.codec.decode_principal(codes), self.reference)

    def scale_residual(self, codec: WeightCodec, sample_codes: Callable[[int, torch.Generator], Tensor]) -> float:
        """Multiply ``codec``'s residual in place by the α of
        :func:`~apd.distillation.residual.match_residual_scale` (mean BALD on the validation inputs equal
        to SGLD's) for codes drawn by ``sample_codes(k, generator)``; returns α."""
        target = self.reference.mean_information
        alpha = match_residual_scale(codec, sample_codes, self.spec, self.x, target, self.networks, self.rng)
        codec.scale_residual_(alpha)
        log.info("residual scaled by %.3f: mean mutual information on validation inputs matched to SGLD's %.4f",
                 alpha, target)
        return alpha


