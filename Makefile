# The two commands a new user runs (see README.md):
#   make demo   - the local stack and the pipeline on a sample database
#   make test   - install everything, start the stack, lint, type-check, unit and integration tests
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.bw-installed
PYTEST_ARGS ?=

.PHONY: install test-deps bench-deps stack-up lint unit integration test demo down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The editable install also builds the native codec (native/, Rust) with cargo from rustup's usual
# place; a change to its sources rebuilds it.
export PATH := $(HOME)/.cargo/bin:$(PATH)
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)

# The native producer's librdkafka is built with TLS (and so SASL SCRAM and OAUTHBEARER) against
# Debian's OpenSSL: its headers and pkg-config must be there before the build.
$(STAMP): pyproject.toml $(NATIVE_SOURCES) | $(BIN)/python
	@{ dpkg -s libssl-dev >/dev/null 2>&1 && command -v pkg-config >/dev/null; } || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libssl-dev pkg-config; } \
		|| echo "libssl-dev not installed (apt-get failed): the native codec's build will fail; install it and rerun"
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# jemalloc from Debian: the worker re-executes itself on it when present, and its snapshot's reader
# processes preload it (cdc_worker/shell/allocator.py); without it they run on glibc's malloc.
install: $(STAMP)
	$(BIN)/bw-stack install
	@dpkg -s libjemalloc2 >/dev/null 2>&1 || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends libjemalloc2; } \
		|| echo "jemalloc not installed (apt-get failed): the worker uses glibc's malloc, its producing about a quarter slower"

# Headless Chromium (and a font, which it only recommends) for the Dagster UI test, from Debian.
test-deps:
	@{ command -v chromium >/dev/null && [ -d /usr/share/fonts/truetype/dejavu ]; } || { \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends chromium fonts-dejavu-core; }

# kcat (a C Kafka producer) for the benchmarks' pipe baseline, from Debian.
bench-deps: install
	@command -v kcat >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends kcat; }

stack-up: install
	$(BIN)/bw-stack up

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Twice: with the native codec (which must then be built), and with it turned off, so that the
# Python path is known to stand on its own. The second run takes only the worker's tests (the files
# that import cdc_worker: nothing else can load the codec), without the native-only ones and the
# merge's Spark steps.
NATIVE_ONLY_UNIT_TESTS = tests/unit/test_native_codec.py tests/unit/test_native_changes.py \
	tests/unit/test_spooled_commit.py
WORKER_UNIT_TESTS = $(filter-out $(NATIVE_ONLY_UNIT_TESTS),$(shell grep -l cdc_worker tests/unit/test_*.py))
# The first run in two processes (pytest-xdist), a file at a time each.
unit: install
	BW_REQUIRE_NATIVE=1 $(BIN)/pytest tests/unit -q -n 2 --dist loadfile $(PYTEST_ARGS)
	BOTTLEDWATER_CODEC=python $(BIN)/pytest $(WORKER_UNIT_TESTS) -q -m 'not native and not spark' $(PYTEST_ARGS)

# The tests that restart a service the others share (marked `alone`) first, by themselves; then the
# rest in two lanes at once, the lake's tests in one and all others in the other (pytest-xdist, the
# lanes in tests/integration/lanes.py). Exit status 5 is pytest's "no test selected", when
# PYTEST_ARGS picks none of the `alone` ones. The 30 slowest steps are printed at the end: the
# suite's time is watched (tests/README.md).
integration: stack-up test-deps
	$(BIN)/pytest tests/integration -q -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/pytest tests/integration -q -m 'not alone' -n 2 --durations=30 $(PYTEST_ARGS)

test: lint unit integration

demo: stack-up
	$(BIN)/python -m stack.demo

down:
	$(BIN)/bw-stack down
