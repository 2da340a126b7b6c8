"""Pipeline configuration: the typed section dataclasses (each field with its default and bounds), building a
section from a table field by field, parsing a ``section.key=value`` override, and the config hash.

A pipeline file has top-level ``name``, ``seed`` and ``device`` and one table per section below. Every
field has a default, so a file states only what differs. Unknown keys, wrong types and out-of-range
values raise :class:`ConfigError` naming the file and the key; :mod:`apd.config_load` reads a file
(:func:`~apd.config_load.load_config`). :func:`config_hash` gives a stable hash of the resolved
configuration (or of chosen sections, so a stage is redone only when what it depends on changes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import tomllib
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from apd.errors import ConfigError
from apd.methods import ALL_METHODS

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d{1,4})?")  # a device name as configured or given by --device
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # a pipeline's name: one plain file name
YARDSTICK_SUBSETS = 200  # the fewest random kept subsets a percentile rank is taken among (evaluate and studies)


def bounded(default: Any, **bounds: float) -> Any:
    """A dataclass field with a default and optional bounds: gt, ge, lt, le (checked on load)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=bounds)
    return field(default=default, metadata=bounds)


@dataclass
class DataConfig:
    """Which dataset, how it is split, and which out-of-distribution sets evaluation uses.

    Split sizes: ``0`` means "what remains" for ``train_size``, and "the dataset's own test split"
    (IDX datasets) or "what remains after train and val" (digits) for ``test_size``; toy2d draws its
    points, 200 / 1,000 for ``train_size`` / ``test_size`` 0.
    """

    dataset: Literal["digits", "fashion-mnist", "mnist", "toy2d"] = "digits"
    data_dir: str = ""
    train_size: int = bounded(0, ge=0)
    val_size: int = bounded(300, ge=1)
    test_size: int = bounded(0, ge=0)
    ood: list[str] = bounded(["gaussian", "uniform", "photos"])
    ood_dirs: dict[str, str] = bounded({})


@dataclass
class NetConfig:
    """The target network (:func:`apd.nets.network`): input size and classes come from the data, ``hidden``
    lists the hidden widths, ``conv`` the channels of LeNet-style convolution layers in front of them (5 × 5
    filters, ReLU, 2 × 2 max pooling; empty: an MLP). A CNN needs square images; the methods and distiller
    options that are defined on an MLP's hidden units (unit alignment, Kronecker factors, Laplace and the
    modes mixture) are not available for it."""

    hidden: list[int] = bounded([100])
    conv: list[int] = bounded([])


@dataclass
class SGLDConfig:
    """SGLD sampling (docs/design.md): step ε = lr/N, prior N(0, prior_var·I), burn-in and thinning in
    iterations. Schedules: constant; polynomial a·(b+t)^(−γ) with a = lr; cyclical cosine (cSGLD)
    sampling only in the last ``1 − explore_fraction`` of each of ``cycles`` cycles.

    ``chains`` independent chains run on ``workers`` processes (chain c on worker c mod workers; under
    ``torchrun`` its world size is the worker count). Each chain starts from ``init``: ``prior``, a draw
    of the prior N(0, prior_var·I) (over-dispersed with respect to the posterior, whose precision is the
    prior's plus the data's), or ``default``, PyTorch's layer initialisation; times ``init_scale``.
    ``workers`` is not part of the stage's config hash: chain c's samples do not depend on it."""

    lr: float = bounded(0.05, gt=0)
    prior_var: float = bounded(0.02, gt=0)
    temperature: float = bounded(1.0, gt=0)
    batch_size: int = bounded(100, ge=1)
    iterations: int = bounded(200_000, ge=1)
    burn_in: int = bounded(500, ge=0)
    thin: int = bounded(20, ge=1)
    chains: int = bounded(1, ge=1)
    workers: int = bounded(1, ge=1)
    init: Literal["default", "prior"] = "default"
    init_scale: float = bounded(1.0, gt=0)
    schedule: Literal["constant", "polynomial", "cyclical"] = "constant"
    poly_b: float = bounded(1.0, gt=0)
    poly_gamma: float = bounded(0.55, ge=0, le=1)
    cycles: int = bounded(4, ge=1)
    explore_fraction: float = bounded(0.8, ge=0, lt=1)
    eval_every: int = bounded(2000, ge=1)
    checkpoint_every: int = bounded(5000, ge=1)
    compression: Literal["none", "lzf", "gzip"] = "none"


