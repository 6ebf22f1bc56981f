# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast docs lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# constraints.txt pins what CI runs (torch 2.13.0 CPU from local disk, zfpy 1.0.1); the
# package's own requirements are ranges.
# The demo installs the package itself (no editable install: setuptools warns on every one), so
# it is rebuilt when a source file changes.
SOURCES := $(shell find topologies perfmodel realrun -name '*.py' -o -name '*.toml' -o -name '*.cu')
$(VENV)/.core: $(BIN)/python pyproject.toml constraints.txt $(SOURCES)
	$(BIN)/pip install --quiet -c constraints.txt .
	touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

# The seed-paper scenario: GPT-NeoX-20B on 192 V100 of Lassen, uncompressed vs naive vs the hybrids.
demo: $(VENV)/.core
	$(BIN)/perfmodel compare --model gpt-neox-20b --cluster lassen --gpus 192 --tp 4 --pp 4 \
		--mbs 4 --gbs 1056 --zero 1 --recompute full --policies "none,naive:zfp(rate=8),hybrid,mzhybrid,zhybrid"

# the docs build first, so that pytest's summary closes the output
test: $(VENV)/.dev
	$(MAKE) docs
	$(BIN)/python -m pytest -q

# The documentation site (docs/, mkdocs.yml; API pages generated from the docstrings by
# scripts/gen_ref_pages.py) into build/site. --strict: a broken link, a page outside the nav or a
# module griffe cannot read fails the build, so `make test` fails with it.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
docs: $(VENV)/.dev
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --site-dir build/site

# The edit loop, a few minutes on 2 cores: no network namespaces, GPUs, multi-rank runs, notebooks
# or slow tests (the pytest markers of pyproject.toml). `make test` stays the whole suite, as CI runs it.
FAST := not distributed and not netns and not gpu and not slow and not notebooks
test-fast: $(VENV)/.dev
	$(BIN)/python -m pytest -q -m "$(FAST)"

lint: $(VENV)/.dev
	$(BIN)/ruff check topologies perfmodel realrun tests benchmarks scripts notebooks

clean:
	rm -rf $(VENV) build *.egg-info
