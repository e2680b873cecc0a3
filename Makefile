# raftmq: every target installs what it needs (virtualenv, pip packages, Debian packages).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
DEBS := procps iproute2 openjdk-17-jre-headless docker-compose
PACKAGES := raftlog namesrv broker controller client spark_source chaos

.PHONY: test test-slow lint types unit run bench bench-raftlog bench-spark clean deps debs

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

deps: debs $(STAMP)
	@bash scripts/gen_proto.sh

debs:
	@./scripts/ensure_debs.sh $(DEBS)

lint: deps
	$(BIN)/ruff check $(PACKAGES) tests bench

types: deps
	$(BIN)/mypy $(PACKAGES)

unit: deps
	$(BIN)/pytest -q

# What CI runs (.ci/run): lint, types, then the suite.
test: lint types unit

test-slow: deps
	$(BIN)/pytest -q -m slow

run: deps
	$(BIN)/python -m client.cli cluster up

bench: bench-raftlog bench-spark

bench-raftlog: deps
	$(BIN)/python bench/raftlog_bench.py

bench-spark: deps
	$(BIN)/python bench/spark_bench.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
