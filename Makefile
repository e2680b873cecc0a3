# raftmq: every target installs what it needs (virtualenv, pip packages, Debian packages).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# The compiled parts (setup.py): the stored batch codec's C extension and the Raft core's modules
# compiled by mypyc, built again in place whenever a source or setup.py changes (pip install -e
# builds them once; an edited raftlog module runs from source until this rebuilds it).
EXT_SRC := common/_stored_batch_c.c raftlog/compiled.py raftlog/raft_messages.py raftlog/election.py \
  raftlog/replication.py raftlog/raft_codec.py raftlog/raft_core.py
EXT_STAMP := $(VENV)/.ext-$(shell cat $(EXT_SRC) setup.py | sha1sum | cut -c1-12)
# The official Node.js client's tests: npm ci into NODE_DIR again whenever its lock file changes.
NODE_DIR := tests/proxy/nodejs
NODE_STAMP := $(NODE_DIR)/node_modules/.installed-$(shell cat $(NODE_DIR)/package-lock.json | sha1sum | cut -c1-12)
# gcc, libc6-dev and python3-dev build the codec's C extension (without them pip installs the
# pure-Python twin and tests/common/test_stored_batch.py says so).
DEBS := gcc libc6-dev python3-dev procps iproute2 openjdk-17-jre-headless docker-compose nftables iptables chromium chromium-driver

.PHONY: test test-slow lint types unit chaos chaos-full run bench bench-raftlog bench-failover bench-spark clean deps debs node-deps dashboard-screens

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'  # dev pulls in every extra: server, cli, spark, chaos
	@rm -f $(VENV)/.installed-*; touch $@

$(EXT_STAMP): $(STAMP) $(EXT_SRC) setup.py
	$(BIN)/python setup.py -q build_ext --inplace
	@$(BIN)/python -c 'from raftmq.common import stored_batch as s; assert s.IMPLEMENTATION == "c", "the C codec did not build"'
	@$(BIN)/python -c 'import raftmq.raftlog as r; assert r.IMPLEMENTATION == "mypyc", r.IMPLEMENTATION_REASON'
	@rm -f $(VENV)/.ext-*; touch $@

deps: debs $(STAMP) $(EXT_STAMP) node-deps

# Node.js (Debian's, if the machine has none) and the locked npm packages of NODE_DIR.
node-deps: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_DIR)/package-lock.json
	@./scripts/ensure_node.sh $(NODE_DIR)
	@if [ -d $(NODE_DIR)/node_modules/rocketmq-client-nodejs ]; then \
	  rm -f $(NODE_DIR)/node_modules/.installed-*; touch $@; fi

debs:
	@./scripts/ensure_debs.sh $(DEBS)

# ruff (which also refuses the old top-level import names), the import-linter contracts of
# pyproject.toml (the layers: chaos -> ops -> client -> common, ...), and the committed wire
# modules against proto/.
lint: deps
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	bash scripts/gen_proto.sh --check

types: deps
	$(BIN)/mypy -p raftmq

unit: deps
	$(BIN)/pytest -q -n 2 --dist loadgroup

# What CI runs (.ci/run): lint, types, the suite, then the chaos CI set (root: namespaces).
test: lint types unit chaos

# Six scenarios of ~30 s each (leader kill, crash, isolation, minority partition, one-way,
# pause) in network namespaces; results and pictures under chaos-results/.
chaos: deps
	$(BIN)/python -m raftmq.ops.cli chaos cleanup
	$(BIN)/python -m raftmq.ops.cli chaos suite --set ci --seed $${SEED:-1} --out chaos-results

# The full list (29 scenarios, ~19 min; `raftmq chaos list` shows them).
chaos-full: deps
	$(BIN)/python -m raftmq.ops.cli chaos cleanup
	$(BIN)/python -m raftmq.ops.cli chaos suite --set full --seed $${SEED:-1} --out chaos-results

test-slow: deps
	$(BIN)/pytest -q -m slow

run: deps
	$(BIN)/python -m raftmq.ops.cli cluster up

# The dashboard's browser test (headless chromium) with its screenshot of every page written to
# docs/screens/ (the test writes them to a temporary folder otherwise).
dashboard-screens: deps
	RAFTMQ_DASHBOARD_SHOTS=docs/screens $(BIN)/pytest -q tests/ops/test_dashboard.py
	RAFTMQ_DASHBOARD_SHOTS=docs/screens $(BIN)/pytest -q tests/ops/test_security_cluster.py -k browser

bench: bench-raftlog bench-failover bench-spark

bench-raftlog: deps
	$(BIN)/python bench/raftlog_bench.py

bench-failover: deps
	$(BIN)/python bench/failover_bench.py

bench-spark: deps
	$(BIN)/python bench/spark_bench.py

clean:
	rm -rf $(VENV) build *.egg-info *.so common/*.so raftlog/*.so raftlog/_mypyc_manifest.json .mypy_cache .ruff_cache .pytest_cache $(NODE_DIR)/node_modules
