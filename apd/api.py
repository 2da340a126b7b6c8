"""``apd.load``: a pipeline's artifacts as a :class:`~apd.posteriors.Posterior`, in one call; ``apd.load_data``:
the inputs it was evaluated on (its splits and OOD sets), built as ``apd evaluate`` builds them.

Everything needed is read from the artifacts themselves (manifests, the configuration the sample store
records), the data they were made from, or, for ``load_data``, from a pipeline file if given one; nothing is
unpickled.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from apd.config_load import from_dict, load_config
from apd.data import Dataset, input_range
from apd.errors import ArtifactError, DataError
from apd.io import read_json
from apd.methods import LOADABLE, MethodName
from apd.nets import ParamSpec
from apd.pipeline.layout import Layout, manifest_of
from apd.pipeline.methods import METHODS, Sources, apd_generator
from apd.pipeline.recipes import evaluation_inputs
from apd.pipeline.runtime import RunContext, resolve_device
from apd.pipeline.stage import PRODUCER, check_provenance
from apd.posteriors import Posterior, SGLDSamples
from apd.samplers.store import SampleStore


def load(artifact_dir: str | Path, method: str, device: torch.device | str = "cpu",
         data_dir: str | None = None, seed: int = 0) -> Posterior:
    """The posterior ``method`` (one of :data:`apd.methods.LOADABLE`) of the pipeline whose artifacts are in
    ``artifact_dir`` (e.g. ``artifacts/digits``), as ``apd evaluate`` loads or fits it: by the same loader
    (:mod:`apd.pipeline.methods`), under the configuration the sample store records, with the same seeds, so
    that it is the posterior the evaluation judged (``sgld`` keeps the sample store open; ``mog``, ``modes``,
    ``stein`` and the ``laplace-*`` methods are fit again, on the data the store was sampled on: ``data_dir``
    as ``--data-dir`` takes it). ``device`` as ``--device`` takes it; one that is not here raises
    :class:`~apd.errors.ConfigError` at once. The artifact is checked as the command line checks it (complete,
    files unchanged, made from the sample store there now, for the network the configuration builds); one
    that fails is an :class:`~apd.errors.ArtifactError`. Its ``predict_probs`` refuses inputs outside the
    scale of the pipeline's dataset (:attr:`~apd.posteriors.Posterior.input_range`). ``seed`` picks APD's
    generator seed where ``[distill] seeds`` trained several (0, the default: ``generator.pt``, the one the main
    tables judge); it is for ``apd`` only."""
    layout = Layout(Path(artifact_dir))
    if method not in LOADABLE:
        raise ValueError(f"method must be one of {', '.join(LOADABLE)}, got {method!r}")
    if seed and method != MethodName.APD:
        raise ValueError(f"seed picks one of APD's generator seeds; {method!r} has none")
    device = resolve_device(str(device))
    loader = METHODS[method]
    artifact = layout.generator_of(seed) if method == MethodName.APD else loader.artifact(layout)
    _check(artifact, loader.stage, layout)
    if artifact != layout.samples:  # the configuration, and so the seeds, come from the store
        _check(layout.samples, "sample", layout)
    ctx = _recorded_context(layout, data_dir, str(device))
    if loader.stage in ("baselines", "peers"):
        _check_network_record(method, artifact, loader.stage, ctx)
    with ExitStack() as stack:
        spec = ParamSpec.from_module(ctx.network())
        posterior = apd_generator(ctx, spec, seed) if seed else loader.load(Sources(ctx, stack, spec))
        if isinstance(posterior, SGLDSamples):  # it reads the store as it draws: left open
            stack.pop_all()
    posterior.input_range = input_range(ctx.cfg.data.dataset)
    return posterior


def _check(artifact: Path, stage: str, layout: Layout) -> None:
    """The checks the command line makes before it uses ``artifact``, made by ``stage``: complete (its manifest
    is there), its files unchanged since they were made (SHA-256), made from the inputs there now
    (:func:`apd.pipeline.stage.check_provenance`)."""
    manifest = manifest_of(artifact)
    command = f"`apd {PRODUCER[stage]}`"
    if not manifest.is_file():
        raise ArtifactError(f"{artifact}: missing or incomplete; run {command} first")
    check_provenance(artifact, read_json(manifest), layout, command)


def _check_network_record(method: str, artifact: Path, stage: str, ctx: RunContext) -> None:
    """A baseline's or a peer's manifest records the network the loader builds for it (the configuration's,
    with the baseline's dropout); one that records another, or no valid one, is an :class:`ArtifactError`
    naming the manifest."""
    manifest = manifest_of(artifact)
    expected = dict(ctx.net_record)
    if stage == "baselines":  # MC dropout's network drops units, the SGD network (Laplace's too) does not
        expected["dropout"] = ctx.cfg.baselines.dropout if method == MethodName.MCDROPOUT else 0.0
    record = read_json(manifest)
    recorded = {key: record.get(key) for key in expected}
    if recorded != expected:
        raise ArtifactError(f"{manifest}: records the network {recorded}, the sample store's configuration builds "
                            f"{expected}; run `apd sample --force` to make the baselines again")


def _recorded_context(layout: Layout, data_dir: str | None, device_name: str = "cpu") -> RunContext:
    """A run of the configuration the sample store in ``layout`` records, on its artifacts (whatever their
    folder is called), with the data found here; data whose fingerprint is not the one the store records is a
    :class:`~apd.errors.DataError`."""
    with SampleStore.open(layout.samples) as store:
        cfg = from_dict(store.meta.get("config", {}), where=str(layout.samples))
        fingerprint = store.meta.get("data_fingerprint")
    root = layout.root.resolve()
    ctx = RunContext(cfg=dataclasses.replace(cfg, name=root.name), artifacts_root=root.parent,
                     data_dir=data_dir, device_name=device_name, quiet=True)
    if fingerprint is not None and ctx.data.fingerprint() != fingerprint:
        raise DataError(f"{layout.samples}: sampled on data with fingerprint {fingerprint}, but {cfg.data.dataset} "
                        f"here has {ctx.data.fingerprint()}; pass the data_dir it was sampled from")
    return ctx


@dataclass(frozen=True)
class PipelineData:
    """A pipeline's inputs as ``apd evaluate`` builds them, scaled as its networks take them: ``splits`` (the
    dataset: ``x_train``, ``y_train``, ``x_val``, ``y_val``, ``x_test``, ``y_test``, ``num_classes``, …), ``x_in``
    (the test inputs that detection scores against each OOD set) and ``ood`` (OOD set name → as many inputs)."""

    splits: Dataset
    x_in: Tensor
    ood: dict[str, Tensor]


def load_data(source: str | Path, data_dir: str | None = None) -> PipelineData:
    """The inputs of a pipeline (:class:`PipelineData`), from ``source``: its artifact directory (e.g.
    ``artifacts/digits``: the configuration its sample store records, checked against the data found here by
    fingerprint), or a pipeline file as ``--config`` takes it (a later edit of its ``[evaluate]`` or OOD sets
    shows there, not in the store). ``data_dir`` as ``--data-dir`` takes it. OOD sets not available here are
    left out with a warning, as ``apd evaluate`` leaves them out."""
    if Path(source).is_dir():
        ctx = _recorded_context(Layout(Path(source)), data_dir)
    else:
        ctx = RunContext(cfg=load_config(source), data_dir=data_dir, device_name="cpu", quiet=True)
    inputs = evaluation_inputs(ctx)
    return PipelineData(ctx.data, inputs.x_in, inputs.ood)
