"""Convergence diagnostics: time of R-hat + bulk ESS + tail ESS for Q quantities, ArviZ against numpy.

Run: ``.venv/bin/python benchmarks/bench_diagnostics.py [--out FILE]`` (a minute or two on one thread). For 4 chains
of 500 or 2000 i.i.d. normal draws and Q = 300, 1000, 2000 quantities it prints the seconds
:func:`apd.samplers.rank_stats.rank_diagnostics` takes with ``engine="arviz"`` (ArviZ's functions behind an
xarray ``quantity`` dimension, a Python loop over the quantities) and ``engine="numpy"`` (the same
statistics on whole arrays), the ratio, and the largest relative difference between the two results.
Best of ``REPEATS`` runs after a warm-up (``timing.best_time``), on one torch/BLAS thread.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from record import BenchmarkRecord, add_out_argument
from timing import best_time

from apd.samplers.rank_stats import rank_diagnostics

CHAINS = 4
SHAPES = [(500, 300), (500, 1000), (500, 2000), (2000, 300), (2000, 2000)]  # (draws per chain, Q)
REPEATS = 2
SAMPLE_STAGE_SHAPE = (500, 2000)  # what `apd sample` diagnoses: 4 chains thinned to 500 draws, 2,000 inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("sample")
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"{'draws':>6} {'Q':>6} {'arviz s':>8} {'numpy s':>8} {'ratio':>6} {'max rel diff':>12}")
    for n_draws, n_q in SHAPES:
        draws = rng.standard_normal((CHAINS, n_draws, n_q))
        t_arviz = best_time(lambda d=draws: rank_diagnostics(d, engine="arviz"), REPEATS)
        t_numpy = best_time(lambda d=draws: rank_diagnostics(d, engine="numpy"), REPEATS)
        a, b = rank_diagnostics(draws, engine="arviz"), rank_diagnostics(draws, engine="numpy")
        diff = max(float(np.max(np.abs(a[k] - b[k]) / np.abs(a[k]))) for k in a)
        print(f"{n_draws:>6} {n_q:>6} {t_arviz:>8.2f} {t_numpy:>8.2f} {t_arviz / t_numpy:>6.1f} {diff:>12.1e}",
              flush=True)
        if (n_draws, n_q) == SAMPLE_STAGE_SHAPE:
            record.add(f"R-hat + bulk and tail ESS of {n_q:,} quantities, {CHAINS} chains × {n_draws} draws, 1 "
                       "thread: the numpy engine against ArviZ (`bench_diagnostics.py`)",
                       f"{t_numpy:.1f} s against {t_arviz:.1f} s ({t_arviz / t_numpy:.1f}×); largest relative "
                       f"difference {diff:.0e}")
    record.write(args.out)


if __name__ == "__main__":
    main()
