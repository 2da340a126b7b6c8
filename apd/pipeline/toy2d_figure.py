"""``apd toy2d-figure``: each method's predictive and its BALD over the plane, for the toy2d pipeline.

On a ``GRID × GRID`` grid over [−BOX, BOX]² (:mod:`apd.toy2d`; wider than the data) every method of
``apd evaluate`` but the mixture predicts with the ensemble size evaluation uses (SGLD samples, APD
networks, MC-dropout passes; SGD is one network). Written under ``artifacts/NAME/eval/``:

- ``toy2d.h5``: the grid, the training points, and per method p̄(y = 1 | x) and BALD on the grid and
  BALD at the training points;
- ``toy2d.json`` (written last: the step's manifest): per method the mean BALD at the training points
  ("near") and at the grid points more than :data:`~apd.toy2d.FAR_SD` sd from both blob means ("far");
- ``figures/toy2d.png``: a column per method, p̄(y = 1 | x) above (shared scale [0, 1], the 0.5 contour
  in black) and BALD below (one scale for all methods), the training points on both. One network has
  no BALD (it is identically 0), so SGD's BALD panel says so instead of showing a flat colour.

The grid maps are computed once per evaluation config and inputs (the same hashes as ``apd evaluate``,
built under a temporary name and swapped in with their manifest); a later run only redraws the figure
from ``toy2d.h5``.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

import h5py
import numpy as np
import torch

from apd.config import config_hash
from apd.errors import ArtifactError, DataError
from apd.io import read_json
from apd.methods import MethodName, label
from apd.pipeline.figures import save_figure
from apd.pipeline.layout import manifest_of, partial_of
from apd.pipeline.manifests import is_complete, manifest_record
from apd.pipeline.methods import ensemble_sizes, load_methods
from apd.pipeline.runtime import RunContext
from apd.pipeline.stage import publish
from apd.posteriors import Posterior
from apd.toy2d import BOX, FAR_SD, far_mask
from apd.uncertainty import bald

log = logging.getLogger(__name__)

GRID = 150
METHODS = (MethodName.SGLD, MethodName.APD, MethodName.MCDROPOUT, MethodName.SGD)
ONE_NETWORK = (MethodName.SGD,)  # methods whose BALD is identically 0 (n/a)


def plane(grid: int = GRID, box: float = BOX) -> tuple[np.ndarray, torch.Tensor]:
    """The axis values [grid] and the grid points [grid², 2] (row-major: y slow, x fast)."""
    axis = np.linspace(-box, box, grid, dtype=np.float32)
    xx, yy = np.meshgrid(axis, axis)
    return axis, torch.from_numpy(np.stack([xx.ravel(), yy.ravel()], axis=1))


@torch.no_grad()
def method_maps(method: Posterior, k: int, points: torch.Tensor, x_train: torch.Tensor,
                generator: torch.Generator) -> dict[str, np.ndarray]:
    """p̄(y = 1 | x) and BALD on ``points``, and BALD at ``x_train``, of one draw of ``k`` members."""
    probs = method.predict_probs(torch.cat([points, x_train]), k, generator=generator).cpu()
    information = bald(probs).numpy()
    n = len(points)
    return {"p1": probs[:, :n, 1].mean(0).numpy(), "bald": information[:n], "bald_train": information[n:]}


def summarise(maps: dict[str, dict[str, np.ndarray]], far: np.ndarray) -> dict[str, dict]:
    """Per method: mean BALD at the training points and at the far grid points (None for one network)."""
    out = {}
    for name, m in maps.items():
        if name in ONE_NETWORK:
            out[name] = {"bald_train": None, "bald_far": None, "note": "n/a (one network)"}
            continue
        near_value, far_value = float(m["bald_train"].mean()), float(m["bald"][far].mean())
        out[name] = {"bald_train": near_value, "bald_far": far_value,
                     "far_over_train": far_value / near_value if near_value > 0 else None}
    return out


def run_toy2d_figure(ctx: RunContext) -> dict:
    """The whole step (module docstring); returns the summary written to ``toy2d.json``."""
    cfg, data = ctx.cfg, ctx.data
    if data.num_features != 2 or data.num_classes != 2:
        raise DataError(f"apd toy2d-figure draws the plane of a 2-feature, 2-class dataset; {data.name} has "
                        f"{data.num_features} features and {data.num_classes} classes")
    path, figure = ctx.layout.toy2d_maps, ctx.layout.toy2d_figure
    manifest = manifest_of(path)
    stage_hash = config_hash(cfg, "evaluate")
    with ExitStack() as stack:
        methods, inputs = load_methods(ctx, stack)
        missing = [name for name in METHODS if name not in methods]
        if missing:
            raise DataError(f"apd toy2d-figure draws {', '.join(METHODS)}; evaluate.methods lacks {missing[0]}")
        if not ctx.force and is_complete(manifest, stage_hash, inputs):
            log.info("reusing %s (--force to redo); redrawing %s", path, figure)
            summary = read_json(manifest)
        else:
            axis, points = plane()
            far = far_mask(points).numpy()
            sizes = ensemble_sizes(ctx, methods)
            generator = torch.Generator().manual_seed(ctx.seed("toy2d-figure", "draws"))
            maps = {name: method_maps(methods[name], sizes[name], points.to(ctx.device),
                                      data.x_train.to(ctx.device), generator)
                    for name in ctx.progress(METHODS, desc="toy2d maps", unit="method")}
            _write_maps(partial_of(path), axis, data.x_train.numpy(), data.y_train.numpy(), far, maps)
            summary = {"methods": summarise(maps, far), "ensemble": {m: sizes[m] for m in METHODS},
                       "grid": GRID, "box": BOX, "far_sd": FAR_SD, "far_points": int(far.sum()),
                       "train_points": len(data.y_train)}
            publish({partial_of(path): path}, manifest, manifest_record("toy2d-figure", stage_hash, inputs,
                                                                        **summary))
    draw(path, figure, summary, title=f"{cfg.name}: {'-'.join(map(str, ctx.net_sizes))} network, "
         f"{len(data.y_train)} training points")
    for name in METHODS:
        s = summary["methods"][name]
        if s["bald_train"] is None:
            print(f"{label(name):<11} mean BALD n/a (one network)")
        else:
            print(f"{label(name):<11} mean BALD at the training points {s['bald_train']:.4f}, "
                  f"far from both blobs (> {FAR_SD:g} sd) {s['bald_far']:.4f}")
    print(f"figure: {figure}")
    return summary


def _write_maps(path: Path, axis: np.ndarray, x_train: np.ndarray, y_train: np.ndarray, far: np.ndarray,
                maps: dict[str, dict[str, np.ndarray]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    grid = len(axis)
    with h5py.File(path, "w") as fh:
        fh["axis"], fh["x_train"], fh["y_train"] = axis, x_train, y_train
        fh["far"] = far.reshape(grid, grid)
        for name, m in maps.items():
            fh[f"{name}/p1"] = m["p1"].reshape(grid, grid)
            if name not in ONE_NETWORK:
                fh[f"{name}/bald"] = m["bald"].reshape(grid, grid)
                fh[f"{name}/bald_train"] = m["bald_train"]


def _members(name: str, count: int | None) -> str:
    """``100 samples``, ``100 passes``, ``1 network``: what one ensemble of ``name`` is made of."""
    if name in ONE_NETWORK:
        return "1 network"
    unit = {"sgld": "samples", "mcdropout": "passes"}.get(name, "networks")
    return f"{count} {unit}" if count else unit


def draw(path: Path, out: Path, summary: dict, title: str = "") -> Path:
    """Render ``figures/toy2d.png`` from ``toy2d.h5`` (module docstring)."""
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    try:
        fh = h5py.File(path, "r")
    except OSError as exc:
        raise ArtifactError(f"{path}: not a readable HDF5 file ({exc})") from None
    with fh:
        axis, x_train, y_train, far = fh["axis"][()], fh["x_train"][()], fh["y_train"][()], fh["far"][()]
        methods = [m for m in METHODS if m in fh]
        p1 = {m: fh[m]["p1"][()] for m in methods}
        information = {m: fh[m]["bald"][()] for m in methods if "bald" in fh[m]}
    extent = (axis[0], axis[-1], axis[0], axis[-1])
    bald_max = max(float(np.percentile(v, 99.5)) for v in information.values()) if information else 1.0
    prob_norm, bald_norm = Normalize(0.0, 1.0), Normalize(0.0, bald_max)
    figure = Figure(figsize=(3.1 * len(methods) + 1.2, 6.6), layout="constrained")
    axes = figure.subplots(2, len(methods), squeeze=False, sharex=True, sharey=True)
    prob_image = bald_image = None
    for col, name in enumerate(methods):
        top, bottom = axes[0, col], axes[1, col]
        prob_image = top.imshow(p1[name], origin="lower", extent=extent, cmap="RdBu_r", norm=prob_norm,
                                interpolation="bilinear")
        top.contour(axis, axis, p1[name], levels=[0.5], colors="black", linewidths=0.8)
        top.set_title(f"{label(name)} ({_members(name, summary.get('ensemble', {}).get(name))})", fontsize=11)
        stats = summary["methods"][name]
        if name in information:
            bald_image = bottom.imshow(information[name], origin="lower", extent=extent, cmap="magma",
                                       norm=bald_norm, interpolation="bilinear")
            bottom.contour(axis, axis, far.astype(float), levels=[0.5], colors="white", linewidths=0.7,
                           linestyles="dashed", alpha=0.7)
            bottom.set_title(f"mean BALD: near {stats['bald_train']:.3f}, far {stats['bald_far']:.3f}",
                             fontsize=9)
        else:
            bottom.set_facecolor("#e6e6e6")
            bottom.text(0.5, 0.8, "BALD n/a\n(one network)", transform=bottom.transAxes, ha="center",
                        va="center", fontsize=12, color="#444444",
                        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#999999"})
            bottom.set_title("one network cannot disagree with itself", fontsize=9)
        for ax in (top, bottom):
            for cls, color in ((0, "#2166ac"), (1, "#b2182b")):
                chosen = y_train == cls
                ax.scatter(x_train[chosen, 0], x_train[chosen, 1], s=9, c=color, edgecolors="white",
                           linewidths=0.4, zorder=3, label=f"class {cls}")
            ax.set_xlim(axis[0], axis[-1])
            ax.set_ylim(axis[0], axis[-1])
            ax.set_aspect("equal")
            ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("p(y = 1 | x)", fontsize=10)
    axes[1, 0].set_ylabel("BALD (nats)", fontsize=10)
    axes[0, -1].legend(loc="lower right", fontsize=7, framealpha=0.8)
    if prob_image is not None:
        figure.colorbar(prob_image, ax=axes[0, :], shrink=0.9, label="predictive p(y = 1 | x)")
    if bald_image is not None:
        figure.colorbar(bald_image, ax=axes[1, :], shrink=0.9, extend="max",
                        label="BALD = I[y; θ | x] (nats)")
    figure.suptitle((title + "\n" if title else "") + "top: predictive probability of class 1 (black: 0.5); "
                    "bottom: BALD, one colour scale; near = mean at the training points, far = mean beyond "
                    f"the dashed line ({summary.get('far_sd', FAR_SD):g} sd from both blob means)", fontsize=9)
    return save_figure(figure, out)
