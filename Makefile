# One command surface for people and CI. `make demo` and `make test` set everything up
# first; both are idempotent and fast once set up.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STATE_DIR ?= .kappaflow
# Test workers for make test: each runs whole test files, with services of its own.
TEST_WORKERS ?= 2
# The venv has the mqtt extra (amqtt): the MQTT tests run on it as well as on mosquitto,
# which setup installs from the system's packages when it runs as root.
# Stamps make setup incremental: the venv is rebuilt when either pyproject.toml changes
# (the product's or the benchmarks'), the jars when their POMs change (kappaflow setup
# checks the POM fingerprints itself).
VENV_STAMP := $(VENV)/.kappaflow-installed

.PHONY: eval-anomaly setup test-setup demo test test-long test-cluster test-weights test-peers check lint format bench bench-scale clean prereqs

setup: $(VENV_STAMP)
	@$(BIN)/kappaflow --state-dir $(STATE_DIR) setup

prereqs:
	@scripts/prereqs.sh $(PYTHON)

$(VENV_STAMP): pyproject.toml benchmarks/pyproject.toml
	@scripts/prereqs.sh $(PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,mqtt]' -e benchmarks
	@touch $@

# What the tests need beyond setup: Debian's Chromium for the dashboard's browser tests,
# installed with apt-get when this runs as root; otherwise it stops and says what to run.
test-setup: setup
	@$(BIN)/python -m kappaflow.install.browser

demo: setup
	$(BIN)/kappaflow --state-dir $(STATE_DIR) iot demo

lint: $(VENV_STAMP)
	$(BIN)/ruff check src tests benchmarks examples conftest.py
	$(BIN)/ruff format --check src tests benchmarks examples conftest.py
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

format: $(VENV_STAMP)
	$(BIN)/ruff format src tests benchmarks examples conftest.py
	$(BIN)/ruff check --fix src tests benchmarks examples conftest.py

# The unit and integration tests (real broker, Redis, Spark), in under 25 minutes on two
# cores. Whole scenarios of a minute or more are test-long; clusters test-cluster; the
# benchmark's peer engines (Flink, Quix Streams), whose end-to-end runs take minutes and
# install the peers on first use, test-peers.
test: test-setup lint
	$(BIN)/pytest -m "not peers and not cluster and not long" -n $(TEST_WORKERS) --dist loadfile

# Whole scenarios of a minute or more each: jobs crashed at each step of a batch's writes,
# a replay of the log, removed jobs, savepoints, HDFS, Spark through security, the
# evaluation and the two demos. A tier of its own, which CI runs after make test (.ci/run).
test-long: test-setup
	$(BIN)/pytest -m "long and not cluster" -n $(TEST_WORKERS) --dist loadfile

# Clusters on this machine, each test file starting its own and breaking it: three Kafka
# brokers losing their leader, MirrorMaker failing over to a backup cluster, a Spark
# standalone cluster losing a worker. Minutes each: a tier of its own, which CI runs
# after make test (.ci/run).
test-cluster: test-setup
	$(BIN)/pytest -m cluster -n $(TEST_WORKERS) --dist loadfile

# The three tiers as CI runs them, each recording its files' seconds into
# tests/file_weights.json, which orders the files of later runs (the longest first).
test-weights: test-setup
	$(BIN)/pytest -m "not peers and not cluster and not long" -n $(TEST_WORKERS) --dist loadfile --record-weights
	$(BIN)/pytest -m "long and not cluster" -n $(TEST_WORKERS) --dist loadfile --record-weights
	$(BIN)/pytest -m cluster -n $(TEST_WORKERS) --dist loadfile --record-weights

# The anomaly models on the repository's own labelled series (data/anomaly: a development
# set and a held-out set, made by kappaflow.iot.synthetic where missing), scored by the
# NAB rules; the figures go to data/anomaly/results.json. About a minute.
eval-anomaly: $(VENV_STAMP)
	$(BIN)/kappaflow-bench iot-anomaly --data data/anomaly --out data/anomaly/results.json

# The benchmark's peer engines run end to end and are checked, as make bench runs them.
test-peers: setup
	$(BIN)/pytest -m peers

# The fast tier for the edit loop: lint and the tests that need no service.
check: $(VENV_STAMP)
	$(MAKE) --no-print-directory lint
	$(BIN)/pytest -m unit -q

# Long runs with printed figures and result files under bench-results/; never part of test.
# kappaflow-bench is the benchmarks' own distribution (benchmarks/), not the product.
# After the counting benchmark, the same workload as a job on the job API beside the
# built-in count job (two interleaved rounds; about 15 minutes on two cores), then a YSB
# sweep of every engine (three rates, 30 s runs after a 60 s warm-up, as the JIT needs;
# about 40 minutes, the first Flink and Quix runs install them).
bench: setup
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) count --events 1000000 --out bench-results/count
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) api --events 1000000 --repeat 2 \
		--out bench-results/api
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) iot-models --out bench-results/iot-models
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) iot-ingest --out bench-results/iot-ingest
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) iot-latency --out bench-results/iot-latency
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) push --out bench-results/push
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) ysb-sweep --rates 20000,50000,100000 \
		--duration 30 --warmup 60 --out bench-results/ysb-sweep

# A million distinct keys in 1-minute windows, a 4 GiB driver: about five minutes.
bench-scale: setup
	$(BIN)/kappaflow-bench --state-dir $(STATE_DIR) count-scale --out bench-results/count-scale

clean:
	-$(BIN)/kappaflow --state-dir $(STATE_DIR) down 2>/dev/null
	rm -rf $(VENV) $(STATE_DIR) .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
