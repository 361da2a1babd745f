# Two set-up commands on a fresh machine: `make demo` then `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test check coverage stress lint bench clean fuzz sanitize

venv: $(STAMP)

# Dependencies are installed from the pinned constraints; the package itself is editable so that
# the tests run against src/ as it stands.
$(STAMP): pyproject.toml constraints.txt setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m demo --workdir out/demo

# The whole suite (CI runs it), spread over the cores a file at a time: a file's module-scoped
# clusters, emulators and servers are started once, in one worker.
test: $(STAMP)
	$(BIN)/ruff check src tests bench demo fuzz
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -n auto --dist loadfile tests

# The unit tier, for the edit loop: every test outside tests/e2e/.
check: $(STAMP)
	$(BIN)/ruff check src tests bench demo fuzz
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not e2e and not stress" tests

# Line and branch coverage of src/ by the suite's in-process tests (subprocesses are not traced).
coverage: $(STAMP)
	$(BIN)/python -m coverage run --branch --source=src/recordforge -m pytest -q -p no:cacheprovider tests
	$(BIN)/python -m coverage report | tail -1

# The long tests (marked `stress`): many runs started together on one output
# (tests/e2e/test_publishing_stress.py) and 200 repeated conversions per mode that promises the
# same bytes (tests/e2e/test_repeated_runs.py); a few minutes. STRESS_TESTS narrows them (CI runs
# the first: .ci/run).
STRESS_TESTS ?= tests
stress: $(STAMP)
	$(BIN)/python -m pytest -q -m stress $(STRESS_TESTS)

# Every harness of fuzz/, FUZZ_SECONDS in all (an equal share each), one after another (atheris if installed, else
# seeded random mutations); a finding is written to fuzz/findings/ and stops the run.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := crc32c find_records data_crc_mismatches decode_examples tools bundle_json
fuzz: $(STAMP)
	for t in $(FUZZ_TARGETS); do \
	    nice -n 10 $(BIN)/python -m fuzz.run $$t --seconds $$(( $(FUZZ_SECONDS) / $(words $(FUZZ_TARGETS)) )) --seed $${FUZZ_SEED:-1} || exit 1; \
	done

# The extension built with ASan and UBSan in build/sanitize (src/ untouched); the native tests
# and the short fuzz run against it, libasan preloaded into Python, leaks not checked (CPython's own).
SANITIZE_DIR := build/sanitize
SANITIZE_ENV = ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
	LD_PRELOAD=$$(gcc -print-file-name=libasan.so) PYTHONPATH=$(SANITIZE_DIR)
sanitize: $(STAMP)
	$(BIN)/python fuzz/build_sanitized.py $(SANITIZE_DIR)
	$(SANITIZE_ENV) nice -n 10 $(BIN)/python -m pytest -q -p no:cacheprovider tests/records/test_native.py \
	    tests/records/test_chunks.py tests/records/test_wire.py tests/records/test_streams.py \
	    tests/records/test_fuzz.py

# mypy reads its files (src) and settings from [tool.mypy] in pyproject.toml; lint-imports its
# layer contract from [tool.importlinter].
lint: $(STAMP)
	$(BIN)/ruff check src tests bench demo fuzz
	$(BIN)/ruff format --check src tests bench demo fuzz
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

bench: $(STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)
	$(BIN)/python -m bench.sequences
	$(BIN)/python -m bench.workers

clean:
	rm -rf out bench/out

# Dataflow: one image for launcher and workers; the template spec from deploy/metadata.json.
PROJECT ?= my-project
REGION ?= us-central1
IMAGE ?= $(REGION)-docker.pkg.dev/$(PROJECT)/recordforge/recordforge:$(shell $(PYTHON) -c "import tomllib;print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")
TEMPLATE ?= gs://$(PROJECT)-dataflow/templates/recordforge-convert.json
.PHONY: image template template-check metadata
metadata: $(STAMP)
	$(BIN)/python -m recordforge.pipelines.template > deploy/metadata.json.tmp
	mv deploy/metadata.json.tmp deploy/metadata.json

image:
	docker build -f deploy/Dockerfile -t $(IMAGE) .

template:
	gcloud dataflow flex-template build $(TEMPLATE) --image $(IMAGE) --sdk-language PYTHON \
	    --metadata-file deploy/metadata.json

# Offline: gcloud validates the spec and prints it without uploading.
template-check:
	gcloud dataflow flex-template build $(TEMPLATE) --image $(IMAGE) --sdk-language PYTHON \
	    --metadata-file deploy/metadata.json --print-only
