# Two set-up commands on a fresh machine: `make demo` then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench clean

venv: $(STAMP)

# Dependencies are installed from the pinned constraints; the package itself is editable so that
# the tests run against src/ as it stands.
$(STAMP): pyproject.toml constraints.txt setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m recordforge.demo --workdir out/demo

test: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

bench: $(STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

clean:
	rm -rf out bench/out