@dataclass
class BaselineConfig:
    """SGD and MC-dropout baselines: minibatch SGD with weight decay on the mean loss, the checkpoint
    with the best validation accuracy kept (for MC dropout, of the MC predictive over ``mc_passes``)."""

    lr: float = bounded(0.05, gt=0)
    weight_decay: float = bounded(0.001, ge=0)
    momentum: float = bounded(0.0, ge=0, lt=1)
    batch_size: int = bounded(100, ge=1)
    epochs: int = bounded(20, ge=1)
    dropout: float = bounded(0.5, ge=0, lt=1)
    mc_passes: int = bounded(200, ge=1)


@dataclass
class PeersConfig:
    """Baselines that ``apd sample`` trains after the SGD network (:mod:`apd.pipeline.peers`).

    Deep ensemble (Lakshminarayanan et al., 2017): ``ensemble_members`` networks trained as the SGD
    baseline (the ``[baselines]`` settings), each from its own initialisation and minibatch order.
    SWAG (Maddox et al., 2019): SGD continued from the SGD baseline's weights at a constant learning rate
    for ``swag_epochs`` epochs, ``swag_snapshots_per_epoch`` iterates collected per epoch, the last
    ``swag_rank`` deviations kept, covariance scaled by ``swag_scale``; the learning rate is the one of
    ``swag_lrs`` whose ensemble of ``swag_val_samples`` draws has the lowest validation NLL."""

    ensemble_members: int = bounded(5, ge=1)
    swag_lrs: list[float] = bounded([0.01, 0.03, 0.1, 0.3, 0.5, 1.0, 2.0, 4.0])
    swag_epochs: int = bounded(40, ge=1)
    swag_snapshots_per_epoch: int = bounded(1, ge=1)
    swag_rank: int = bounded(20, ge=0)
    swag_scale: float = bounded(0.5, ge=0)
    swag_val_samples: int = bounded(30, ge=1)


@dataclass
class ResidualConfig:
    """The subspace generator's residual outside the principal subspace (:mod:`apd.distillation.codec`):
    none, per weight (``diagonal``: each weight's spread outside the subspace) or a Kronecker-factored
    Laplace draw keeping the top ``kronecker_rank`` input directions per layer (``kronecker``;
    :mod:`apd.distillation.kronecker`); scaled after training so that generated networks disagree on
    validation inputs as much as SGLD's (``matched``; :mod:`apd.distillation.residual`) or kept at the
    fitted spread (``fitted``)."""

    model: Literal["none", "diagonal", "kronecker"] = "diagonal"
    scale: Literal["matched", "fitted"] = "matched"
    kronecker_rank: int = bounded(50, ge=1)


