# apd: `make sample distill evaluate` runs the pipeline, `make test` the tests,
# `make experiment EXPERIMENT=distillers` a study on the pipeline's samples.
# Every target builds .venv itself; it is rebuilt only when pyproject.toml, constraints.txt or
# requirements-nodeps.txt change.
PIPELINE ?= pipelines/digits.toml
ARGS ?=
EXPERIMENT ?= distillers
VENV := .venv
PY := $(VENV)/bin/python
APD := $(VENV)/bin/apd
STAMP := $(VENV)/.installed

.PHONY: install sample distill evaluate report info experiment test test-slow lint bench clean

$(STAMP): pyproject.toml constraints.txt requirements-nodeps.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

install: $(STAMP)

sample: $(STAMP)
	$(APD) sample --config $(PIPELINE) $(ARGS)

distill: $(STAMP)
	$(APD) distill --config $(PIPELINE) $(ARGS)

evaluate: $(STAMP)
	$(APD) evaluate --config $(PIPELINE) $(ARGS)

report: $(STAMP)
	$(APD) report --config $(PIPELINE) $(ARGS)

info: $(STAMP)
	$(APD) info --config $(PIPELINE) $(ARGS)

experiment: $(STAMP)
	$(APD) experiment $(EXPERIMENT) --config $(PIPELINE) $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check apd tests benchmarks

test: lint
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
