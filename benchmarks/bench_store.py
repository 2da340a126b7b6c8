"""SampleStore: append cost against the sampler's time budget, bytes per sample, random-row reads.

Run: ``.venv/bin/python benchmarks/bench_store.py [--out FILE]`` (about a minute; writes under a temporary directory
and removes it). For the paper's two networks (fcNN1 784-100-10, D = 79,510; fcNN2 784-400-400-10,
D = 478,410) it prints

* append time per row (one ``append`` call, flushed) and bytes per stored sample (file size / n) for
  each compression and for one or eight rows per HDF5 chunk, and the share of sampling wall time the
  appends take at the paper's thinning: share = t_append / (20·t_iter + t_append), assuming an SGLD
  iteration takes 1.3 ms (fcNN1) or 5 ms (fcNN2) and one sample is kept every 20 iterations;
* the time to read 100 random rows by an h5py per-row loop, by one h5py fancy-indexed read, and by
  ``SampleStore.read``, with the ratios.

The samples are a freshly initialised network's weights plus N(0, 0.01²) noise per row, which
compress about as badly as real SGLD samples (random low-order mantissa bits). Reads come from the page
cache (the files were just written); a cold disk slows all three read methods alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from record import BenchmarkRecord, add_out_argument
from timing import best_time

from apd.nets import ParamSpec, mlp
from apd.samplers.store import COMPRESSIONS, SampleStore

NETS = {"fcNN1": ([784, 100, 10], 1.3e-3), "fcNN2": ([784, 400, 400, 10], 5e-3)}
THIN = 20
TARGET_SHARE = 0.05
APPEND_ROWS = {"fcNN1": 64, "fcNN2": 24}
READ_STORE_ROWS = {"fcNN1": 600, "fcNN2": 200}
READ_K = 100
CHUNK_ROWS = (1, 8)
READ_LAYOUTS = [("none", 1), ("none", 8), ("lzf", 1), ("gzip", 1)]  # (compression, rows per chunk)


def sample_rows(sizes: list[int], n: int, seed: int) -> tuple[ParamSpec, np.ndarray]:
    """n vectors θ_i = θ_0 + 0.01·ε_i with θ_0 a default-initialised MLP and ε_i ~ N(0, I)."""
    torch.manual_seed(seed)
    net = mlp(sizes)
    spec = ParamSpec.from_module(net)
    theta0 = spec.flatten(net).numpy()
    noise = np.random.default_rng(seed).standard_normal((n, spec.numel), dtype=np.float32)
    return spec, theta0 + 0.01 * noise


def time_appends(path: Path, spec: ParamSpec, rows: np.ndarray, compression: str,
                 chunk_rows: int) -> tuple[float, float]:
    """(seconds per ``append``, file bytes per stored sample) for appending ``rows`` one by one."""
    with SampleStore.create(path, spec, {"bench": True}, compression=compression,
                            chunk_rows=chunk_rows) as store:
        start = time.perf_counter()
        for i, vec in enumerate(rows):
            store.append(vec, step=THIN * i)
        seconds = (time.perf_counter() - start) / len(rows)
    size = path.stat().st_size / len(rows)
    path.unlink()
    return seconds, size


def time_reads(store: SampleStore, indices: np.ndarray) -> tuple[float, float, float]:
    """Seconds to read rows ``indices``: h5py row loop, h5py fancy read, ``SampleStore.read``."""
    dataset = store.samples
    distinct = np.unique(indices)  # h5py fancy indexing needs increasing, distinct indices
    expected = np.stack([dataset[i] for i in indices])
    assert np.array_equal(store.read(indices).numpy(), expected)
    loop = best_time(lambda: np.stack([dataset[i] for i in indices]), 3)
    fancy = best_time(lambda: dataset[distinct], 3)
    ours = best_time(lambda: store.read(indices), 3)
    return loop, fancy, ours


def append_table(path: Path) -> dict[tuple[str, str, int], tuple[float, float, float]]:
    """Print append ms/row, bytes per sample and share of sampling time for every net and layout; returns
    them by (net, compression, rows per chunk)."""
    measured = {}
    print(f"Append, one flushed row per call; share of sampling time at thinning {THIN}, "
          f"target ≤ {TARGET_SHARE:.0%}")
    print(f"{'net':6} {'D':>8} {'compression':>11} {'chunk rows':>10} {'ms/row':>8} "
          f"{'bytes/sample':>13} {'bytes/param':>11} {'share':>7}")
    for name, (sizes, iter_seconds) in NETS.items():
        spec, rows = sample_rows(sizes, APPEND_ROWS[name], seed=0)
        for compression in COMPRESSIONS:
            for chunk_rows in CHUNK_ROWS:
                seconds, size = time_appends(path, spec, rows, compression, chunk_rows)
                share = seconds / (THIN * iter_seconds + seconds)
                measured[name, compression, chunk_rows] = seconds, size, share
                flag = "" if share <= TARGET_SHARE else "  over"
                print(f"{name:6} {spec.numel:>8,} {compression:>11} {chunk_rows:>10} {seconds * 1e3:>8.2f} "
                      f"{size:>13,.0f} {size / spec.numel:>11.3f} {share:>6.1%}{flag}")
    print(f"(SGLD iteration assumed {NETS['fcNN1'][1] * 1e3:.1f} ms for fcNN1, "
          f"{NETS['fcNN2'][1] * 1e3:.1f} ms for fcNN2; share = t_append / ({THIN}·t_iter + t_append))")
    return measured


def read_table(path: Path) -> dict[tuple[str, str, int], tuple[float, float, float]]:
    """Print the three ways of reading 100 random rows side by side for every net and layout; returns their
    seconds (loop, fancy, ``SampleStore.read``) by (net, compression, rows per chunk)."""
    measured = {}
    print(f"Read {READ_K} random rows (drawn with replacement), best of 3, ms")
    print(f"{'net':6} {'rows':>5} {'compression':>11} {'chunk rows':>10} {'h5py loop':>10} "
          f"{'h5py fancy':>10} {'store.read':>10} {'fancy/read':>10} {'loop/read':>9}")
    for name, (sizes, _) in NETS.items():
        spec, rows = sample_rows(sizes, READ_STORE_ROWS[name], seed=1)
        indices = np.random.default_rng(2).integers(0, len(rows), READ_K)
        for compression, chunk_rows in READ_LAYOUTS:
            with SampleStore.create(path, spec, {}, compression=compression, chunk_rows=chunk_rows,
                                    overwrite=True) as store:
                for block in range(0, len(rows), 8):
                    store.append_many(rows[block:block + 8], steps=np.arange(block, block + 8))
                loop, fancy, ours = measured[name, compression, chunk_rows] = time_reads(store, indices)
            print(f"{name:6} {len(rows):>5} {compression:>11} {chunk_rows:>10} {loop * 1e3:>10.1f} "
                  f"{fancy * 1e3:>10.1f} {ours * 1e3:>10.1f} {fancy / ours:>10.1f} {loop / ours:>9.1f}")
        path.unlink()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("sample")
    with tempfile.TemporaryDirectory(prefix="bench_store_") as tmp:
        path = Path(tmp) / "samples.h5"
        appends = append_table(path)
        print()
        reads = read_table(path)
    plain = {name: appends[name, "none", 1] for name in NETS}
    record.add(f"HDF5 append, one flushed row, {' / '.join(NETS)} (`bench_store.py`; share of sampling time at "
               f"thin {THIN})", " / ".join(f"{t * 1e3:.2f}" for t, _, _ in plain.values()) + " ms: "
               + " / ".join(f"{100 * share:.1f} %" for _, _, share in plain.values()), f"≤ {100 * TARGET_SHARE:.0f} %")
    record.add("bytes per stored fcNN1 sample: " + " / ".join(COMPRESSIONS) + " (share of sampling time)",
               " / ".join(f"{appends['fcNN1', c, 1][1]:,.0f} ({100 * appends['fcNN1', c, 1][2]:.1f} %)"
                          for c in COMPRESSIONS))
    record.add(f"{READ_K} random rows: `SampleStore.read` against one fancy-indexed h5py read",
               ", ".join(f"{reads[name, 'none', 1][1] / reads[name, 'none', 1][2]:.1f}× faster ({name})"
                         for name in NETS))
    record.write(args.out)


if __name__ == "__main__":
    main()
