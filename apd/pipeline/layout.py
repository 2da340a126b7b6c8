"""Every path of a pipeline's artifacts, in one place: ``ROOT/NAME/…``.

A complete artifact is a data file plus its manifest (``X.json`` beside ``X.h5`` or ``X.pt``), the
manifest written last. Work in progress never lives under a complete artifact's name: a stage builds
into ``*.partial`` files (resumable state beside them in ``*.ckpt.pt``) and swaps them in when done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PIPELINE_STAGES = ("sample", "distill", "evaluate")  # the stages of `make sample distill evaluate`, in order


def manifest_of(artifact: Path) -> Path:
    """The manifest that marks ``artifact`` complete: ``samples.h5`` → ``samples.json``."""
    return artifact.with_suffix(".json")


def partial_of(artifact: Path) -> Path:
    """Where ``artifact`` is built before it is swapped in: ``samples.h5`` → ``samples.partial.h5``."""
    return artifact.with_name(f"{artifact.stem}.partial{artifact.suffix}")


def checkpoint_of(artifact: Path) -> Path:
    """A stage's resumable state for ``artifact``: ``samples.h5`` → ``samples.ckpt.pt``."""
    return artifact.with_name(f"{artifact.stem}.ckpt.pt")


@dataclass(frozen=True)
class Layout:
    """The artifact directory of one pipeline."""

    root: Path

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def samples(self) -> Path:
        return self.root / "samples.h5"

    def shard(self, rank: int) -> Path:
        """Worker ``rank``'s own store when several workers sample."""
        return self.root / f"samples-{rank}.h5"

    @property
    def diagnostics_figure(self) -> Path:
        """Trace and rank plots of the SGLD chains' convergence diagnostics."""
        return self.root / "diagnostics.png"

    def baseline(self, name: str) -> Path:
        return self.root / "baselines" / f"{name}.pt"

    @property
    def generator(self) -> Path:
        return self.generator_of(0)

    @property
    def generator_last(self) -> Path:
        return self.generator_last_of(0)

    def generator_of(self, seed: int) -> Path:
        """Generator seed ``seed``'s kept generator (``[distill] seeds``): ``generator.pt`` for seed 0, the
        pipeline's generator, ``generator-seedK.pt`` for seed K ≥ 1; its manifest beside it."""
        return self.root / ("generator.pt" if seed == 0 else f"generator-seed{seed}.pt")

    def generator_last_of(self, seed: int) -> Path:
        """Generator seed ``seed``'s last generator: ``generator-last.pt``, ``generator-seedK-last.pt``."""
        return self.root / ("generator-last.pt" if seed == 0 else f"generator-seed{seed}-last.pt")

    @property
    def alignment(self) -> Path:
        """The samples' hidden units aligned as ``[distill] align`` says, made once for every process that needs
        them (:mod:`apd.pipeline.stored_alignment`)."""
        return self.root / "alignment.h5"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def results(self) -> Path:
        return self.eval_dir / "results.json"

    @property
    def scores(self) -> Path:
        return self.eval_dir / "scores.h5"

    @property
    def toy2d_maps(self) -> Path:
        """The 2-D pipelines' grid maps (``apd toy2d-figure``); its manifest beside it."""
        return self.eval_dir / "toy2d.h5"

    @property
    def toy2d_figure(self) -> Path:
        return self.eval_dir / "figures" / "toy2d.png"

    @property
    def evaluate_manifest(self) -> Path:
        return self.eval_dir / "evaluate.json"

    def adversarial_set(self, whitebox: bool, source: str, attack: str) -> Path:
        """``adversarial/SOURCE-ATTACK.h5`` (gray-box) or ``adversarial/whitebox-SOURCE-ATTACK.h5``."""
        return self.root / "adversarial" / f"{'whitebox-' if whitebox else ''}{source}-{attack}.h5"

    @property
    def experiments(self) -> Path:
        return self.root / "experiments"
