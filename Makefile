# apd: `make sample distill evaluate` runs the pipeline, `make test` the tests, `make experiment
# EXPERIMENT=distillers` a study on the pipeline's samples (`apd experiment --help` lists them), `make active`
# active learning, `make publish PIPELINE=…` then `make docs` the committed results.
# Every target builds .venv itself; it is rebuilt only when pyproject.toml, constraints.txt or
# requirements-nodeps.txt change.
PIPELINE ?= pipelines/digits.toml
ARGS ?=
# CHAINS=C / WORKERS=W override [sgld] chains and workers (W processes on this machine, chain c on worker
# c mod W); passed to every stage, since the chain count is part of the samples' configuration.
CHAINS ?=
WORKERS ?=
SGLD_ARGS := $(if $(CHAINS),--set sgld.chains=$(CHAINS)) $(if $(WORKERS),--set sgld.workers=$(WORKERS))
EXPERIMENT ?= distillers
VENV := .venv
PY := $(VENV)/bin/python
APD := $(VENV)/bin/apd
STAMP := $(VENV)/.installed
# KERNELS=intel runs a stage with an Intel processor's CPU kernels on any x86 processor with AVX-512: MKL's
# test of the vendor answered "Intel" (kernels/mkl_intel_cpu.c, built with cc and preloaded) and OpenBLAS's
# SkylakeX kernels. On an AMD EPYC the published stores, sampled on an Intel Xeon, then come out bit for bit
# (apd/pipeline/kernels.py; docs/results.md, "How the numbers are made, and how far they reproduce").
# Refused where the processor lists no AVX-512 (OpenBLAS's SkylakeX kernels would not run there).
KERNELS ?=
CPUINFO ?= /proc/cpuinfo
ifeq ($(KERNELS),intel)
ifeq ($(shell grep -qw avx512f $(CPUINFO) 2>/dev/null && echo yes),)
$(error KERNELS=intel needs an x86 processor with AVX-512 (no avx512f in $(CPUINFO)): leave KERNELS out)
endif
MKL_INTEL := $(VENV)/mkl_intel_cpu.so
APD := LD_PRELOAD=$(CURDIR)/$(MKL_INTEL) OPENBLAS_CORETYPE=SkylakeX $(APD)
else ifneq ($(KERNELS),)
$(error KERNELS=$(KERNELS): leave it out, or give KERNELS=intel)
endif
RUN := $(STAMP) $(MKL_INTEL)

.PHONY: install sample distill evaluate report info experiment active docs publish reproduce test test-slow lint bench clean toy2d wheels bare-install

$(STAMP): pyproject.toml constraints.txt requirements-nodeps.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

install: $(STAMP)

ifdef MKL_INTEL
$(MKL_INTEL): kernels/mkl_intel_cpu.c $(STAMP)
	cc -shared -fPIC -O2 -o $@ $<
endif

sample: $(RUN)
	$(APD) sample --config $(PIPELINE) $(SGLD_ARGS) $(ARGS)

distill: $(RUN)
	$(APD) distill --config $(PIPELINE) $(SGLD_ARGS) $(ARGS)

evaluate: $(RUN)
	$(APD) evaluate --config $(PIPELINE) $(SGLD_ARGS) $(ARGS)

report: $(RUN)
	$(APD) report --config $(PIPELINE) $(SGLD_ARGS) $(ARGS)

info: $(RUN)
	$(APD) info --config $(PIPELINE) $(SGLD_ARGS) $(ARGS)

docs: $(RUN)
	$(APD) report --docs

publish: $(RUN)
	$(APD) report --publish --config $(PIPELINE) $(ARGS)

reproduce: $(RUN)
	$(APD) reproduce --config $(PIPELINE) $(ARGS)

experiment: $(RUN)
	$(APD) experiment $(EXPERIMENT) --config $(PIPELINE) $(SGLD_ARGS) $(ARGS)

active: $(RUN)
	$(APD) experiment active-learning --config $(PIPELINE) $(ARGS)

# Two Gaussian blobs in the plane: every method through the same stages, then each one's predictive and
# BALD over the plane in artifacts/toy2d/eval/figures/toy2d.png.
TOY2D := pipelines/toy2d.toml
toy2d: $(RUN)
	$(APD) sample --config $(TOY2D) $(ARGS)
	$(APD) distill --config $(TOY2D) $(ARGS)
	$(APD) evaluate --config $(TOY2D) $(ARGS)
	$(APD) toy2d-figure --config $(TOY2D) $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check apd tests benchmarks

# The test files on TEST_WORKERS processes at once (pytest-xdist; a file's tests stay together on one, so
# its fixtures are built once); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# Each benchmark's record goes to $(BENCH_OUT); copied to docs/results/benchmarks/, `make docs` renders the
# Performance table of docs/performance.md from them.
BENCH_OUT ?= artifacts/benchmarks
bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b --out $(BENCH_OUT)/$$(basename $$b .py).json || exit 1; done

# A bare, offline GPU machine (Python with CUDA torch, numpy, scipy, scikit-learn, h5py, matplotlib, tqdm,
# pytest, pandas, xarray, torchmetrics, einops, opt-einsum and linear-operator, as docs/gpu.md says): `make
# wheels` here downloads the project's other packages, at the versions .venv holds, into .whl/ for Python
# $(WHEELS_PYTHON), with Fashion-MNIST's files where the Debian package put them; carried there beside the
# checkout, `make bare-install` installs them into .whl/site and `PYTHONPATH=.whl/site:. python3 -m apd …`
# runs from the checkout (benchmarks/on_a_card.sh runs the GPU checks so).
WHEELS := .whl
FASHION := /usr/share/datasets/fashion-mnist
WHEELS_PYTHON ?= 3.12
BARE_PACKAGES := arviz|pytest.timeout|platformdirs|xarray.einstats|h5netcdf|laplace.torch|backpack.for.pytorch|curvlinops.for.pytorch|asdfghjkl|einconv|unfoldnd|stein.thinning
wheels: $(STAMP)
	mkdir -p $(WHEELS)
	$(PY) -m pip freeze | grep -i -E '^($(BARE_PACKAGES))==' > $(WHEELS)/requirements.txt
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) -d $(WHEELS) \
		-r $(WHEELS)/requirements.txt
	if [ -d $(FASHION) ]; then mkdir -p $(WHEELS)/fashion-mnist && cp $(FASHION)/*.gz $(WHEELS)/fashion-mnist/; fi

bare-install:
	python3 -m pip install -q --no-deps --no-index --target $(WHEELS)/site $(WHEELS)/*.whl

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
