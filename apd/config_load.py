"""Reading a pipeline: the TOML file with ``section.key=value`` overrides applied on top, the flat keys of
earlier releases moved into their sub-tables (with a one-line warning each), every section built and checked
field by field (:func:`apd.config.build_section`), then the constraints that span fields; every problem is a
one-line :class:`ConfigError` naming the file and the key.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apd.config import (
    DEVICE_PATTERN,
    NAME_PATTERN,
    PipelineConfig,
    SGLDConfig,
    build_section,
    parse_override,
)
from apd.errors import ConfigError
from apd.methods import ADVERSARIAL_SOURCES, MLP_ONLY_METHODS, SCORE_NAMES
from apd.schedules import thinned_count

log = logging.getLogger(__name__)


SHIPPED = Path(__file__).resolve().parent / "pipelines"  # the pipelines shipped with the package, NAME.toml each


def shipped_pipelines() -> list[str]:
    """The names of the pipelines shipped with the package (``digits``, ``fashion-fc1``, …)."""
    return sorted(path.stem for path in SHIPPED.glob("*.toml"))


def pipeline_path(given: str | Path) -> Path:
    """The file a pipeline argument (``--config``) names: a path to a TOML file, or the name of a shipped
    pipeline (``digits``: ``apd/pipelines/digits.toml``, wherever the package is installed). A bare name that
    is neither a file here nor shipped is a one-line :class:`ConfigError` listing the shipped ones."""
    path = Path(given)
    if path.is_file() or path.suffix or len(path.parts) != 1:
        return path
    if (SHIPPED / f"{path}.toml").is_file():
        return SHIPPED / f"{path}.toml"
    raise ConfigError(f"{given}: neither a pipeline file nor a shipped pipeline ({', '.join(shipped_pipelines())})")


def load_config(given: str | Path, overrides: list[str] = ()) -> PipelineConfig:
    """Read and validate a pipeline, a TOML file or a shipped pipeline's name (:func:`pipeline_path`), with
    ``section.key=value`` overrides applied on top; every problem is a one-line :class:`ConfigError` naming
    the file. ``source`` is the pipeline as given (what ``--config`` takes again in a hint)."""
    path = pipeline_path(given)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such pipeline file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    for override in overrides:
        keys, value = parse_override(override)
        table = raw
        for key in keys[:-1]:
            table = table.setdefault(key, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {override!r}: {key!r} is not a section")
        table[keys[-1]] = value
    cfg = from_dict(raw, where=str(path) + (" with --set" if overrides else ""))
    cfg.source = str(given)
    return cfg


def from_dict(raw: dict[str, Any], where: str = "<config>") -> PipelineConfig:
    """Build a validated :class:`PipelineConfig` from nested dicts (as TOML gives)."""
    cfg = build_section(PipelineConfig, upgrade_deprecated_keys(raw, where), where, prefix="")
    _check_consistency(cfg, where)
    return cfg


# Flat keys of earlier releases: (section, old key) → (sub-table, new key, value map). Accepted for one
# release with a one-line warning each.
DEPRECATED_KEYS: dict[tuple[str, str], tuple[str, str, Callable[[Any], Any]]] = {
    ("distill", "subspace_residual"): ("residual", "model", lambda on: "diagonal" if on else "none"),
    ("distill", "subspace_residual_model"): ("residual", "model", lambda model: model),
    ("distill", "subspace_residual_scale"): ("residual", "scale", lambda scale: scale),
    ("distill", "kronecker_rank"): ("residual", "kronecker_rank", lambda rank: rank),
    **{("evaluate", f"adv_{name}"): ("adversarial", name, lambda value: value)
       for name in ("examples", "samples", "sources", "whitebox", "whitebox_examples", "eot_members")},
    **{("evaluate", name): ("adversarial", name, lambda value: value)
       for name in ("pgd_eps", "pgd_steps", "pgd_step_size", "fgsm_eps_grid")},
}


def upgrade_deprecated_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of ``raw`` with the flat keys of :data:`DEPRECATED_KEYS` moved into their sub-tables (and
    ``evaluate.adversarial = true|false`` into ``[evaluate.adversarial] enabled``), warning once per key.
    ``subspace_residual = false`` wins over a residual model given beside it, as it did before."""
    upgraded = {key: dict(value) if isinstance(value, dict) else value for key, value in raw.items()}
    for section in ("distill", "evaluate"):
        table = upgraded.get(section)
        if not isinstance(table, dict):
            continue
        if isinstance(table.get("adversarial"), bool):
            table["adversarial"] = {"enabled": table["adversarial"]}
            log.warning("%s: 'evaluate.adversarial = true|false' is deprecated; write [evaluate.adversarial] "
                        "enabled = …", where)
        switched_off = table.get("subspace_residual") is False
        for (owner, old), (sub, new, convert) in DEPRECATED_KEYS.items():
            if owner != section or old not in table:
                continue
            nested = table.setdefault(sub, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"{where}: '{section}.{sub}' must be a table")
            nested[new] = convert(table.pop(old))
            log.warning("%s: '%s.%s' is deprecated; write [%s.%s] %s = …", where, section, old, section, sub, new)
        if switched_off:
            table["residual"]["model"] = "none"
    return upgraded