@dataclass
class DistillConfig:
    """GAN distillation of the samples into a generator over flat weight vectors (docs/design.md).

    ``generator``: ``dense`` trains on the D-dimensional vectors (standardised per dimension if
    ``standardize``); ``subspace`` on their coordinates in the top-``subspace_rank`` principal
    subspace of ``fit_samples`` samples, plus the ``residual`` outside it. Offline, the training vectors
    are held in memory when they take at most ``in_memory_gb`` (for all the seeds training at once), else read
    from the store per batch.
    Every ``eval_every`` generator steps the generator is scored by ``selection`` on validation inputs
    (:mod:`apd.distillation.selection`) and the best step is kept (``last``: the last one).
    Online: SGLD chains feed a FIFO buffer of ``buffer_size`` samples; every ``t_sgld`` new samples
    the GAN takes ``t_gan`` generator steps; every ``restart_every`` rounds (0: never) the chains
    restart from generated weights. ``align`` (offline only) reorders every sample's hidden units to a
    common order before the codec and the GAN see it (:mod:`apd.distillation.alignment`), which changes no
    sample's function: ``permutation`` matches each sample's weights to the samples' re-estimated mean;
    ``chains`` gives every sample of a chain one permutation, that matching the activations of the chain's
    mean on training images to those of the first chain's mean (for chains in different unit orders).
    ``per_chain`` (offline only) trains one generator per chain of the store in the one codec, a draw split
    over the chains by their shares (:mod:`apd.distillation.chain_generators`). ``mode_embedding`` E > 0
    (offline only; 0: off) trains one generator for every chain instead, fed z and a learned E-number
    embedding of the chain, a draw taking chains by their shares (:mod:`apd.distillation.conditioned`).
    ``precision`` is what the generator's tensors (generator, codec, residual) are stored at
    (:mod:`apd.distillation.precision`), ``generators_at``, where given, what the generator networks
    (and chain shares and embeddings) are stored at instead, and ``mean_at``, where given, what the codec's
    mean is stored at instead, the rest of the codec staying at ``precision``; the generator is trained and
    selected in float32 and stored at them once, and its storage is counted in its bytes. ``seeds``
    generators are trained, each from its own seed streams (generator seed k:
    :func:`apd.pipeline.seeds.replicated`) into its own files (:meth:`apd.pipeline.layout.Layout.generator_of`);
    seed k's generator does not depend on how many are
    trained, so ``seeds`` is not part of the stage's hash, and ``apd evaluate`` judges every one
    (:mod:`apd.pipeline.replicates`). ``workers`` processes on this machine share the seeds (seed k on worker
    k mod workers, each on the pipeline's ``threads``: :mod:`apd.pipeline.parallel`); a seed's generator does
    not depend on it, so it is not hashed either."""

    mode: Literal["offline", "online"] = "offline"
    generator: Literal["dense", "subspace"] = "dense"
    align: Literal["none", "permutation", "chains"] = "none"
    loss: Literal["wgan-gp", "wgan", "gan"] = "wgan-gp"
    z_dim: int = bounded(32, ge=1)
    gen_hidden: list[int] = bounded([100, 100, 100])
    critic_hidden: list[int] = bounded([100, 100, 100])
    gp_weight: float = bounded(10.0, ge=0)
    clip: float = bounded(0.01, gt=0)
    n_critic: int = bounded(5, ge=1)
    lr: float = bounded(0.0, ge=0)  # 0: the loss's default (WGAN-GP 1e-4, WGAN 5e-5, GAN 2e-4)
    beta1: float = bounded(0.5, ge=0, lt=1)  # Adam's betas for every loss trained with Adam (gan as well)
    beta2: float = bounded(0.9, ge=0, lt=1)
    batch_size: int = bounded(100, ge=1)
    steps: int = bounded(100_000, ge=1)
    standardize: bool = False
    subspace_rank: int = bounded(20, ge=1)
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    fit_samples: int = bounded(2000, ge=2)
    in_memory_gb: float = bounded(4.0, ge=0)
    selection: Literal["function-space", "last"] = "function-space"
    eval_every: int = bounded(500, ge=1)
    eval_networks: int = bounded(100, ge=1)
    checkpoint_every: int = bounded(1000, ge=1)
    buffer_size: int = bounded(2000, ge=1)
    t_sgld: int = bounded(100, ge=1)
    t_gan: int = bounded(10, ge=1)
    restart_every: int = bounded(0, ge=0)
    per_chain: bool = False
    mode_embedding: int = bounded(0, ge=0)  # numbers per chain's embedding; 0: no conditioning on the chain
    precision: Literal["float32", "float16", "int8", "int4"] = "float32"
    generators_at: Literal["", "float32", "float16", "int8", "int4"] = ""  # "": at ``precision``
    mean_at: Literal["", "float32", "float16", "int8", "int4"] = ""  # the codec's mean; "": at ``precision``
    seeds: int = bounded(1, ge=1)
    workers: int = bounded(1, ge=1)

    def has_residual(self) -> bool:
        """Whether generated networks carry a residual outside the principal subspace."""
        return self.generator == "subspace" and self.residual.model != "none"

    def uses_kronecker(self) -> bool:
        """Whether that residual is the Kronecker-factored one (:mod:`apd.distillation.kronecker`)."""
        return self.generator == "subspace" and self.residual.model == "kronecker"


@dataclass
class AdversarialConfig:
    """Adversarial-example detection (:mod:`apd.pipeline.adversarial`): gray-box attacks on one member of
    each of ``sources`` (FGSM with the smallest ε of ``fgsm_eps_grid`` per example, and PGD), up to
    ``examples`` successful examples each, scored by every method over ``samples`` members; with
    ``whitebox`` also white-box attacks on each source's expected predictive over ``eot_members``
    members, up to ``whitebox_examples`` examples each."""

    enabled: bool = False
    examples: int = bounded(6000, ge=1)
    samples: int = bounded(1000, ge=1)
    pgd_eps: float = bounded(0.3, gt=0)
    pgd_steps: int = bounded(40, ge=0)
    pgd_step_size: float = bounded(0.02, gt=0)
    fgsm_eps_grid: list[float] = bounded([round(0.02 * i, 2) for i in range(1, 16)])  # 0.02, 0.04, …, 0.30
    sources: list[str] = bounded(["mcdropout", "sgld", "apd"])
    whitebox: bool = True
    whitebox_examples: int = bounded(500, ge=1)
    eot_members: int = bounded(20, ge=1)


