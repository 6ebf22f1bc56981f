# Two commands for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

demo: $(VENV)/.core
	$(BIN)/perfmodel collective allreduce --cluster dgx-a100 --nodes 2 --sweep 1MiB:1GiB \
		--compressor "none,fp16,int8,topk(0.01)"

test: $(VENV)/.dev
	$(BIN)/python -m pytest -q

lint: $(VENV)/.dev
	$(BIN)/ruff check topologies perfmodel tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
