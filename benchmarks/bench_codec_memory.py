"""The subspace codec's peak memory: what fitting it (``apd.distillation.codec.fit_codec``, rank 35, with the
per-dimension residual) holds beyond its input, in multiples of the input [n, D].

Run: ``.venv/bin/python benchmarks/bench_codec_memory.py [--rows 2000] [--dim 150000] [--out FILE]`` (one
thread). The input is Gaussian: memory depends only on the sizes. fcNN2's distiller fits 2,000 rows of
D = 478,410 weights (3.8 GB as float32), once per budget in its frontier and precision studies; the default
is the same rows at a third of its D (at fcNN2's own D the ratio came out a little lower). One fit per
process: the peak RSS (``ru_maxrss``) is the process's own, taken after the input is made and after the fit.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from record import BenchmarkRecord, add_out_argument

from apd.distillation.codec import fit_codec


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000, help="samples the codec is fitted to")
    parser.add_argument("--dim", type=int, default=150_000, help="weights per sample")
    add_out_argument(parser)
    args = parser.parse_args()
    record = BenchmarkRecord("distill")
    torch.set_num_threads(1)
    samples = torch.randn(args.rows, args.dim, generator=torch.Generator().manual_seed(0))
    before = peak_rss_bytes()
    start = time.perf_counter()
    fit_codec("subspace", samples, rank=35, residual=True)
    seconds = time.perf_counter() - start
    beyond = (peak_rss_bytes() - before) / (samples.numel() * samples.element_size())
    print(f"{args.rows:,} × {args.dim:,} float32 ({samples.numel() * 4 / 2**30:.2f} GiB): fit {seconds:.1f} s, "
          f"peak beyond the input {beyond:.2f}× the input")
    record.add(f"subspace codec fit, rank 35 with the residual, {args.rows:,} × {args.dim:,} samples, 1 thread: "
               "peak memory beyond the input (`bench_codec_memory.py`)",
               f"{beyond:.2f}× the input ({seconds:.1f} s)", "≤ 1.5× (the centred copy SVD needs, and its work)")
    record.write(args.out)


if __name__ == "__main__":
    main()
