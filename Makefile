# Two entry points for a fresh clone: `make demo` and `make test`. Each creates .venv if it is
# missing and installs the package under constraints.txt (torch pinned to its CPU wheel).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.dev-installed: pyproject.toml constraints.txt | $(PY)
	$(PIP) -e '.[dev]'
	touch $@

demo: $(VENV)/.dev-installed
	$(PY) examples/http_demo.py

test: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check asyncloader tests examples benchmarks
	$(PY) -m pytest -q

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check asyncloader tests examples benchmarks
	$(VENV)/bin/ruff format --check asyncloader tests examples benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