@dataclass
class EvaluateConfig:
    """Evaluation protocol (docs/design.md): R runs of fresh draws per method, OOD and adversarial parts.
    ``methods`` lists the methods compared (:mod:`apd.pipeline.methods`; default: all of them).

    Peers fit at evaluation time: Stein thinning picks from ``stein_candidates`` rows spread evenly over
    the store (each costs one full-training-set gradient); the Laplace approximations choose their
    posterior scale on the validation split, the widest scale within ``laplace_nll_tolerance`` nats of
    the lowest validation NLL (0: the lowest). The kept-samples yardstick (:mod:`apd.evaluation.yardstick`)
    draws ``yardstick_subsets`` random subsets per size (stratified by chain; at least
    :data:`YARDSTICK_SUBSETS`, so that a percentile rank of 95 is resolved to half a percent), for the sizes
    ``yardstick_sizes`` and each method's own storage, against SGLD's predictive over at most
    ``yardstick_reference`` samples. ``burn_in_from_trace`` (off by default, so that results are read as
    before): SGLD's reference, the kept samples and Stein's candidates (``sgld``, ``kept``, ``stein``, the
    yardstick) drop each chain's burn-in read from its log-likelihood trace (:mod:`apd.samplers.burn_in`); the
    evaluation records that burn-in either way.

    ``mog_growth`` adds the table of mixtures with each number of components of ``mog_components`` (one EM
    fit and :data:`~apd.pipeline.evaluate.MIXTURE_DRAWS` judged draws each) beside APD; off, only the mixture
    with the most components is fit and compared, as a method. The growth is a storage question, which
    ``apd experiment storage`` answers at more sizes on validation and tuning inputs; in the evaluation it
    was fcNN1's costliest step.

    ``threads``: torch's CPU threads while evaluating (0: the pipeline's ``threads``). Evaluation multiplies
    large batches (K networks × thousands of inputs) and gains from every core, where a sampler's or a
    trainer's small steps do not; a compute setting, it is not part of the stage's hash. ``figures`` off: the
    evaluation writes its tables but draws no figures (seconds each on a CPU; ``apd report`` draws them later
    from the same files); nor is it hashed."""

    methods: list[str] = bounded(list(ALL_METHODS))
    runs: int = bounded(10, ge=1)
    networks: int = bounded(100, ge=2)  # fidelity compares the spread of several draws
    sgld_samples: int = bounded(100, ge=1)
    mc_passes: int = bounded(200, ge=1)
    ood_size: int = bounded(2000, ge=1)
    ood_scale: float = bounded(1.0, gt=0)
    scores: list[str] = bounded(["variation_ratio", "bald", "entropy", "max_prob", "model_variance"])
    mog_components: list[int] = bounded([1, 5, 10, 20, 60])
    mog_fit_samples: int = bounded(2000, ge=2)
    stein_candidates: int = bounded(1000, ge=1)
    laplace_nll_tolerance: float = bounded(0.01, ge=0)
    yardstick_sizes: list[int] = bounded([1, 2, 3, 5, 10, 20, 50])
    yardstick_subsets: int = bounded(YARDSTICK_SUBSETS, ge=YARDSTICK_SUBSETS)
    yardstick_reference: int = bounded(2000, ge=1)
    burn_in_from_trace: bool = False
    mog_growth: bool = False
    threads: int = bounded(0, ge=0)
    figures: bool = True
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)