def _check_consistency(cfg: PipelineConfig, where: str) -> None:
    """Constraints that span fields."""
    if not NAME_PATTERN.fullmatch(cfg.name):
        raise ConfigError(f"{where}: 'name' must be a plain file name (letters, digits, '_', '.', '-', not "
                          f"starting with '.' or '-'), got {cfg.name!r}")
    if cfg.sgld.burn_in >= cfg.sgld.iterations:
        raise ConfigError(f"{where}: 'sgld.burn_in' ({cfg.sgld.burn_in}) must be less than "
                          f"'sgld.iterations' ({cfg.sgld.iterations})")
    _check_sgld(cfg.sgld, where)
    if cfg.sgld.workers > cfg.sgld.chains:
        raise ConfigError(f"{where}: 'sgld.workers' ({cfg.sgld.workers}) must be at most 'sgld.chains' "
                          f"({cfg.sgld.chains}): a worker runs whole chains")
    if not DEVICE_PATTERN.fullmatch(cfg.device):
        raise ConfigError(f"{where}: 'device' must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {cfg.device!r}")
    adversarial = cfg.evaluate.adversarial
    if cfg.data.dataset == "toy2d" and adversarial.enabled:
        raise ConfigError(f"{where}: 'evaluate.adversarial.enabled' needs images in [-1, 1]; toy2d has points in "
                          "the plane (set it to false)")
    unknown_sources = sorted(set(adversarial.sources) - set(ADVERSARIAL_SOURCES))
    if unknown_sources:
        raise ConfigError(f"{where}: 'evaluate.adversarial.sources' has unknown method {unknown_sources[0]!r} "
                          f"(choose from {', '.join(ADVERSARIAL_SOURCES)})")
    if not adversarial.fgsm_eps_grid or min(adversarial.fgsm_eps_grid) <= 0:
        raise ConfigError(f"{where}: 'evaluate.adversarial.fgsm_eps_grid' must be a non-empty list of positive "
                          "numbers")
    if not cfg.peers.swag_lrs or min(cfg.peers.swag_lrs) <= 0:
        raise ConfigError(f"{where}: 'peers.swag_lrs' must be a non-empty list of positive learning rates")
    d = cfg.distill
    if d.generator == "subspace" and d.fit_samples < d.subspace_rank:
        raise ConfigError(f"{where}: 'distill.fit_samples' ({d.fit_samples}) must be at least "
                          f"'distill.subspace_rank' ({d.subspace_rank}): the subspace is fit to that many samples")
    if d.align != "none" and d.mode == "online":
        raise ConfigError(f"{where}: 'distill.align' = {d.align!r} needs 'distill.mode' = 'offline' "
                          "(online, set distill.align = \"none\")")
    if d.per_chain and d.mode == "online":
        raise ConfigError(f"{where}: 'distill.per_chain' needs 'distill.mode' = 'offline' (the chains of a sample "
                          "store; online, set distill.per_chain = false)")
    if d.mode_embedding and d.mode == "online":
        raise ConfigError(f"{where}: 'distill.mode_embedding' needs 'distill.mode' = 'offline' (the chains of a "
                          "sample store; online, set distill.mode_embedding = 0)")
    if d.mode_embedding and d.per_chain:
        raise ConfigError(f"{where}: 'distill.mode_embedding' conditions one generator on the chain, "
                          "'distill.per_chain' trains one per chain; set one of them off")
    if d.align != "none" and not cfg.net.hidden:
        raise ConfigError(f"{where}: 'distill.align' = {d.align!r} permutes hidden units; a network without "
                          "'net.hidden' layers has none (set distill.align = \"none\")")
    _check_network(cfg, where)
    e = cfg.evaluate
    if not e.scores or (unknown := sorted(set(e.scores) - set(SCORE_NAMES))):
        raise ConfigError(f"{where}: 'evaluate.scores' must name some of {', '.join(SCORE_NAMES)}"
                          + (f"; {unknown[0]!r} is none of them" if e.scores else ""))
    if not e.mog_components:
        raise ConfigError(f"{where}: 'evaluate.mog_components' must list at least one number of components")
    if cfg.evaluate.mog_fit_samples < max(cfg.evaluate.mog_components):
        raise ConfigError(f"{where}: 'evaluate.mog_fit_samples' must be at least the largest "
                          f"'evaluate.mog_components'")


