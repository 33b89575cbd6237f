# Entry points for a fresh clone: `make demo`, `make test` and `make bench`. Each creates .venv if it is
# missing and installs the package under constraints.txt (torch pinned to its CPU wheel).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test check stress coverage compat-baseline lint bench bench-quick bench-probes clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.dev-installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e '.[dev]'
	touch $@

$(VENV)/.bench-installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e '.[dev,bench]'
	touch $@

demo: $(VENV)/.dev-installed
	$(PY) examples/http_demo.py

# The tiers are folders of tests/ (README, "Tests"): unit (no process), integration (forked
# workers, local servers), system (fresh interpreters, jobs, browsers, external servers) and
# stress (soak, fuzzing at depth, Ray, store faults, the upstream suites).
LINT := $(VENV)/bin/ruff check asyncloader tests examples benchmarks && \
	$(VENV)/bin/ruff format --check asyncloader tests examples benchmarks && \
	$(PY) -m mypy
PYTEST := $(PY) -m pytest -q

# The tier for every edit (2 minutes on 2 cores): lint, format, types, and the unit and
# integration tiers at quick depth (a quarter of the randomised schedules). Three processes: a
# third of these tests' time is waiting (latencies, workers starting), which a third fills.
check: $(VENV)/.dev-installed
	$(LINT)
	ASYNCLOADER_TEST_DEPTH=quick $(PYTEST) -n 3 --dist worksteal tests/integration tests/unit

# Everything but stress (10 minutes on 2 cores), in two processes, the system tier's long jobs
# first; the Ctrl-C tests run one after the other in one process (xdist_group "ctrl-c").
test: $(VENV)/.dev-installed
	$(LINT)
	$(PYTEST) -n 2 --dist loadgroup tests/system tests/integration tests/unit

# The soak, fuzzing at depth, Ray, store faults and the upstream suites (CI runs it after make
# test).
stress: $(VENV)/.dev-installed
	$(PYTEST) -n 2 --dist loadgroup tests/stress

# Line coverage of the package per tier and in total, and the lines only the stress tier covers
# (all four tiers with coverage: about as long as make test and make stress together).
coverage: $(VENV)/.dev-installed
	rm -rf .coverage-tiers && mkdir .coverage-tiers
	for tier in unit integration system stress; do \
		COVERAGE_FILE=.coverage-tiers/$$tier $(PYTEST) -n 2 --cov --cov-report= tests/$$tier || exit 1; \
	done
	$(PY) -m tests.helpers.coverage_tiers .coverage-tiers

# PyTorch's and torchdata's own DataLoader tests (tests/stress/compat) against DataLoader and
# StatefulDataLoader themselves: which of them pass here at all (docs/compatibility.md).
compat-baseline: $(VENV)/.dev-installed
	ASYNCLOADER_COMPAT_TARGET=upstream $(PY) -m pytest -q tests/stress/compat

lint: $(VENV)/.dev-installed
	$(LINT)

# The side-by-side benchmark of DataLoader, torchdata.nodes, spdl and asyncloader (~20 min on
# 2 cores): the summary in benchmarks/results/ (committed) and docs/benchmarks.md's latest run,
# each run's JSON in benchmarks/results/runs/ (not committed). See docs/benchmarks.md.
bench: $(VENV)/.bench-installed
	$(PY) -m benchmarks.bench

# The same, one repetition of fewer settings and a quarter of the items (a few minutes);
# results in benchmarks/results/quick/ (not committed).
bench-quick: $(VENV)/.bench-installed
	$(PY) -m benchmarks.bench --quick

# Every probe (benchmarks/probes/), the side-by-side command and bench --quick on one workload
# at toy size (tests/stress/project/test_bench_probes.py, a few minutes): they still run.
bench-probes: $(VENV)/.bench-installed
	$(PY) -m pytest -q tests/stress/project/test_bench_probes.py

# The tar fuzz suite at nightly size (tests/stress/sources/test_fuzz_tar.py, which CI runs with 10,000
# cases): FUZZ_CASES generated and mutated archives (default 200,000: about 10 min on 2 cores).
FUZZ_CASES ?= 200000
.PHONY: fuzz
fuzz: $(VENV)/.dev-installed
	ASYNCLOADER_FUZZ_CASES=$(FUZZ_CASES) $(PY) -m pytest -q -s --timeout 7200 tests/stress/sources/test_fuzz_tar.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
