"""Which CPU kernels a run took (apd/pipeline/kernels.py), each told to a fresh process as `KERNELS=intel`
tells it: OpenBLAS's by ``OPENBLAS_CORETYPE``, MKL's by a preloaded vendor test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from apd.pipeline.kernels import mkl_kernels

REPO = Path(__file__).resolve().parents[2]
AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else False


def kernels_in_a_process(**environment: str) -> str:
    """:func:`~apd.pipeline.kernels.cpu_kernels` as a fresh Python process with ``environment`` reports it."""
    code = "from apd.pipeline.kernels import cpu_kernels; print(cpu_kernels())"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **environment}, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not AVX512, reason="OpenBLAS's SkylakeX kernels need AVX-512")
def test_openblas_kernels_are_those_the_process_was_told():
    assert kernels_in_a_process(OPENBLAS_CORETYPE="SkylakeX").endswith("OpenBLAS SkylakeX")
    assert kernels_in_a_process(OPENBLAS_CORETYPE="Haswell").endswith("OpenBLAS Haswell")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the vendor test")
@pytest.mark.skipif(mkl_kernels() == "none", reason="this torch has no MKL")
@pytest.mark.parametrize(("answer", "reported"), [(None, "MKL Intel"), (0, "MKL non-Intel")])
def test_mkl_kernels_are_those_its_preloaded_vendor_test_answers(tmp_path, answer, reported):
    """The shipped vendor test (answering Intel), and one answering "not Intel", preloaded: the report is what
    the test MKL calls answers, not what torch's own copy would say on this processor."""
    source = REPO / "kernels" / "mkl_intel_cpu.c"
    if answer is not None:
        source = tmp_path / "answer.c"
        source.write_text(f"int mkl_serv_intel_cpu_true(void) {{ return {answer}; }}\n")
    library = tmp_path / "vendor_test.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    assert kernels_in_a_process(LD_PRELOAD=str(library)).startswith(f"{reported},")


NEEDS_MAKE = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def make_info(tmp_path: Path, kernels: str, cpu_flags: str) -> subprocess.CompletedProcess:
    """``make -n info KERNELS=kernels`` (nothing built or run) on a processor whose flags line is ``cpu_flags``."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"flags\t\t: {cpu_flags}\n")
    return subprocess.run(["make", "-n", "-C", str(REPO), "info", f"CPUINFO={cpuinfo}", f"KERNELS={kernels}"],
                          capture_output=True, text=True)


@NEEDS_MAKE
@pytest.mark.parametrize(("kernels", "cpu_flags", "refusal"), [
    ("intel", "fpu avx2", "KERNELS=intel needs an x86 processor with AVX-512"),
    ("amd", "fpu avx2 avx512f", "KERNELS=amd: leave it out, or give KERNELS=intel"),
])
def test_make_refuses_kernels_it_cannot_give(tmp_path, kernels, cpu_flags, refusal):
    """`make … KERNELS=…` is one line and exit code 2 for a value it does not know, and for KERNELS=intel on a
    processor that lists no AVX-512 (read from ``CPUINFO``)."""
    refused = make_info(tmp_path, kernels, cpu_flags)
    assert refused.returncode == 2
    assert refusal in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


@NEEDS_MAKE
def test_make_takes_the_intel_kernels_where_avx512_is_listed(tmp_path):
    taken = make_info(tmp_path, "intel", "fpu avx2 avx512f")
    assert taken.returncode == 0, taken.stderr
    assert "LD_PRELOAD=" in taken.stdout and "OPENBLAS_CORETYPE=SkylakeX" in taken.stdout