def _check_sgld(s: SGLDConfig, where: str) -> None:
    """A schedule that fits the iterations, and a chain that keeps at least one sample."""
    if s.schedule == "cyclical" and s.cycles > s.iterations:
        raise ConfigError(f"{where}: 'sgld.cycles' ({s.cycles}) must be at most 'sgld.iterations' ({s.iterations})")
    if thinned_count(s) == 0:
        phases = " and the cycles' sampling phases" if s.schedule == "cyclical" else ""
        raise ConfigError(f"{where}: the chains would keep no sample: with 'sgld.iterations' ({s.iterations}), "
                          f"'sgld.burn_in' ({s.burn_in}){phases}, 'sgld.thin' ({s.thin}) skips every iterate; "
                          "lower sgld.thin or sgld.burn_in")


def _check_network(cfg: PipelineConfig, where: str) -> None:
    """A convolutional network (``net.conv``) needs images and no MLP-only method or option."""
    if not cfg.net.conv:
        return
    if min(cfg.net.conv) < 1:
        raise ConfigError(f"{where}: 'net.conv' must list positive channel counts, got {cfg.net.conv}")
    if cfg.data.dataset == "toy2d":
        raise ConfigError(f"{where}: 'net.conv' needs images; toy2d has points in the plane")
    d = cfg.distill
    if d.align != "none":
        raise ConfigError(f"{where}: 'distill.align' = {d.align!r} permutes an MLP's hidden units; a network "
                          "with 'net.conv' needs distill.align = \"none\"")
    if d.residual.model == "kronecker":
        raise ConfigError(f"{where}: 'distill.residual.model' = \"kronecker\" factors an MLP's layers; a network "
                          "with 'net.conv' needs \"none\" or \"diagonal\"")
    mlp_only = [m for m in cfg.evaluate.methods if m in MLP_ONLY_METHODS]
    if mlp_only:
        raise ConfigError(f"{where}: 'evaluate.methods' has {mlp_only[0]!r}, defined for MLPs only; a network "
                          f"with 'net.conv' can use none of {', '.join(MLP_ONLY_METHODS)}")
