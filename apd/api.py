"""``apd.load``: a pipeline's artifacts as a :class:`~apd.posteriors.Posterior`, in one call.

Everything needed is read from the artifacts themselves (manifests, the sample store's metadata), never
from a pipeline file, and nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch

from apd.data import input_range
from apd.distillation.generator import load_generator
from apd.errors import ArtifactError
from apd.io import load_torch, read_json
from apd.nets import network
from apd.pipeline.layout import Layout, manifest_of
from apd.pipeline.runtime import resolve_device
from apd.posteriors import APDGenerator, MCDropout, PointEstimate, Posterior, SGLDSamples
from apd.samplers.store import SampleStore

LOADABLE = ("sgld", "apd", "sgd", "mcdropout", "mog")


def load(artifact_dir: str | Path, method: str, device: torch.device | str = "cpu") -> Posterior:
    """The posterior ``method`` of the pipeline whose artifacts are in ``artifact_dir`` (e.g.
    ``artifacts/digits``): ``sgld`` (the sample store, kept open), ``apd`` (the generator), ``sgd`` and
    ``mcdropout`` (the baselines), or ``mog`` (the evaluation's largest mixture, fit again to the store).
    ``device`` as ``--device`` takes it; one that is not here raises :class:`~apd.errors.ConfigError` at once.
    Its ``predict_probs`` refuses inputs outside the scale of the dataset the sample store records
    (:attr:`~apd.posteriors.Posterior.input_range`)."""
    layout = Layout(Path(artifact_dir))
    if method not in LOADABLE:
        raise ValueError(f"method must be one of {', '.join(LOADABLE)}, got {method!r}")
    posterior = _load(layout, method, resolve_device(str(device)))
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