@dataclass
class PipelineConfig:
    """One experiment: data, target net, sampler, baselines, distiller and evaluation."""

    name: str = "digits"  # the artifact directory's name: a plain file name (NAME_PATTERN)
    seed: int = bounded(0, ge=0, lt=2**32)  # numpy and scikit-learn take seeds below 2**32
    device: str = "auto"
    threads: int = bounded(0, ge=0)  # CPU threads for torch; 0 keeps torch's default (one per core)
    # SGLD noise drawn on a worker thread ("auto": on CPU when a core is left free); results are identical
    prefetch_noise: Literal["auto", "on", "off"] = "auto"
    data: DataConfig = field(default_factory=DataConfig)
    net: NetConfig = field(default_factory=NetConfig)
    sgld: SGLDConfig = field(default_factory=SGLDConfig)
    baselines: BaselineConfig = field(default_factory=BaselineConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    source: str = field(default="", compare=False, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration as plain JSON-able data (without the file it came from)."""
        out = dataclasses.asdict(self)
        out.pop("source")
        return out


# Which sections each stage's outputs depend on: a change elsewhere does not redo the stage.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "sample": ("seed", "data", "net", "sgld"),
    "baselines": ("seed", "data", "net", "baselines"),
    "peers": ("seed", "data", "net", "baselines", "peers"),
    "distill": ("seed", "data", "net", "sgld", "distill"),
    "evaluate": ("seed", "data", "net", "sgld", "baselines", "peers", "distill", "evaluate"),
}


# Fields that say how a stage runs, not what it makes: left out of the config hash. ``distill.seeds`` says how
# many generators the stage makes, none of which depends on it (the evaluation's inputs name every one), and
# ``distill.workers`` how many processes make them.
UNHASHED: tuple[tuple[str, str], ...] = (("sgld", "workers"), ("evaluate", "threads"), ("evaluate", "figures"),
                                         ("distill", "seeds"), ("distill", "workers"))
# Fields left out of the hash while they hold this value (what the pipelines made before the field existed),
# so that existing artifacts stay reusable: an empty ``net.conv`` is the MLP every earlier pipeline had, an
# empty ``distill.generators_at`` and ``distill.mean_at`` the generator stored at one precision throughout,
# ``distill.mode_embedding`` 0 a generator that does not read the chain, ``evaluate.burn_in_from_trace`` off
# the whole store read as before, ``evaluate.mog_growth`` on the growth table every evaluation made before it
# became optional.
HASHED_UNLESS: tuple[tuple[str, str, Any], ...] = (("net", "conv", []), ("distill", "generators_at", ""),
                                                  ("distill", "mean_at", ""),
                                                  ("distill", "mode_embedding", 0),
                                                  ("evaluate", "burn_in_from_trace", False),
                                                  ("evaluate", "mog_growth", True))


def config_hash(cfg: PipelineConfig, stage: str | None = None) -> str:
    """SHA-256 (first 16 hex digits) of the canonical JSON of the config, or of a stage's sections
    (without the :data:`UNHASHED` fields, nor the :data:`HASHED_UNLESS` ones at their value)."""
    data = cfg.to_dict()
    for section, key in UNHASHED:
        data[section].pop(key)
    for section, key, value in HASHED_UNLESS:
        if data[section][key] == value:
            data[section].pop(key)
    if stage is not None:
        data = {key: data[key] for key in STAGE_SECTIONS[stage]}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` (value in TOML syntax; a bare word is a string) → (path, value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.strip().split("."), parsed


def build_section(cls: type, raw: Any, where: str, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'top level'}: expected a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{where}: unknown key '{prefix}{unknown[0]}' (known here: {known})")
    values = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = build_section(hint, value, where, prefix=key + ".")
        else:
            values[name] = _coerce(hint, value, where, key)
            _check_bounds(fields[name].metadata, values[name], where, key)
    return cls(**values)


def _coerce(hint: Any, value: Any, where: str, key: str) -> Any:
    """Check ``value`` against a type hint (int, float, str, bool, Literal, list[...], dict[str, str])."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)

    def fail(expected: str) -> typing.NoReturn:
        raise ConfigError(f"{where}: '{key}' must be {expected}, got {value!r}")

    if origin is Literal:
        if value not in args:
            fail("one of " + ", ".join(repr(a) for a in args))
        return value
    if hint is bool:
        if not isinstance(value, bool):
            fail("true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail("an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            fail("a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            fail("a string")
        return value
    if origin is list:
        if not isinstance(value, list):
            fail(f"a list of {args[0].__name__}")
        items = [_coerce(args[0], item, where, f"{key}[{i}]") for i, item in enumerate(value)]
        if args[0] is int and any(item < 1 for item in items):
            fail("a list of positive integers")
        return items
    if origin is dict:
        if not isinstance(value, dict):
            fail("a table of strings")
        return {k: _coerce(args[1], v, where, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"unsupported config type {hint}")  # a programming error, not a user's


def _check_bounds(bounds: typing.Mapping[str, float], value: Any, where: str, key: str) -> None:
    checks = {
        "gt": (lambda v, b: v > b, "greater than"),
        "ge": (lambda v, b: v >= b, "at least"),
        "lt": (lambda v, b: v < b, "less than"),
        "le": (lambda v, b: v <= b, "at most"),
    }
    for name, bound in bounds.items():
        ok, words = checks[name]
        if not ok(value, bound):
            raise ConfigError(f"{where}: '{key}' must be {words} {bound}, got {value!r}")
