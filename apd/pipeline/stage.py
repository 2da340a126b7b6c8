"""What every stage does around its work: reuse a complete artifact, check its inputs' provenance, and
swap finished files in.

- :func:`reusable`: a complete artifact whose manifest matches the stage's config hash, its inputs and
  its file digests is reused (``--force`` redoes it).
- :func:`require_input`: an input must be complete, made under the config sections the running config
  has, from the inputs there now, and unchanged since; otherwise one line names the stage to run again.
- :func:`publish`: finished files replace the complete ones (data first, then the manifest), so until
  then the previous complete artifact stays valid, and a failure at any point leaves it as it was.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from apd.config import STAGE_SECTIONS, config_hash
from apd.errors import ArtifactError
from apd.interrupts import interrupts_deferred, raise_if_interrupted
from apd.io import load_torch, read_json
from apd.pipeline.layout import Layout, manifest_of
from apd.pipeline.manifests import file_digest, is_complete, manifest_digest, recorded_files, write_manifest
from apd.pipeline.runtime import RunContext

log = logging.getLogger(__name__)

# The command that makes each kind of artifact.
PRODUCER = {"sample": "sample", "baselines": "sample", "peers": "sample", "distill": "distill", "evaluate": "evaluate"}
# Inputs a manifest can name (``inputs`` entries), by the artifact each stands for.
INPUT_ARTIFACTS = {"samples": lambda layout: layout.samples}


def reusable(ctx: RunContext, artifact: Path, stage: str, inputs: dict[str, str]) -> bool:
    """True when ``artifact`` is complete for this config and these inputs (and ``--force`` is off)."""
    if ctx.force or not is_complete(manifest_of(artifact), config_hash(ctx.cfg, stage), inputs):
        return False
    log.info("reusing %s (--force to redo)", artifact)
    return True


def require_input(ctx: RunContext, artifact: Path, stage: str) -> str:
    """The manifest digest of the complete input ``artifact`` made by ``stage``, after checking that it
    was made under the running config's sections for that stage and that its files are unchanged."""
    manifest = manifest_of(artifact)
    command = f"`apd {PRODUCER[stage]} --config {ctx.cfg.source}`"
    if not manifest.is_file():
        raise ArtifactError(f"{artifact}: missing or incomplete; run {command} first")
    record = read_json(manifest)
    if record.get("config_hash") != config_hash(ctx.cfg, stage):
        raise ArtifactError(f"{artifact}: made with another configuration of {', '.join(STAGE_SECTIONS[stage])}; "
                            f"run {command} again")
    check_provenance(artifact, record, ctx.layout, command)
    return manifest_digest(manifest)


def check_provenance(artifact: Path, record: dict, layout: Layout, command: str) -> None:
    """Raise an :class:`ArtifactError` naming ``command`` unless every file the manifest ``record`` of
    ``artifact`` lists is unchanged since it was made (SHA-256) and every input it was made from (the
    sample store a generator was distilled from) is the one there now."""
    manifest = manifest_of(artifact)
    for name, digest in recorded_files(record, manifest).items():
        if file_digest(manifest.parent / name) != digest:
            raise ArtifactError(f"{manifest.parent / name}: changed since it was made; run {command} --force")
    for name, digest in recorded_files(record, manifest, "inputs").items():
        if name in INPUT_ARTIFACTS:
            source = manifest_of(INPUT_ARTIFACTS[name](layout))
            if not source.is_file() or manifest_digest(source) != digest:
                raise ArtifactError(f"{artifact}: made from other {name} than the ones there now; run {command} "
                                    "again")


def publish(files: dict[Path, Path], manifest: Path, record: dict) -> None:
    """Move each finished file (``{built: final}``) over its final name, then write ``manifest`` with
    ``record`` plus each final file's digest (names relative to the manifest's folder). Nothing is
    published after a Ctrl-C (:func:`apd.interrupts.raise_if_interrupted`); one that comes once the files are
    being swapped in waits until the manifest is written (files replaced under the old manifest would no
    longer match its digests)."""
    raise_if_interrupted()
    digests = {}
    for built, final in files.items():
        digests[str(final.relative_to(manifest.parent))] = file_digest(built)
    raise_if_interrupted()
    with interrupts_deferred():
        for built, final in files.items():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(built, final)
        write_manifest(manifest, {**record, "files": digests})


def weights_load(*paths: Path) -> bool:
    """Whether every saved weights file loads (weights only, finite): what reuse checks besides the
    manifest's digests; a warning names the first that does not."""
    for path in paths:
        try:
            load_torch(path)
        except ArtifactError as exc:
            log.warning("not reusing it: %s", exc)
            return False
    return True
