"""Which CPU kernels the linear algebra takes: what, besides the processor, decides a CPU run's last bits.

torch's CPU wheel links Intel's MKL, which picks its matrix kernels by the processor's vendor as well as its
instruction sets: on an AMD processor it takes other kernels than on an Intel one with the same AVX-512, so
that sums are rounded otherwise and an SGLD chain carries the difference forward into other samples. numpy's
and scipy's OpenBLAS (the principal subspaces, scikit-learn's fits) pick theirs by the processor model, which
``OPENBLAS_CORETYPE`` overrides. ``make … KERNELS=intel`` runs a stage with MKL's test of the vendor answered
"Intel" (``kernels/mkl_intel_cpu.c``, preloaded) and OpenBLAS's SkylakeX kernels: on an AMD EPYC with AVX-512
the published stores, sampled on an Intel Xeon, then come out bit for bit (docs/results.md, "How the numbers
are made, and how far they reproduce"). :func:`cpu_kernels` says which were taken, for the machine record.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy  # noqa: F401 (loads the OpenBLAS whose kernels are reported)
import threadpoolctl
import torch

MKL_VENDOR_TEST = "mkl_serv_intel_cpu_true"  # MKL's own test of the vendor, 1 on an Intel processor


def mkl_kernels() -> str:
    """``Intel`` where MKL takes its Intel kernels, ``non-Intel`` where it does not, ``none`` without MKL.

    MKL calls its vendor test through the process's global symbols, where a preloaded library comes first;
    torch's own copy (in ``libtorch_cpu``, loaded privately) answers where none is preloaded."""
    torch_cpu = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    for library in (None, torch_cpu):
        try:
            vendor_test = getattr(ctypes.CDLL(library), MKL_VENDOR_TEST)
        except (OSError, AttributeError):  # not loaded here (another platform), or no MKL in it
            continue
        return "Intel" if vendor_test() else "non-Intel"
    return "none"


def openblas_kernels() -> list[str]:
    """The kernels (OpenBLAS's name for a processor model) of each OpenBLAS loaded, without repeats."""
    found = [info.get("architecture") for info in threadpoolctl.threadpool_info() if info["internal_api"] == "openblas"]
    return sorted({name for name in found if name})


def cpu_kernels() -> str:
    """MKL's and OpenBLAS's kernels in one line, e.g. ``MKL Intel, OpenBLAS SkylakeX``."""
    return f"MKL {mkl_kernels()}, OpenBLAS {' and '.join(openblas_kernels()) or 'none'}"
