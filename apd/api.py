"""``apd.load``: a pipeline's artifacts as a :class:`~apd.posteriors.Posterior`, in one call; ``apd.load_data``:
the inputs it was evaluated on (its splits and OOD sets), built as ``apd evaluate`` builds them.

Everything needed is read from the artifacts themselves (manifests, the sample store's metadata), or, for
``load_data``, from a pipeline file if given one; nothing is unpickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from apd.config_load import from_dict, load_config
from apd.data import Dataset, input_range
from apd.distillation.generator import load_generator
from apd.errors import ArtifactError, DataError
from apd.io import load_torch, read_json
from apd.methods import LOADABLE
from apd.nets import network
from apd.pipeline.layout import Layout, manifest_of
from apd.pipeline.runtime import RunContext, resolve_device
from apd.pipeline.stage import check_provenance
from apd.posteriors import APDGenerator, MCDropout, PointEstimate, Posterior, SGLDSamples
from apd.samplers.store import SampleStore


def load(artifact_dir: str | Path, method: str, device: torch.device | str = "cpu") -> Posterior:
    """The posterior ``method`` of the pipeline whose artifacts are in ``artifact_dir`` (e.g.
    ``artifacts/digits``): ``sgld`` (the sample store, kept open), ``apd`` (the generator), ``sgd`` and
    ``mcdropout`` (the baselines), or ``mog`` (the evaluation's largest mixture, fit again to the store).
    ``device`` as ``--device`` takes it; one that is not here raises :class:`~apd.errors.ConfigError` at once.
    The artifact is checked as the command line checks it (complete, files unchanged, made from the sample
    store there now); one that fails is an :class:`~apd.errors.ArtifactError`. Its ``predict_probs`` refuses
    inputs outside the scale of the dataset the sample store records
    (:attr:`~apd.posteriors.Posterior.input_range`)."""
    layout = Layout(Path(artifact_dir))
    if method not in LOADABLE:
        raise ValueError(f"method must be one of {', '.join(LOADABLE)}, got {method!r}")
    device = resolve_device(str(device))
    artifact = {"sgld": layout.samples, "mog": layout.samples, "apd": layout.generator}.get(method)
    _check(artifact or layout.baseline(method), layout)
    posterior = _load(layout, method, device)
    if layout.samples.is_file():
        with SampleStore.open(layout.samples) as store:
            posterior.input_range = input_range(store.meta.get("dataset", ""))
    return posterior


def _load(layout: Layout, method: str, device: torch.device) -> Posterior:
    if method in ("sgld", "mog"):
        store = SampleStore.open(layout.samples)
        if method == "sgld":
            return SGLDSamples(store, device)
        from apd.pipeline.methods import fit_mixture

        with store:
            evaluate = store.meta.get("config", {}).get("evaluate", {})
            components, fit_samples = max(evaluate.get("mog_components", [60])), evaluate.get("mog_fit_samples", 2000)
            return fit_mixture(store, components, fit_samples, seed=0, device=device)
    if method == "apd":
        model, spec = load_generator(layout.generator, read_json(manifest_of(layout.generator)), device=device)
        return APDGenerator(model, spec)
    path = layout.baseline(method)
    manifest = read_json(manifest_of(path))
    net, dropout = _recorded_network(manifest, manifest_of(path))
    try:
        net.load_state_dict(load_torch(path))
    except RuntimeError:
        raise ArtifactError(f"{path}: does not match its manifest's network {manifest['sizes']}") from None
    net = net.to(device).eval()
    return PointEstimate(net) if method == "sgd" else MCDropout(net, dropout)


def _check(artifact: Path, layout: Layout) -> None:
    """The checks the command line makes before it uses ``artifact``: complete (its manifest is there), its
    files unchanged since they were made (SHA-256), made from the inputs there now
    (:func:`apd.pipeline.stage.check_provenance`)."""
    manifest = manifest_of(artifact)
    producer = "distill" if artifact == layout.generator else "sample"
    if not manifest.is_file():
        raise ArtifactError(f"{artifact}: missing or incomplete; run `apd {producer}` first")
    check_provenance(artifact, read_json(manifest), layout, f"`apd {producer}`")


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
    from apd.pipeline.evaluate import evaluation_inputs  # the stage's own function, imported on use: a heavy module

    layout = Layout(Path(source))
    fingerprint = None
    if Path(source).is_dir():
        with SampleStore.open(layout.samples) as store:
            cfg = from_dict(store.meta.get("config", {}), where=str(layout.samples))
            fingerprint = store.meta.get("data_fingerprint")
    else:
        cfg = load_config(source)
    ctx = RunContext(cfg=cfg, data_dir=data_dir, device_name="cpu", quiet=True)
    if fingerprint is not None and ctx.data.fingerprint() != fingerprint:
        raise DataError(f"{layout.samples}: sampled on data with fingerprint {fingerprint}, but {cfg.data.dataset} "
                        f"here has {ctx.data.fingerprint()}; pass the data_dir it was sampled from")
    inputs = evaluation_inputs(ctx)
    return PipelineData(ctx.data, inputs.x_in, inputs.ood)


def _recorded_network(manifest: dict, where: Path) -> tuple[torch.nn.Module, float]:
    """The network a baseline's manifest records (``sizes``, ``conv``, ``dropout``) and its dropout; a record
    that is missing or malformed is an :class:`ArtifactError` naming the manifest."""
    sizes, conv, dropout = manifest.get("sizes"), manifest.get("conv", []), manifest.get("dropout", 0.0)

    def counts(value: object) -> bool:
        return isinstance(value, list) and all(type(n) is int and n > 0 for n in value)

    if not (counts(sizes) and len(sizes) >= 2 and counts(conv) and type(dropout) in (int, float)
            and 0 <= dropout < 1):
        raise ArtifactError(f"{where}: no valid network record (sizes {sizes!r}, conv {conv!r}, dropout {dropout!r}); "
                            "run `apd sample --force` to make the baselines again")
    try:
        return network(sizes, conv, dropout=dropout), float(dropout)
    except ValueError as exc:
        raise ArtifactError(f"{where}: its network record does not build ({exc})") from None
